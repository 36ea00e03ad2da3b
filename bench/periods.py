"""Billing periods (issue 30): reading Stripe's periods and invoices for many customers, and the
periods page over them, on PostgreSQL through the real SDK against the project's fake Stripe
(in this process, ``LATENCY`` per call, ``MAX_RPS`` allowed as for a live-mode key).

**The account.** ``customers`` customers (100,000; 10,000 with ``--quick``), each with one
monthly subscription metered on ``api_requests``. Their billing anchors are spread evenly over
the last 35 days (so each has about one invoice in the window the first refresh reads), except
a fifth of them, whose periods ended ten minutes ago: the turn of a month, with that many
draft invoices waiting out their grace period (an hour) at once.

**The read.** ``BillingRefresher.run_once`` as a worker runs it at start: every subscription
(``status=all``, pages of 100) and every invoice of the last 35 days (pages of 100, their
embedded lines), stored. Then a second refresh, as the schedule runs it 15 minutes later
(the clock moved on; the invoices created since the last pass, and every subscription again).
Stripe calls and wall time of each. **Floor**: a refresh under 2 minutes.

**The page.** The customers are mapped to tenants; ``PENDING`` events wait in the drafts'
periods. ``GET /periods`` (the first page of closing periods) and its htmx fragment, and
``GET /periods/late``, signed in as an admin, each sampled ``10 × runs`` times (at least 20)
round-robin after two warm-up requests. **Floor**: p95 under 300 ms.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text

from .common import BenchDatabase, BenchFailure, Row, SectionResults, verdict
from .dashboard import ADMIN, make_users, p95, signed_in_client

LATENCY = 0.05
MAX_RPS = 100.0
METER = "api_requests"
PENDING = 20_000
FLOOR_READ_S = 120.0
FLOOR_P95_MS = 300.0
DAY = 86_400

LOAD_TENANTS = """
INSERT INTO billing_tenants (tenant_id, name, stripe_customer_id, created_at, updated_at)
SELECT 't' || lpad(i::text, 6, '0'), NULL, 'cus_' || lpad(i::text, 6, '0'), now(), now()
FROM generate_series(0, :n - 1) i
"""

LOAD_PENDING = """
INSERT INTO stripe_usage_outbox (
    tenant_id, meter, quantity, idempotency_key, occurred_at, status, attempt_count,
    call_count, key_generation, next_attempt_at, created_at, updated_at)
SELECT 't' || lpad((g % :closing)::text, 6, '0'), :meter, 1 + g % 9, 'periods:' || g,
       CAST(:occurred AS timestamptz), CASE WHEN g % 10 = 0 THEN 'dead' ELSE 'retrying' END,
       1, 1, 0, CAST(:now AS timestamptz) + interval '1 hour', CAST(:now AS timestamptz),
       CAST(:now AS timestamptz)
FROM generate_series(0, :n - 1) g
"""


class PeriodsResults(SectionResults):
    """The periods section's figures."""


def _settings(url: str, fake: Any) -> Any:
    from webapp.config import Settings

    return Settings.from_env({
        "DATABASE_URL": url, "STRIPE_API_KEY": "sk_live_bench", "SECRET_KEY": "bench" * 10,
        "STRIPE_API_BASE": fake.base_url, "STRIPE_MAX_REQUESTS_PER_SECOND": str(MAX_RPS)})


