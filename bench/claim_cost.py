"""The claim's cost with the invoice-first part (issue 30), on PostgreSQL at ``rows`` outbox rows
(10,000,000; 500,000 with ``--quick``): the claim statement of today against the one it
replaced (a single candidate scan, kept here word for word), on the same table, alternated.

**The table.** A migrated schema filled by set-based SQL: ``rows`` events over 400 days, 200
tenants (mapped), all ``sent`` but ``DUE`` due ``pending`` ones of the last hour; then
``VACUUM (ANALYZE)``. Two states: no event marked for a draft invoice (most of the time), and
``MARKED`` of the due events marked (a grace period with a backlog).

**The measure.** One claim of ``LIMIT`` events as the drainer makes it (no lanes avoided, no
shards, no meter filter), in a transaction rolled back after it, so every sample sees the
same table; ``SAMPLES`` of each statement, alternated, after two warm-ups each. The figure:
the median time of today's statement over the median of the old one. **Floor**: ≤ 1.1×.

**Late usage on the same table.** 200 customers × 13 monthly invoices, finalized, read long
ago: the first look for late sent events (``late.find_late``: every sent event, once after an
upgrade), a later look (what was sent since), and listing late usage (``late_events``, what
the late-usage page and ``billing-outbox late`` read). Informational rows.
"""

from __future__ import annotations

import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import String, bindparam, text
from sqlalchemy.dialects import postgresql

from .common import BenchDatabase, BenchFailure, Row, SectionResults, verdict

DUE = 5_000
MARKED = 500
LIMIT = 1_000
SAMPLES = 30
FLOOR = 1.1

LOAD = """
INSERT INTO stripe_usage_outbox (
    tenant_id, meter, quantity, idempotency_key, occurred_at, status, attempt_count,
    call_count, next_attempt_at, stripe_customer_id, key_generation, first_attempt_at, sent_at,
    last_outcome, last_http_status, created_at, updated_at)
SELECT 't' || lpad((g % 200)::text, 3, '0'), 'api_requests', 1 + g % 7, 'claim:' || g, at,
       'sent', 1, 1, at, 'cus_' || lpad((g % 200)::text, 3, '0'), 0, at, at, 'delivered', 200,
       at, at
FROM generate_series(0, :n - 1) g,
     LATERAL (SELECT CAST(:start AS timestamptz) + g * (CAST(:span AS double precision) / :n)
                     * interval '1 second' AS at) a
"""

LOAD_DUE = """
INSERT INTO stripe_usage_outbox (
    tenant_id, meter, quantity, idempotency_key, occurred_at, status, attempt_count,
    call_count, next_attempt_at, key_generation, created_at, updated_at)
SELECT 't' || lpad((g % 200)::text, 3, '0'), 'api_requests', 1, 'due:' || g,
       CAST(:now AS timestamptz) - interval '1 hour', 'pending', 0, 0,
       CAST(:now AS timestamptz) - (g * interval '1 second'), 0, CAST(:now AS timestamptz),
       CAST(:now AS timestamptz)
FROM generate_series(0, :n - 1) g
"""

LOAD_TENANTS = """
INSERT INTO billing_tenants (tenant_id, name, stripe_customer_id, created_at, updated_at)
SELECT 't' || lpad(i::text, 3, '0'), NULL, 'cus_' || lpad(i::text, 3, '0'), now(), now()
FROM generate_series(0, 199) i
"""

