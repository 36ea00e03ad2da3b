"""A long-running drainer's heartbeat: one row per process in ``drainer_heartbeats``,
refreshed every few seconds from its loop, so the dashboard can tell "Stripe is failing and
this worker is holding claims" (the breaker lives in the process's memory) from "nothing is
running at all". Writing it never gets in the way of a pass."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import Engine, delete, insert, update

from ..outbox.sql import HEARTBEATS as H
from .breaker import CircuitBreaker

log = logging.getLogger(__name__)

#: How often a drainer writes its row (more often when the breaker changes state).
INTERVAL_SECONDS = 5.0
#: Rows of processes gone this long are removed by the next heartbeat of any drainer.
FORGET_AFTER = timedelta(days=1)


class Heartbeat:
    """Writes one drainer's row. Not thread-safe: its drainer calls it under a lock."""

    def __init__(self, engine: Engine, name: str, kind: str, *,
                 clock: Callable[[], datetime],
                 monotonic: Callable[[], float] = time.monotonic,
                 interval: float = INTERVAL_SECONDS) -> None:
        self.engine, self.name, self.kind = engine, name, kind
        self.clock, self.monotonic, self.interval = clock, monotonic, interval
        self.started_at = clock()
        self.last_sent_at: datetime | None = None
        self._last_beat: float | None = None
        self._last_state: str | None = None

    def sent(self) -> None:
        """An event just got through."""
        self.last_sent_at = self.clock()

    def beat(self, breaker: CircuitBreaker, *, can_send: bool, sent_total: int) -> None:
        """Write the row if it is due, or at once when the breaker changed state."""
        state, open_for, probe_in = breaker.snapshot()
        now_m = self.monotonic()
        if (self._last_beat is not None and state == self._last_state
                and now_m - self._last_beat < self.interval):
            return
        now = self.clock()
        values = {
            "kind": self.kind, "seen_at": now, "can_send": can_send, "breaker": state,
            "holding_since": (now - timedelta(seconds=open_for)
                              if open_for is not None else None),
            "next_probe_at": (now + timedelta(seconds=probe_in)
                              if probe_in is not None else None),
            "last_failure": breaker.last_failure if state != "closed" else None,
            "last_sent_at": self.last_sent_at, "sent_total": sent_total,
        }
        try:
            with self.engine.begin() as conn:
                done = conn.execute(update(H).where(H.c.name == self.name).values(**values))
                if not done.rowcount:
                    conn.execute(insert(H).values(name=self.name, started_at=self.started_at,
                                                  **values))
                    conn.execute(delete(H).where(H.c.seen_at < now - FORGET_AFTER))
        except Exception:  # noqa: BLE001 - a heartbeat never stops a drain
            log.warning("could not write the drainer heartbeat", exc_info=True)
            return
        self._last_beat, self._last_state = now_m, state

    def remove(self) -> None:
        """The drainer stopped cleanly: its row goes (a killed one's just ages out)."""
        try:
            with self.engine.begin() as conn:
                conn.execute(delete(H).where(H.c.name == self.name))
        except Exception:  # noqa: BLE001
            log.warning("could not remove the drainer heartbeat", exc_info=True)
