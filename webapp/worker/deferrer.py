"""The deferrer: keeps the events that cannot be sent yet (a tenant without a Stripe customer,
a meter Stripe does not have) out of the claim's way (see :mod:`webapp.outbox.deferred`). A
maintenance service: ``run_once()`` first makes due again the put-off events that can be sent
by now (a mapping and a listing of Stripe's meters do that themselves; this catches a tenant
mapped by hand in the database), then puts off those that have been due for a while."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import Engine

from ..models import utcnow
from ..outbox.deferred import defer_unsendable, undefer_sendable

log = logging.getLogger(__name__)

#: How often a scheduler calls :meth:`Deferrer.run_once`.
INTERVAL_SECONDS = 60.0


class Deferrer:
    """Puts off events that cannot be sent; makes them due again once they can be."""

    name = "defer-unsendable"

    def __init__(self, engine: Engine, *, clock: Callable[[], datetime] = utcnow) -> None:
        self.engine = engine
        self.clock = clock

    def run_once(self) -> int:
        """Make due / put off; how many events were put off."""
        now = self.clock()
        with self.engine.begin() as conn:
            woken = undefer_sendable(conn, now=now)
        parked = defer_unsendable(self.engine, now=now)
        if woken or parked:
            log.info("events waiting for a customer or a meter: %s put off, %s due again",
                     parked, woken)
        return parked


__all__ = ["INTERVAL_SECONDS", "Deferrer"]