def _account(fake: Any, customers: int, now: int) -> int:
    """The subscriptions; how many periods ended ten minutes ago."""
    closing = customers // 5
    ids = [f"cus_{i:06d}" for i in range(customers)]
    fake.create_subscriptions(ids[:closing], [METER], period_start=now - 600 - 30 * DAY,
                              period_seconds=30 * DAY)
    rest = ids[closing:]
    per_day = max(1, len(rest) // 35)
    for day in range(35):
        group = rest[day * per_day:(day + 1) * per_day] if day < 34 else rest[34 * per_day:]
        if group:
            # Anchored ``day`` days and a half ago: the first period ended then (an invoice
            # in the window), the second runs.
            fake.create_subscriptions(group, [METER], period_seconds=30 * DAY,
                                      period_start=now - 30 * DAY - day * DAY - DAY // 2)
    return closing


def _once(db: BenchDatabase, customers: int, samples: int, log: Any) -> dict[str, Any]:
    from tests.support.fake_stripe import FakeStripe
    from webapp import create_app
    from webapp.db import make_engine
    from webapp.outbox import invoices
    from webapp.worker import gateway_from
    from webapp.worker.invoices import billing_refresher

    schema, url = db.migrated_schema("periods")
    engine = make_engine(url)
    offset = [0.0]

    def clock_s() -> float:
        return time.time() + offset[0]

    def clock() -> datetime:
        return datetime.now(UTC) + timedelta(seconds=offset[0])

    try:
        with FakeStripe(meters=(METER,), clock=clock_s) as fake:
            now = int(clock_s())
            closing = _account(fake, customers, now)
            fake.tick()                       # the drafts and invoices of the past 35 days
            fake.set_latency(LATENCY)
            settings = _settings(url, fake)
            gateway = gateway_from(settings)
            assert gateway is not None
            refresher = billing_refresher(engine, gateway, settings, clock=clock)
            t0, calls0 = time.perf_counter(), gateway.calls
            first = refresher.run_once()
            first_s, first_calls = time.perf_counter() - t0, gateway.calls - calls0
            if first.items != customers or first.drafts != closing:
                raise BenchFailure(f"the refresh stored {first.items} items of {customers} "
                                   f"and {first.drafts} drafts of {closing}")
            log(f"periods: first refresh {first_s:.1f} s, {first_calls} calls, "
                f"{first.invoices:,} invoices")
            offset[0] += 900
            t0, calls0 = time.perf_counter(), gateway.calls
            second = refresher.run_once()
            second_s, second_calls = time.perf_counter() - t0, gateway.calls - calls0
            if second.items != customers:
                raise BenchFailure(f"the second refresh stored {second.items} items")
            log(f"periods: second refresh {second_s:.1f} s, {second_calls} calls")

        with engine.begin() as conn:
            conn.execute(text(LOAD_TENANTS), {"n": customers})
            conn.execute(text(LOAD_PENDING), {
                "n": PENDING, "closing": closing, "meter": METER,
                "occurred": clock() - timedelta(days=1), "now": clock()})
        marked, _ = invoices.mark_invoice_first(engine)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM (ANALYZE)"))
        make_users(engine)
        app = create_app({"TESTING": True}, settings=_settings(url, fake),
                         engine=engine, start_drainer=False)
        client = signed_in_client(app)
        routes = {"/periods": {}, "/periods (htmx)": {"HX-Request": "true"},
                  "/periods/late": {}}
        times: dict[str, list[float]] = {k: [] for k in routes}
        for round_ in range(2 + samples):
            for name, headers in routes.items():
                t0 = time.perf_counter()
                resp = client.get(name.split(" ")[0], headers=headers)
                resp.get_data()
                ms = (time.perf_counter() - t0) * 1000
                if resp.status_code != 200:
                    raise BenchFailure(f"{name} answered {resp.status_code}")
                if round_ >= 2:
                    times[name].append(ms)
        body = client.get("/periods").get_data(as_text=True)
        if "cus_000000" not in body and "t000000" not in body:
            raise BenchFailure("/periods does not show the closing periods")
    finally:
        engine.dispose()
        db.drop_schema(schema)
    return {"customers": customers, "closing": closing, "first_s": first_s,
            "first_calls": first_calls, "second_s": second_s, "second_calls": second_calls,
            "invoices": first.invoices, "marked": marked, "user": ADMIN,
            "page_ms": {k: v for k, v in times.items()}}


def run(db: BenchDatabase, *, customers: int, runs: int, log: Any = print) -> PeriodsResults:
    res = PeriodsResults(events=customers, runs=runs)
    samples = max(20, 10 * runs)
    for i in range(runs):
        r = _once(db, customers, samples, log)
        res.raw.append(r)
        for k in ("first_s", "first_calls", "second_s", "second_calls", "invoices"):
            res.fig(k).add(r[k])
        for name, values in r["page_ms"].items():
            res.fig(f"{name} median").add(sorted(values)[len(values) // 2])
            res.fig(f"{name} p95").add(p95(values))
        log(f"periods run {i + 1}/{runs}: refreshes {r['first_s']:.1f} s / "
            f"{r['second_s']:.1f} s; /periods p95 {p95(r['page_ms']['/periods']):.0f} ms")
    return res


def rows(res: PeriodsResults) -> list[Row]:
    s = "Billing periods"
    f = res.fig
    n = res.events
    out = [
        Row(s, f"First refresh, {n:,} customers: every subscription and every invoice of 35 "
               f"days ({f('invoices').fmt(0)} invoices): wall time", f("first_s").fmt(1, " s"),
            f"< {FLOOR_READ_S:.0f} s", verdict(f("first_s").hi < FLOOR_READ_S),
            note=f"{f('first_calls').fmt(0)} Stripe calls; fake at {LATENCY * 1000:.0f} ms a "
                 f"call, {MAX_RPS:g} req/s allowed (live mode), pages of 100; the two lists "
                 "read side by side",
            floor_name=f"Issue 30: periods of {n:,} customers read in under 2 minutes"),
        Row(s, "Scheduled refresh 15 minutes later: wall time", f("second_s").fmt(1, " s"),
            f"< {FLOOR_READ_S:.0f} s", verdict(f("second_s").hi < FLOOR_READ_S),
            note=f"{f('second_calls').fmt(0)} Stripe calls: every subscription again, the "
                 "invoices since the last pass (back to the oldest draft)"),
    ]
    names = ("/periods", "/periods (htmx)", "/periods/late")
    for name in names:
        high = f(f"{name} p95").hi
        out.append(Row(s, f"{name} at {n:,} tenants, {n // 5:,} drafts, {PENDING:,} unsent",
                       f"median {f(f'{name} median').fmt(1, ' ms')}; p95 "
                       f"{f(f'{name} p95').fmt(1, ' ms')}", f"p95 < {FLOOR_P95_MS:.0f} ms",
                       verdict(high < FLOOR_P95_MS)))
    worst = max(f(f"{name} p95").hi for name in names)
    out.append(Row(s, "Periods pages: worst p95", f"{worst:.1f} ms",
                   f"p95 < {FLOOR_P95_MS:.0f} ms", verdict(worst < FLOOR_P95_MS),
                   floor_name=f"Issue 30: periods pages p95 under 300 ms at {n:,} tenants"))
    return out
