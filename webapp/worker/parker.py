"""The parker: keeps the events of tenants without a Stripe customer out of the claim's way
(see :mod:`webapp.outbox.waiting`). A maintenance service: ``run_once()`` first makes due
again the put-off events whose tenant has been mapped meanwhile (a mapping does that itself;
this catches one made by hand in the database), then puts off the unmapped ones due for a
while."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import Engine

from ..models import utcnow
from ..outbox.waiting import defer_unmapped, undefer_mapped

log = logging.getLogger(__name__)

#: How often a scheduler calls :meth:`UnmappedParker.run_once`.
INTERVAL_SECONDS = 60.0


class UnmappedParker:
    """Puts off unmapped tenants' events; makes mapped tenants' events due again."""

    name = "park-unmapped"

    def __init__(self, engine: Engine, *, clock: Callable[[], datetime] = utcnow) -> None:
        self.engine = engine
        self.clock = clock

    def run_once(self) -> int:
        """Make due / put off; how many events were put off."""
        now = self.clock()
        with self.engine.begin() as conn:
            woken = undefer_mapped(conn, now=now)
        parked = defer_unmapped(self.engine, now=now)
        if woken or parked:
            log.info("events of tenants without a customer: %s put off, %s due again "
                     "(mapped)", parked, woken)
        return parked


__all__ = ["INTERVAL_SECONDS", "UnmappedParker"]