#: The claim before issue 30: one candidate scan, oldest due first.
OLD_CLAIM = """
WITH picked AS MATERIALIZED (
    SELECT o.id
    FROM stripe_usage_outbox AS o
    LEFT JOIN billing_tenants AS t ON t.tenant_id = o.tenant_id
    WHERE {sendable}
      AND NOT (COALESCE(o.stripe_customer_id, t.stripe_customer_id) || chr(31) || o.meter
               = ANY(:avoid))
    ORDER BY o.next_attempt_at, o.id
    LIMIT :limit
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE stripe_usage_outbox AS o
SET status = 'processing', claim_token = :token, claimed_by = :worker,
    processing_deadline_at = :deadline, updated_at = :now,
    stripe_customer_id = COALESCE(o.stripe_customer_id,
        (SELECT t.stripe_customer_id FROM billing_tenants AS t WHERE t.tenant_id = o.tenant_id)),
    first_attempt_at = COALESCE(o.first_attempt_at, :now)
WHERE o.id = ANY(ARRAY(SELECT id FROM picked))
  AND {waiting}
RETURNING o.id, o.tenant_id, o.meter, o.quantity,
          COALESCE(o.stripe_identifier, o.idempotency_key), o.occurred_at,
          o.stripe_customer_id, o.attempt_count, o.call_count, o.key_generation,
          o.first_unknown_at
"""


class ClaimResults(SectionResults):
    """The claim section's figures."""


def _statements() -> dict[str, Any]:
    from webapp.outbox import claims
    from webapp.outbox.sendable import PG_SENDABLE_NOW, PG_WAITING

    old = text(OLD_CLAIM.format(sendable=PG_SENDABLE_NOW, waiting=PG_WAITING)).bindparams(
        bindparam("avoid", type_=postgresql.ARRAY(String)))
    return {"old": old, "new": claims._pg_claim(False, False)}


def _sample(engine: Any, stmt: Any, now: datetime) -> tuple[float, int]:
    params = dict(now=now, limit=LIMIT, token="b" * 32, worker="bench",
                  deadline=now + timedelta(minutes=2), avoid=[])
    with engine.connect() as conn:
        t0 = time.perf_counter()
        got = len(conn.execute(stmt, params).all())
        ms = (time.perf_counter() - t0) * 1000
        conn.rollback()
    return ms, got


def _measure(engine: Any, now: datetime) -> dict[str, list[float]]:
    stmts = _statements()
    times: dict[str, list[float]] = {k: [] for k in stmts}
    for round_ in range(2 + SAMPLES):
        for name, stmt in stmts.items():
            ms, got = _sample(engine, stmt, now)
            if got != LIMIT:
                raise BenchFailure(f"the {name} claim took {got} events, not {LIMIT}")
            if round_ >= 2:
                times[name].append(ms)
    return times


LOAD_INVOICES = """
INSERT INTO stripe_invoices (id, stripe_customer_id, subscription_id, status, created,
                             finalizes_at, finalized_at, seen_at)
SELECT 'in_' || c || '_' || m, 'cus_' || lpad(c::text, 3, '0'), 'sub_' || c, 'paid',
       CAST(:now AS timestamptz) - m * interval '30 days', NULL,
       CAST(:now AS timestamptz) - m * interval '30 days' + interval '1 hour',
       CAST(:now AS timestamptz) - m * interval '30 days' + interval '2 hours'
FROM generate_series(0, 199) c, generate_series(1, 13) m
"""

LOAD_PERIODS = """
INSERT INTO stripe_invoice_periods (invoice_id, subscription_item_id, stripe_customer_id, meter,
                                    period_start, period_end, quantity)
SELECT 'in_' || c || '_' || m, 'si_' || c, 'cus_' || lpad(c::text, 3, '0'), 'api_requests',
       CAST(:now AS timestamptz) - (m + 1) * interval '30 days',
       CAST(:now AS timestamptz) - m * interval '30 days', 0
FROM generate_series(0, 199) c, generate_series(1, 13) m
"""


def _late(engine: Any, now: datetime) -> dict[str, float]:
    from webapp.outbox import late

    with engine.begin() as conn:
        conn.execute(text(LOAD_INVOICES), {"now": now})
        conn.execute(text(LOAD_PERIODS), {"now": now})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM (ANALYZE) stripe_invoices, stripe_invoice_periods"))
    out: dict[str, float] = {}
    for name, at in (("late_first_s", now), ("late_next_s", now + timedelta(minutes=15))):
        t0 = time.perf_counter()
        late.find_late(engine, now=at)
        out[name] = time.perf_counter() - t0
    listing = []
    for _ in range(10):
        t0 = time.perf_counter()
        with engine.connect() as conn:
            late.late_events(conn)
        listing.append((time.perf_counter() - t0) * 1000)
    out["late_list_ms"] = statistics.median(listing)
    return out


