"""After Stripe's 200 (issue 12): reconciliation and the error-report poll at scale, through the
real SDK against the project's fake Stripe (in this process, ``LATENCY`` per call).

**Reconciliation.** 500 tenants × 2 meters = 1,000 (customer, meter) pairs, each with
``PER_DAY`` sent events a day over the default window (the last 35 days on hour bounds), loaded
by set-based SQL into a migrated schema; Stripe's side is given the same units per hour
(``FakeStripe.add_usage``), then ``DRIFTS`` settled days of distinct pairs are made to differ.
``webapp.worker.reconcile`` (what ``billing-outbox reconcile`` runs) compares everything:
Stripe calls made (one summaries call per pair and span — the ragged hours at either end and
the whole days between — every page) and wall time at ``STRIPE_MAX_REQUESTS_PER_SECOND=MAX_RPS``
(at the default 20 requests/s the calls alone take ``calls / 20`` seconds). The run must name
exactly the drifted buckets, else the figures mean nothing and the suite stops.

**Poll.** ``REPORTS`` error reports, each naming one sent event, are waiting at Stripe;
``EventPoller.run_once`` (``billing-outbox stripe-events poll``) lists every page, reads each in
full and stores it. Calls, wall time, reports a second; every named event must end
``rejected``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select, text

from .common import METERS, BenchDatabase, BenchFailure, Row, SectionResults

TENANTS = 500
PER_DAY = 2
DRIFTS = 10
LATENCY = 0.05
MAX_RPS = 1000.0
REPORTS = 10_000

LOAD_SENT = """
INSERT INTO stripe_usage_outbox (
    tenant_id, meter, quantity, idempotency_key, occurred_at, status, attempt_count,
    call_count, next_attempt_at, stripe_customer_id, key_generation, first_attempt_at, sent_at,
    last_outcome, last_http_status, created_at, updated_at)
SELECT t.tenant, m.meter, 1 + (g % 7), 'bench:' || t.tenant || ':' || m.meter || ':' || g,
    at, 'sent', 1, 1, at, t.customer, 0, at, at + interval '1 second', 'delivered', 200, at,
    at + interval '1 second'
FROM (SELECT 'tenant-' || lpad(i::text, 3, '0') AS tenant,
             'cus_tenant' || lpad(i::text, 3, '0') AS customer
      FROM generate_series(0, :tenants - 1) i) t,
     unnest(CAST(:meters AS text[])) AS m(meter),
     generate_series(0, :events - 1) g,
     LATERAL (SELECT CAST(:start AS timestamptz)
                     + (g * (CAST(:span AS double precision) / :events)) * interval '1 second'
                     AS at) a
"""

LOAD_TENANTS = """
INSERT INTO billing_tenants (tenant_id, name, stripe_customer_id, created_at, updated_at)
SELECT 'tenant-' || lpad(i::text, 3, '0'), 'Tenant ' || i,
       'cus_tenant' || lpad(i::text, 3, '0'), now(), now()
FROM generate_series(0, :tenants - 1) i
"""


class MoneyResults(SectionResults):
    """The money section's figures."""


def _settings(url: str, fake: Any) -> Any:
    from webapp.config import Settings

    return Settings.from_env({
        "DATABASE_URL": url, "STRIPE_API_KEY": "sk_test_bench",
        "STRIPE_API_BASE": fake.base_url, "STRIPE_MAX_REQUESTS_PER_SECOND": str(MAX_RPS),
        "OUTBOX_CONCURRENCY": "8"})


