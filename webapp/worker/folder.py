"""The rollup folder: keeps the usage and attempt rollups close behind ``now``, so the
dashboard's reads stay fast (they are exact however stale the rollups are). A maintenance
service: ``run_once()`` folds when the rollups lag; a scheduler calls it every
:data:`INTERVAL_SECONDS`. Page views never fold."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import Engine

from ..config import Settings
from ..models import utcnow
from ..outbox.rollups import fold, fold_margin

log = logging.getLogger(__name__)

#: How often a scheduler calls :meth:`RollupFolder.run_once`; a call folds only when the
#: rollups lag by ``webapp.outbox.rollups.FOLD_EVERY`` (five minutes), so most calls are one
#: small read.
INTERVAL_SECONDS = 60.0


class RollupFolder:
    """Folds closed stretches of sent events and attempts into the rollups."""

    name = "fold"

    def __init__(self, engine: Engine, settings: Settings, *,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.engine = engine
        self.margin = fold_margin(settings.claim_timeout_seconds)
        self.clock = clock

    def run_once(self) -> bool:
        """Fold if the rollups lag; whether it folded."""
        folded = fold(self.engine, now=self.clock(), margin=self.margin)
        if folded:
            log.debug("rollups folded")
        return folded
