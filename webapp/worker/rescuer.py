"""The rescuer: returns events whose claim expired (their worker died or stalled) to the
queue. A maintenance service: ``run_once()`` is one sweep; a scheduler calls it on a
cadence (:func:`interval_seconds`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import Engine

from ..config import Settings
from ..models import utcnow
from ..outbox.claims import rescue_expired

log = logging.getLogger(__name__)


def interval_seconds(settings: Settings) -> float:
    """How often to sweep: a quarter of a claim's life, at least a second, so an expired
    claim waits at most that long past its deadline."""
    return max(1.0, settings.claim_timeout_seconds / 4)


class Rescuer:
    """Returns expired claims to the queue (see ``webapp.outbox.claims.rescue_expired``)."""

    name = "rescue"

    def __init__(self, engine: Engine, *, clock: Callable[[], datetime] = utcnow) -> None:
        self.engine = engine
        self.clock = clock

    def run_once(self) -> int:
        """One sweep; the number of events returned to the queue."""
        count = rescue_expired(self.engine, now=self.clock())
        if count:
            log.warning("rescued %d events whose claim expired (a worker died or stalled)",
                        count)
        return count