def _load(engine: Any, fake: Any, now: datetime) -> tuple[int, set[tuple[str, str, datetime]]]:
    """The sent events and Stripe's matching units; the drifted (customer, meter, day)."""
    from webapp.outbox import reconciliation as recon

    since, until = recon.default_window(now)
    span = (until - since).total_seconds()
    events = int(span // 86400 * PER_DAY) or 1
    with engine.begin() as conn:
        conn.execute(text(LOAD_TENANTS), {"tenants": TENANTS})
        conn.execute(text(LOAD_SENT), {"tenants": TENANTS, "meters": list(METERS),
                                       "events": events, "start": since, "span": span - 1})
        conn.execute(text("ANALYZE stripe_usage_outbox"))
        hours = conn.execute(text(
            "SELECT stripe_customer_id, meter, date_trunc('hour', occurred_at), sum(quantity) "
            "FROM stripe_usage_outbox GROUP BY 1, 2, 3")).all()
        total = int(conn.execute(select(func.count()).select_from(
            text("stripe_usage_outbox"))).scalar_one())
    for customer, meter, hour, units in hours:
        fake.add_usage(customer, meter, int(hour.timestamp()), float(units))
    drifted: set[tuple[str, str, datetime]] = set()
    first_day = (since + timedelta(days=2)).replace(hour=0, minute=0, second=0, microsecond=0)
    for i in range(DRIFTS):
        customer = f"cus_tenant{(i * 37) % TENANTS:03d}"
        meter = METERS[i % len(METERS)]
        day = first_day + timedelta(days=i)
        fake.add_usage(customer, meter, int((day + timedelta(hours=5)).timestamp()),
                       -1.0 if i % 2 else 3.0)
        drifted.add((customer, meter, day))
    return total, drifted


@dataclass
class Stack:
    engine: Any
    fake: Any
    settings: Any
    gateway: Any


@contextmanager
def _stack(db: BenchDatabase, prefix: str) -> Iterator[Stack]:
    """A migrated schema, the fake Stripe in this process, the settings and the gateway."""
    from tests.support.fake_stripe import FakeStripe
    from webapp.db import make_engine
    from webapp.worker import gateway_from

    schema, url = db.migrated_schema(prefix)
    engine = make_engine(url)
    try:
        with FakeStripe(meters=METERS, latency=LATENCY) as fake:
            settings = _settings(url, fake)
            gateway = gateway_from(settings)
            assert gateway is not None
            yield Stack(engine, fake, settings, gateway)
    finally:
        engine.dispose()
        db.drop_schema(schema)


def _reconcile_once(db: BenchDatabase, log: Any) -> dict[str, Any]:
    from webapp.worker import MeterRefresher
    from webapp.worker.reconciler import reconcile

    with _stack(db, "money") as st:
        now = datetime.now(UTC)
        events, drifted = _load(st.engine, st.fake, now)
        MeterRefresher(st.engine, st.gateway).run_once()
        t0 = time.perf_counter()
        run = reconcile(st.engine, st.gateway, st.settings, trigger="manual", now=now)
        wall = time.perf_counter() - t0
    found = {(m.stripe_customer_id, m.meter, m.start) for m in run.comparison.mismatches}
    if run.errors or found != drifted:
        raise BenchFailure(f"reconciliation named {sorted(found - drifted)[:3]} not drifted "
                           f"and missed {sorted(drifted - found)[:3]}; errors {run.errors[:3]}")
    return {"events": events, "calls": run.calls, "wall_s": wall,
            "checked": run.comparison.checked, "mismatches": len(found)}


def _poll_once(db: BenchDatabase, reports: int, log: Any) -> dict[str, Any]:
    from tests.support.fake_stripe import AsyncError
    from webapp.worker import EventPoller, MeterRefresher

    with _stack(db, "poll") as st:
        now = datetime.now(UTC)
        with st.engine.begin() as conn:
            conn.execute(text(LOAD_TENANTS), {"tenants": TENANTS})
            conn.execute(text(LOAD_SENT), {
                "tenants": TENANTS, "meters": list(METERS),
                "events": max(1, reports // (TENANTS * len(METERS))),
                "start": now - timedelta(days=1), "span": 3600.0})
            keys = list(conn.execute(text(
                "SELECT idempotency_key, meter FROM stripe_usage_outbox ORDER BY id")).all())
        keys = keys[:reports]
        for i, (key, meter) in enumerate(keys):
            st.fake.report_errors([AsyncError(meter, "meter_event_customer_not_found",
                                              f"No customer for {key}", key)],
                                  created_ago=float(len(keys) - i) / 100)
        MeterRefresher(st.engine, st.gateway).run_once()
        calls0 = st.gateway.calls
        t0 = time.perf_counter()
        summary = EventPoller(st.engine, st.gateway, max_requests_per_second=MAX_RPS).run_once()
        wall = time.perf_counter() - t0
        calls = st.gateway.calls - calls0
        with st.engine.connect() as conn:
            rejected = int(conn.execute(text(
                "SELECT count(*) FROM stripe_usage_outbox WHERE status = 'rejected'")
            ).scalar_one())
    if summary.events != len(keys) or rejected != len(keys):
        raise BenchFailure(f"poll stored {summary.events} of {len(keys)} reports; "
                           f"{rejected} events rejected")
    return {"reports": len(keys), "calls": calls, "wall_s": wall, "rate": len(keys) / wall}


def run(db: BenchDatabase, *, reports: int, runs: int, log: Any = print) -> MoneyResults:
    res = MoneyResults(events=reports, runs=runs)
    for i in range(runs):
        r = _reconcile_once(db, log)
        res.raw.append({"reconcile": r})
        res.fig("recon_calls").add(r["calls"])
        res.fig("recon_wall").add(r["wall_s"])
        res.fig("recon_events").add(r["events"])
        log(f"money run {i + 1}/{runs}: reconciliation of {r['events']:,} events, "
            f"{r['checked']:,} buckets: {r['calls']:,} calls in {r['wall_s']:.1f} s, "
            f"{r['mismatches']} mismatches (all drifted, none else)")
        p = _poll_once(db, reports, log)
        res.raw.append({"poll": p})
        res.fig("poll_calls").add(p["calls"])
        res.fig("poll_wall").add(p["wall_s"])
        res.fig("poll_rate").add(p["rate"])
        log(f"money run {i + 1}/{runs}: poll of {p['reports']:,} reports: {p['calls']:,} calls "
            f"in {p['wall_s']:.1f} s ({p['rate']:,.0f} reports/s)")
    return res


def rows(res: MoneyResults) -> list[Row]:
    s = "After Stripe's 200"
    f = res.fig
    n = int(f("recon_events").median)
    return [
        Row(s, f"Reconciliation: {TENANTS * len(METERS):,} (customer, meter) pairs × 35 days "
               f"({n:,} sent events, {DRIFTS} drifted days): Stripe calls",
            f("recon_calls").fmt(0),
            note="one summaries call per pair and span (ragged hours, whole days, ragged "
                 "hours); every drifted day named, nothing else"),
        Row(s, "Reconciliation: wall time", f("recon_wall").fmt(1, " s"),
            note=f"fake at {LATENCY * 1000:.0f} ms a call, {MAX_RPS:g} req/s allowed, 8 calls "
                 "in flight; at the default 20 req/s: calls ÷ 20 s"),
        Row(s, f"Poll of {res.events:,} stored error reports: Stripe calls",
            f("poll_calls").fmt(0), note="list pages (100 a page) + one read per report"),
        Row(s, "Poll: wall time", f("poll_wall").fmt(1, " s"),
            note=f"{f('poll_rate').fmt(0)} reports/s; 8 reads in flight; reports stored and "
                 "their events rejected 50 to a transaction"),
    ]
