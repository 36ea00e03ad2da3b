"""The usage reporter: at many tenants, keeps the Tenants & usage page's quick periods (this
month, the last 7 and 30 days, last month) prepared as reports at most five minutes old, so
the page opens in milliseconds whatever the day of the month (summing a month of 100,000
tenants live takes a second). Below that size it does nothing and the page sums live. A
maintenance service, like the folder: page views never prepare a report."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import Engine

from ..models import utcnow
from ..read.usage_reports import REFRESH
from .report_writer import keep_quick_periods

log = logging.getLogger(__name__)

#: How often a scheduler calls :meth:`UsageReporter.run_once` (a call prepares only the
#: periods whose report is older than ``REFRESH``).
INTERVAL_SECONDS = 60.0


class UsageReporter:
    """Prepares the quick periods' reports when they are due."""

    name = "usage-reports"

    def __init__(self, engine: Engine, *, clock: Callable[[], datetime] = utcnow) -> None:
        self.engine = engine
        self.clock = clock

    def run_once(self) -> int:
        """Prepare the due reports; how many."""
        made = keep_quick_periods(self.engine, now=self.clock())
        for r in made:
            log.info("usage report %s prepared: %s to %s, %s rows in %.1f s", r.id, r.start,
                     r.end, r.rows, r.seconds)
        return len(made)


__all__ = ["INTERVAL_SECONDS", "REFRESH", "UsageReporter"]
