"""Reconciliation against Stripe: ``billing-outbox reconcile``, the Reconciliation page's
button, and the schedule (``RECONCILE_INTERVAL_SECONDS``). Few calls: per customer × meter,
one summaries call per span of the window (whole days grouped by day, the ragged ends by
hour), every page; through the process's rate limit."""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from sqlalchemy import Engine

from ..config import Settings
from ..db import reading
from ..models import utcnow
from ..outbox import reconciliation as recon
from ..outbox import stripe_runs
from ..outbox.meters import MeterInfo, known_meters
from ..outbox.states import Outcome
from ..stripe_gateway import StripeCallFailed, StripeGateway
from .throttle import RateLimiter, process_limiter

log = logging.getLogger(__name__)

#: How long one process may hold the reconciliation before another may take over.
LEASE_SECONDS = 3600.0
#: At most this many summaries calls in flight (and no more than ``OUTBOX_CONCURRENCY``).
MAX_PARALLEL_CALLS = 8
#: How often the scheduled service looks whether a reconciliation is due.
CHECK_SECONDS = 300.0


def reconcile(engine: Engine, source: StripeGateway, settings: Settings, *,
              since: datetime | None = None, until: datetime | None = None,
              tenant_id: str | None = None, trigger: str, actor: str | None = None,
              now: datetime | None = None, clock: Callable[[], datetime] = utcnow,
              limiter: RateLimiter | None = None) -> recon.RunRecord:
    """Compare every (customer, meter) with events in the window; store and return the run.
    Stripe's failures become the run's ``errors`` (it is then not ``ok``); a systemic one
    (401/403) stops it. ``now``: when it starts (``clock()`` when None); ``clock`` also says
    when it finished."""
    now = now or clock()
    default_since, default_until = recon.default_window(now)
    since, until = recon.align(since or default_since, until or default_until)
    run = recon.RunRecord(since, until, started_at=now, trigger=trigger, tenant_id=tenant_id,
                          actor=actor)
    settle = settings.reconcile_settle_seconds
    limiter = limiter or process_limiter(settings.stripe_max_requests_per_second)
    with reading(engine) as conn:
        pairs = recon.local_totals(conn, since, until, now=now, settle_seconds=settle,
                                   tenant_id=tenant_id)
        meters = known_meters(conn)
    skipped: set[str] = set()
    todo: list[tuple[recon.PairTotals, MeterInfo]] = []
    for (_customer, meter_name), pair in sorted(pairs.items()):
        meter = meters.get(meter_name)
        if meter is None or meter.meter_id is None:
            _note(run, skipped, meter_name, f"meter {meter_name!r}: not known at Stripe; its "
                                            "events wait, and nothing is compared")
        elif meter.formula not in ("sum", "count"):
            _note(run, skipped, meter_name, f"meter {meter_name!r} keeps the {meter.formula} "
                                            "value a customer sent, not a total: not compared")
        else:
            todo.append((pair, meter))
    window = recon.spans(since, until)
    refused = threading.Event()
    # The gateway is the process's, shared with the drainer: the run counts the calls made
    # by its own threads.
    calls = [0]
    counting = threading.Lock()

    def fetch(job: tuple[recon.PairTotals, MeterInfo]
              ) -> list[tuple[recon.Span, dict[datetime, float]]] | StripeCallFailed | None:
        pair, meter = job
        assert meter.meter_id is not None
        out = []
        for span in window:
            if refused.is_set():
                return None
            limiter.acquire()
            before = source.thread_calls
            try:
                items = source.meter_event_summaries(meter.meter_id, pair.stripe_customer_id,
                                                     start=span.start, end=span.end,
                                                     grouping=span.grouping)
            except StripeCallFailed as exc:
                if exc.result.outcome is Outcome.SYSTEMIC:
                    refused.set()
                return exc
            finally:
                with counting:
                    calls[0] += source.thread_calls - before
            out.append((span, {i.start: i.value for i in items}))
        return out

    # Calls overlap (Stripe's latency, not its limit, bounds one at a time); the comparison
    # itself runs here, in the pairs' order.
    with ThreadPoolExecutor(max_workers=min(settings.concurrency, MAX_PARALLEL_CALLS),
                            thread_name_prefix="reconcile") as pool:
        for (pair, meter), got in zip(todo, pool.map(fetch, todo), strict=True):
            if isinstance(got, StripeCallFailed):
                run.errors.append(str(got))
            elif got is not None:
                for span, theirs in got:
                    recon.compare(pair, meter.formula, span, theirs, now=now,
                                  settle_seconds=settle, into=run.comparison)
    if refused.is_set():
        run.errors.append("Stripe refused the API key: the rest was not compared")
    run.calls = calls[0]
    run.finished_at = clock()
    recon.store_run(engine, run)
    return run


def _note(run: recon.RunRecord, skipped: set[str], meter: str, text: str) -> None:
    if meter not in skipped:
        skipped.add(meter)
        run.notes.append(text)


class Reconciler:
    """Runs a reconciliation of the default window when the last scheduled one is older
    than ``RECONCILE_INTERVAL_SECONDS`` (0: never); one process at a time. A maintenance
    service, checked every ``CHECK_SECONDS``."""

    name = "reconcile"

    def __init__(self, engine: Engine, source: StripeGateway, settings: Settings, *,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.engine = engine
        self.source = source
        self.settings = settings
        self.clock = clock
        self.owner = f"{socket.gethostname()}:{os.getpid()}"

    def due(self, now: datetime) -> bool:
        interval = self.settings.reconcile_interval_seconds
        if interval <= 0:
            return False
        with reading(self.engine) as conn:
            last = recon.last_run_started(conn, trigger="schedule")
        return last is None or (now - last).total_seconds() >= interval

    def run_once(self) -> recon.RunRecord | None:
        """A reconciliation if one is due and no other process runs one; else None."""
        now = self.clock()
        if not self.due(now):
            return None
        if not stripe_runs.take_lease(self.engine, stripe_runs.RECONCILE, owner=self.owner,
                                      now=now, seconds=LEASE_SECONDS):
            return None
        try:
            run = reconcile(self.engine, self.source, self.settings, trigger="schedule",
                            now=now, clock=self.clock)
            found = len(run.comparison.mismatches)
            (log.warning if found or run.errors else log.info)(
                "reconciliation %s: %d buckets checked, %d pending, %d mismatches, %d errors, "
                "%d calls", run.id, run.comparison.checked, run.comparison.pending, found,
                len(run.errors), run.calls)
            stripe_runs.record_run(self.engine, stripe_runs.RECONCILE, ok=run.ok, now=now,
                                   detail=f"{len(run.comparison.mismatches)} mismatches, "
                                          f"{run.comparison.pending} pending")
            return run
        finally:
            stripe_runs.drop_lease(self.engine, stripe_runs.RECONCILE, owner=self.owner)