def _once(db: BenchDatabase, rows: int, log: Any) -> dict[str, Any]:
    from webapp.db import make_engine

    schema, url = db.migrated_schema("claim")
    engine = make_engine(url)
    try:
        now = datetime.now(UTC).replace(microsecond=0)
        t0 = time.perf_counter()
        with engine.begin() as conn:
            conn.execute(text(LOAD_TENANTS))
            conn.execute(text(LOAD), {"n": rows, "start": now - timedelta(days=400),
                                      "span": 399 * 86400.0})
            conn.execute(text(LOAD_DUE), {"n": DUE, "now": now})
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM (ANALYZE)"))
        log(f"claim: {rows:,} rows loaded in {time.perf_counter() - t0:.0f} s")
        unmarked = _measure(engine, now)
        with engine.begin() as conn:
            conn.execute(text(
                "UPDATE stripe_usage_outbox SET invoice_finalizes_at = :at WHERE id IN "
                "(SELECT id FROM stripe_usage_outbox WHERE status = 'pending' "
                "ORDER BY next_attempt_at DESC LIMIT :n)"),
                {"at": now + timedelta(minutes=30), "n": MARKED})
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM (ANALYZE) stripe_usage_outbox"))
        marked = _measure(engine, now)
        lateness = _late(engine, now)
    finally:
        engine.dispose()
        db.drop_schema(schema)
    return {"unmarked": unmarked, "marked": marked, **lateness}


def run(db: BenchDatabase, *, rows: int, runs: int, log: Any = print) -> ClaimResults:
    res = ClaimResults(events=rows, runs=runs)
    for i in range(runs):
        r = _once(db, rows, log)
        res.raw.append(r)
        for state in ("unmarked", "marked"):
            old, new = (statistics.median(r[state][k]) for k in ("old", "new"))
            res.fig(f"{state} old").add(old)
            res.fig(f"{state} new").add(new)
            res.fig(f"{state} ratio").add(new / old)
            log(f"claim run {i + 1}/{runs}, {state}: old {old:.1f} ms, new {new:.1f} ms, "
                f"{new / old:.2f}×")
        for k in ("late_first_s", "late_next_s", "late_list_ms"):
            res.fig(k).add(r[k])
    return res


def rows(res: ClaimResults) -> list[Row]:
    s = "Claim at scale"
    f = res.fig
    n = res.events
    out = []
    for state, what in (("unmarked", "no event marked for a draft invoice"),
                        ("marked", f"{MARKED} of the due events marked for a draft")):
        ratio = f(f"{state} ratio")
        out.append(Row(
            s, f"claim of {LIMIT:,} at {n:,} rows ({DUE:,} due), {what}: today / before",
            f"{ratio.fmt(2)}× ({f(f'{state} new').fmt(1, ' ms')} vs "
            f"{f(f'{state} old').fmt(1, ' ms')})", f"≤ {FLOOR}×", verdict(ratio.median <= FLOOR),
            note=f"medians of {SAMPLES} claims each, alternated, each rolled back",
            floor_name=(f"Issue 30: the claim at {n:,} rows within {FLOOR}× of before"
                        if state == "unmarked" else "")))
    out.append(Row(s, f"late usage at {n:,} rows, 2,600 finalized periods: the first look for "
                      "late sends (every sent event, once) / a later look / the listing",
                   f"{f('late_first_s').fmt(2, ' s')} / {f('late_next_s').fmt(3, ' s')} / "
                   f"{f('late_list_ms').fmt(1, ' ms')}",
                   note="later looks read what was sent since the last one; the listing reads "
                        "what was recorded and the unsent events' index"))
    return out
