"""Stripe's meters, for the drainer: read them from Stripe (every page) at start, on a
schedule and whenever Stripe says one is missing (:class:`MeterRefresher`); hand the drainer
the active ones and their payload keys (:class:`MeterCatalog`): never a pre-aggregated one
(:data:`webapp.outbox.meters.PRE_AGGREGATED`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import Engine

from ..db import reading
from ..models import utcnow
from ..outbox import meters, stripe_runs
from ..outbox.meters import MeterInfo
from ..outbox.states import CallResult, Outcome
from ..stripe_gateway import StripeCallFailed, StripeGateway

log = logging.getLogger(__name__)

#: How long the drainer trusts the meters it read from the database.
RELOAD_SECONDS = 5.0
#: The least time between two refreshes the drainer asks for itself.
MIN_REFRESH_SECONDS = 30.0


class MeterRefresher:
    """Reads every meter from Stripe and stores the listing. A maintenance service."""

    name = "meters"

    def __init__(self, engine: Engine, source: StripeGateway, *,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.engine = engine
        self.source = source
        self.clock = clock

    def run_once(self) -> int:
        """One refresh; how many meters are active. Records how it went either way."""
        now = self.clock()
        try:
            listed = self.source.list_meters()
        except Exception as exc:
            stripe_runs.record_run(self.engine, stripe_runs.METERS, ok=False, detail=str(exc),
                                   now=now)
            raise
        stored = meters.store_meters(self.engine, listed, now=now)
        refused = (f", {len(stored.refused)} refused: " + "; ".join(stored.refused)
                   if stored.refused else "")
        held = (f", {stored.pre_aggregated} pre-aggregated (not sent to)"
                if stored.pre_aggregated else "")
        stripe_runs.record_run(self.engine, stripe_runs.METERS, ok=True, now=now,
                               detail=f"{len(listed)} meters listed, {stored.active} active"
                               f"{held}{refused}")
        return stored.active


class MeterCatalog:
    """The meters this process sends to, read from ``stripe_meters`` at most every
    ``RELOAD_SECONDS``. If Stripe's meters were never read, it reads them first."""

    def __init__(self, engine: Engine, refresher: MeterRefresher, *,
                 monotonic: Callable[[], float] = time.monotonic,
                 on_systemic: Callable[[CallResult], None] | None = None) -> None:
        self.engine = engine
        self.refresher = refresher
        self.monotonic = monotonic
        #: Called when Stripe refuses the key itself (401/403) while the meters are read.
        self.on_systemic = on_systemic
        self._active: dict[str, MeterInfo] = {}
        self._read_at: float | None = None
        self._refreshed_at: float | None = None
        self._lock = threading.Lock()

    def active(self, *, retry: bool = False) -> dict[str, MeterInfo]:
        """The active meters, by event name. ``retry``: if they were never read, try now
        whatever the time since the last try (a probe after a systemic pause)."""
        with self._lock:
            now = self.monotonic()
            if self._read_at is not None and now - self._read_at < RELOAD_SECONDS \
                    and not (retry and not self._active):
                return self._active
            with reading(self.engine) as conn:
                never = stripe_runs.run_status(conn, stripe_runs.METERS).ok is not True
                self._active = meters.active_meters(conn)
            self._read_at = now
            if never and (retry or self._refreshed_at is None
                          or now - self._refreshed_at >= MIN_REFRESH_SECONDS):
                self._refresh(now)
            return self._active

    def invalidate(self) -> None:
        """Read the meters from the database again at the next look (after a refresh)."""
        with self._lock:
            self._read_at = None

    def mark_missing(self, event_name: str) -> None:
        """Stripe said no active meter has this event name: its events wait from now on,
        and the meters are read again (at most every ``MIN_REFRESH_SECONDS``)."""
        now = self.refresher.clock()
        if meters.mark_missing(self.engine, event_name, now=now):
            log.error("Stripe has no active meter for event name %r: its events wait until it "
                      "exists (create or reactivate it in Stripe)", event_name)
        with self._lock:
            self._active.pop(event_name, None)
            mono = self.monotonic()
            if self._refreshed_at is None or mono - self._refreshed_at >= MIN_REFRESH_SECONDS:
                self._refresh(mono)

    def _refresh(self, mono: float) -> None:
        self._refreshed_at = mono
        try:
            self.refresher.run_once()
        except StripeCallFailed as exc:
            log.warning("%s; sending waits for the meters", exc)
            if exc.result.outcome is Outcome.SYSTEMIC and self.on_systemic is not None:
                self.on_systemic(exc.result)
            return
        except Exception:
            log.exception("reading Stripe's meters failed; sending waits for them")
            return
        with reading(self.engine) as conn:
            self._active = meters.active_meters(conn)
        self._read_at = mono
