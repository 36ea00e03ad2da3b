"""The pruner: removes terminal rows past ``OUTBOX_RETENTION_DAYS`` on a schedule
(``OUTBOX_PRUNE_INTERVAL_SECONDS``, hourly by default), in the worker and in the in-app
drainer, through the same :func:`webapp.outbox.retention.prune` as ``billing-outbox prune``.
It also forgets log-in throttle entries nobody has tripped for a day."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import Engine

from ..config import Settings
from ..login_throttle import forget_stale
from ..models import utcnow
from ..outbox.retention import PruneResult, prune

log = logging.getLogger(__name__)

#: A scheduled run stops after this long and leaves the rest to the next one, so a first run
#: over a year of history never holds the maintenance thread for long.
MAX_SECONDS = 300.0
ACTOR = "system:prune"


class Pruner:
    """One scheduled prune."""

    name = "prune"

    def __init__(self, engine: Engine, settings: Settings, *,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.engine = engine
        self.retention_days = settings.retention_days
        self.clock = clock

    def run_once(self) -> PruneResult:
        now = self.clock()
        result = prune(self.engine, now=now, retention_days=self.retention_days,
                       max_seconds=MAX_SECONDS, actor=ACTOR)
        if result.pruned:
            log.info("prune: %s", result.summary())
        forget_stale(self.engine, now=now)
        return result
