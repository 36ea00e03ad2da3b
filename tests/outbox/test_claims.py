"""The claim statement, release and rescue (``webapp.outbox.claims``), called directly with an
injected clock, on SQLite and PostgreSQL: due rows only, mapped tenants only, the customer
fixed at the first claim, exclusive claims under concurrency (and, on PostgreSQL, two
claimers in open transactions that get disjoint rows without waiting), release, rescue, and
the partial index serving the claim.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, event, insert, text, update
from sqlalchemy.orm import Session

from webapp.db import make_engine
from webapp.outbox import enqueue_usage
from webapp.outbox.claims import claim_batch, claim_in, release, rescue_expired
from webapp.outbox.record import record_outcomes

from .helpers import (
    E429,
    POLICY,
    T0,
    TIMEOUT,
    T,
    add,
    at,
    attempt,
    claim,
    map_tenant,
    row,
    rows,
)

# -- what is claimed ------------------------------------------------------------------------------

def test_claims_due_rows_of_claimable_statuses_only(engine: Engine) -> None:
    map_tenant(engine, "acme", "cus_A")
    ids = add(engine, 8)
    future, sent, dead, resolved, processing, retrying = ids[1:7]
    with engine.begin() as conn:
        conn.execute(update(T).where(T.c.id == future).values(next_attempt_at=at(60)))
        for i, status in ((sent, "sent"), (dead, "dead"), (resolved, "resolved"),
                          (processing, "processing"), (retrying, "retrying")):
            conn.execute(update(T).where(T.c.id == i).values(status=status,
                                                              processing_deadline_at=at(999)))
    c = claim(engine, at(1), worker="worker-1", timeout=30)
    got = {e.id for e in c.events}
    assert got == {ids[0], retrying, ids[7]}
    assert [e.id for e in c.events] == sorted(got)
    for i in got:
        r = row(engine, i)
        assert r.status == "processing"
        assert r.claim_token == c.token
        assert r.claimed_by == "worker-1"
        assert r.processing_deadline_at == at(31) == c.deadline
        assert r.first_attempt_at == at(1)
    assert row(engine, future).status == "pending"
    # nothing else is due now, and the future row becomes due at its time
    assert claim(engine, at(59)).events == []
    assert [e.id for e in claim(engine, at(60)).events] == [future]
    for i, status in ((sent, "sent"), (dead, "dead"), (resolved, "resolved"),
                      (processing, "processing")):
        assert row(engine, i).status == status


def test_claims_oldest_due_first_up_to_the_limit(engine: Engine) -> None:
    map_tenant(engine, "acme", "cus_A")
    ids = add(engine, 5)
    order = [ids[3], ids[1], ids[4], ids[0], ids[2]]
    with engine.begin() as conn:
        for n, i in enumerate(order):
            conn.execute(update(T).where(T.c.id == i).values(next_attempt_at=at(-10 + n)))
    first = claim(engine, at(0), limit=2)
    assert {e.id for e in first.events} == set(order[:2])
    second = claim(engine, at(0), limit=2)
    assert {e.id for e in second.events} == set(order[2:4])
    assert first.token != second.token


def test_claimed_event_carries_what_is_sent(engine: Engine) -> None:
    map_tenant(engine, "acme", "cus_A")
    occurred = T0 - timedelta(hours=1)
    with Session(engine) as db, db.begin():
        event_id = enqueue_usage(db, tenant_id="acme", quantity=42, idempotency_key="usage:9",
                                 meter="storage", occurred_at=occurred, now=T0).id
    (ev,) = claim(engine, at(1)).events
    assert (ev.id, ev.tenant_id, ev.meter, ev.quantity, ev.identifier) == (
        event_id, "acme", "storage", 42, "usage:9")
    assert ev.occurred_at == occurred
    assert ev.stripe_customer_id == "cus_A"
    assert ev.lane == ("cus_A", "storage")
    assert ev.idempotency_key == "usage:9"
    assert (ev.attempt_count, ev.call_count, ev.key_generation, ev.first_unknown_at) == (
        0, 0, 0, None)


def test_unmapped_tenants_wait_until_mapped(engine: Engine) -> None:
    map_tenant(engine, "nocus", None)       # known tenant, no Stripe customer yet
    ghost = add(engine, 2, tenant="ghost", prefix="g")   # tenant never mentioned
    nocus = add(engine, 2, tenant="nocus", prefix="n")
    assert claim(engine, at(1)).events == []
    assert all(r.status == "pending" and r.stripe_customer_id is None
               for r in rows(engine).values())
    map_tenant(engine, "ghost", "cus_G", now=at(2))
    c = claim(engine, at(3))
    assert {e.id for e in c.events} == set(ghost)
    assert {e.stripe_customer_id for e in c.events} == {"cus_G"}
    assert {row(engine, i).stripe_customer_id for i in ghost} == {"cus_G"}
    map_tenant(engine, "nocus", "cus_N", now=at(4))
    assert {e.id for e in claim(engine, at(5)).events} == set(nocus)


def test_customer_fixed_at_first_claim(engine: Engine) -> None:
    map_tenant(engine, "acme", "cus_OLD")
    (first,) = add(engine, 1)
    c = claim(engine, at(1))
    assert c.events[0].stripe_customer_id == "cus_OLD"
    # a call happened and said "retry later"
    record_outcomes(engine, c, [attempt(c, 0, E429, at(1))], now=at(2), policy=POLICY,
                    rng=random.Random(1))
    map_tenant(engine, "acme", "cus_NEW", now=at(3))
    (second,) = add(engine, 1, start=1, now=at(3))
    c2 = claim(engine, at(10))
    by_id = {e.id: e for e in c2.events}
    assert by_id[first].stripe_customer_id == "cus_OLD"
    assert by_id[second].stripe_customer_id == "cus_NEW"
    assert row(engine, first).stripe_customer_id == "cus_OLD"
    # unmapping the tenant does not strand events whose customer is already fixed; one
    # never claimed waits for a mapping again
    release(engine, c2.token, [first, second], now=at(11))
    map_tenant(engine, "acme", None, now=at(12))
    (third,) = add(engine, 1, start=2, now=at(12))
    c3 = claim(engine, at(13))
    assert {e.id: e.stripe_customer_id for e in c3.events} == {first: "cus_OLD",
                                                              second: "cus_NEW"}
    assert row(engine, third).status == "pending"


def test_avoid_lanes_leaves_busy_lanes_queued(engine: Engine) -> None:
    map_tenant(engine, "acme", "cus_A")
    map_tenant(engine, "globex", "cus_G")
    a = add(engine, 2, tenant="acme", prefix="a")
    g = add(engine, 2, tenant="globex", prefix="g")
    c = claim(engine, at(1), avoid_lanes=[("cus_A", "api_requests")])
    assert {e.id for e in c.events} == set(g)
    assert all(row(engine, i).status == "pending" for i in a)


# -- exclusive claims -----------------------------------------------------------------------------

def test_pg_two_open_claims_get_disjoint_rows_and_the_second_does_not_wait(
        pg: Engine) -> None:
    """Two claimers in two transactions open at the same time: while the first still holds
    its rows (not committed), the second claims the next rows at once. The second runs with
    a lock timeout, so a claim that waited for the first one's row locks — one without
    ``SKIP LOCKED`` — fails here instead of passing slowly."""
    map_tenant(pg, "acme", "cus_A")
    map_tenant(pg, "globex", "cus_G")
    ids = sorted(add(pg, 10, tenant="acme", prefix="a") + add(pg, 10, tenant="globex",
                                                               prefix="g"))
    with pg.connect() as first, pg.connect() as second:
        first.begin()
        one = claim_in(first, worker="w1", limit=8, now=at(1), claim_timeout_seconds=30)
        second.begin()
        second.execute(text("SET LOCAL lock_timeout = '1s'"))
        two = claim_in(second, worker="w2", limit=8, now=at(1), claim_timeout_seconds=30)
        mine, theirs = [e.id for e in one.events], [e.id for e in two.events]
        assert mine == ids[:8]                  # the oldest due first
        assert theirs == ids[8:16]              # the next ones: none of the first's
        second.commit()
        first.commit()
    got = rows(pg)
    assert {i for i, r in got.items() if r.claim_token == one.token} == set(mine)
    assert {i for i, r in got.items() if r.claim_token == two.token} == set(theirs)
    assert {i for i, r in got.items() if r.status == "pending"} == set(ids[16:])


def test_two_concurrent_claimers_never_share_an_event(db_url: str) -> None:
    """Two threads, each with its own engine (real, separate connections), claim in lock-step
    rounds: every event goes to exactly one of them in each round."""
    setup = make_engine(db_url)
    map_tenant(setup, "acme", "cus_A")
    map_tenant(setup, "globex", "cus_G")
    total, limit, rounds = 150, 7, 3
    all_ids = set(add(setup, total // 2, tenant="acme", prefix="a")
                  + add(setup, total - total // 2, tenant="globex", prefix="g"))
    engines = [make_engine(db_url), make_engine(db_url)]
    barrier = threading.Barrier(2, timeout=30)
    results: list[list[list[int]]] = [[], []]  # per claimer, per step: ids
    tokens: list[list[str]] = [[], []]
    errors: list[BaseException] = []
    steps = -(-total // (2 * limit)) + 2

    def claimer(n: int) -> None:
        try:
            for r in range(rounds):
                for _ in range(steps):
                    barrier.wait()
                    c = claim_batch(engines[n], worker=f"w{n}", limit=limit,
                                    now=at(1 + r), claim_timeout_seconds=30)
                    results[n].append([e.id for e in c.events])
                    tokens[n].append(c.token)
                barrier.wait()
                if n == 0:  # put everything back for the next round
                    with engines[0].begin() as conn:
                        conn.execute(update(T).values(status="pending", claim_token=None,
                                                      processing_deadline_at=None))
                barrier.wait()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=claimer, args=(n,)) for n in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for e in engines + [setup]:
        e.dispose()
    assert not errors, errors
    for r in range(rounds):
        claimed: list[int] = []
        remaining = total
        for s in range(r * steps, (r + 1) * steps):
            a, b = results[0][s], results[1][s]
            assert not set(a) & set(b), f"round {r} step {s}: both claimed {set(a) & set(b)}"
            # neither claimer starves or skips rows it could have had
            assert len(a) + len(b) == min(2 * limit, remaining)
            remaining -= len(a) + len(b)
            claimed += a + b
        assert len(claimed) == len(set(claimed)) == total
        assert set(claimed) == all_ids
    assert len(set(tokens[0] + tokens[1])) == 2 * rounds * steps


# -- release and rescue ----------------------------------------------------------------------------

def test_release_returns_events_untouched(engine: Engine) -> None:
    map_tenant(engine, "acme", "cus_A")
    ids = add(engine, 3)
    c = claim(engine, at(1))
    before = rows(engine)
    assert release(engine, c.token, ids[:2], now=at(2)) == 2
    assert release(engine, c.token, [], now=at(2)) == 0
    assert release(engine, "not-the-token", [ids[2]], now=at(2)) == 0
    after = rows(engine)
    for i in ids[:2]:
        r = after[i]
        assert (r.status, r.attempt_count, r.call_count, r.claim_token, r.claimed_by,
                r.processing_deadline_at) == ("pending", 0, 0, None, None, None)
        assert r.next_attempt_at == before[i].next_attempt_at
        assert r.stripe_customer_id == "cus_A"
        assert r.first_unknown_at is None
    assert after[ids[2]].status == "processing"
    # claimable again at once
    assert {e.id for e in claim(engine, at(2)).events} == set(ids[:2])


def test_release_with_delay_and_after_a_call(engine: Engine) -> None:
    map_tenant(engine, "acme", "cus_A")
    (i,) = add(engine, 1)
    c = claim(engine, at(1))
    record_outcomes(engine, c, [attempt(c, 0, E429, at(1))], now=at(1), policy=POLICY)
    c = claim(engine, at(10))
    assert release(engine, c.token, [i], now=at(10), delay_seconds=5) == 1
    r = row(engine, i)
    assert (r.status, r.attempt_count, r.call_count) == ("retrying", 0, 1)
    assert r.next_attempt_at == at(15)
    assert claim(engine, at(14)).events == []
    assert [e.id for e in claim(engine, at(15)).events] == [i]


def test_rescue_returns_expired_claims_only(engine: Engine) -> None:
    map_tenant(engine, "acme", "cus_A")
    ids = add(engine, 4)
    short = claim(engine, at(0), limit=2, timeout=1.0)
    long_ = claim(engine, at(0), limit=2, timeout=60.0)
    assert rescue_expired(engine, now=at(1)) == 0   # deadline not passed (strictly)
    assert rescue_expired(engine, now=at(2)) == 2
    got = rows(engine)
    for e in short.events:
        r = got[e.id]
        assert (r.status, r.claim_token, r.claimed_by, r.processing_deadline_at) == (
            "pending", None, None, None)
        # the dead worker may have sent it: the dedupe-window clock starts at the claim
        assert r.first_unknown_at == at(0)
        assert r.last_outcome == "claim_expired"
        assert r.attempt_count == 0
    for e in long_.events:
        assert got[e.id].status == "processing"
        assert got[e.id].first_unknown_at is None
    assert rescue_expired(engine, now=at(2)) == 0
    assert len(ids) == 4


def test_rescue_keeps_an_earlier_first_unknown_and_retrying_status(engine: Engine) -> None:
    map_tenant(engine, "acme", "cus_A")
    (i,) = add(engine, 1)
    c = claim(engine, at(0))
    record_outcomes(engine, c, [attempt(c, 0, TIMEOUT, at(0))], now=at(1), policy=POLICY)
    assert row(engine, i).first_unknown_at == at(0)
    claim(engine, at(100), timeout=1.0)
    assert rescue_expired(engine, now=at(200)) == 1
    r = row(engine, i)
    assert (r.status, r.first_unknown_at, r.attempt_count) == ("retrying", at(0), 1)


# -- PostgreSQL: the claim is an index scan over due rows only -------------------------------------

@pytest.fixture
def pg_engine(pg_url: str) -> Iterator[Engine]:
    eng = make_engine(pg_url)
    yield eng
    eng.dispose()


@pytest.mark.parametrize("backlog", [5, 2000], ids=["few-pending", "backlog"])
def test_pg_claim_uses_the_partial_index(pg_engine: Engine, backlog: int) -> None:
    """20,000 sent rows and a backlog: the claim's candidate select is an index scan over
    claimable rows, never a sequential scan of everything ever sent. With a real backlog the
    ordered LIMIT is served by ix_outbox_claimable; with a handful of rows the planner may
    read them through another small partial index (and sort five rows), which is as good."""
    engine = pg_engine
    map_tenant(engine, "acme", "cus_A")
    base = dict(tenant_id="acme", meter="api_requests", quantity=1, occurred_at=T0,
                status="sent", attempt_count=1, call_count=1, key_generation=0,
                next_attempt_at=T0 - timedelta(days=1), created_at=T0, updated_at=T0,
                stripe_customer_id="cus_A")
    with engine.begin() as conn:
        conn.execute(insert(T), [dict(base, idempotency_key=f"old{i}") for i in range(20_000)])
        conn.execute(insert(T), [dict(base, idempotency_key=f"new{i}", status="pending",
                                      attempt_count=0, call_count=0, stripe_customer_id=None,
                                      next_attempt_at=T0 - timedelta(seconds=backlog - i))
                                 for i in range(backlog)])
        conn.exec_driver_sql("ANALYZE stripe_usage_outbox")
        conn.exec_driver_sql("ANALYZE billing_tenants")

    captured: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
                executemany: bool) -> None:
        if "SKIP LOCKED" in statement:
            captured.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        c = claim(engine, at(1), limit=100)
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    assert len(c.events) == min(100, backlog)
    assert [e.identifier for e in c.events] == [f"new{i}" for i in range(min(100, backlog))]
    assert len(captured) == 1
    statement, parameters = captured[0]
    with engine.connect() as conn:
        plan = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + statement, parameters))
        conn.rollback()
    assert "Seq Scan on stripe_usage_outbox" not in plan, plan
    # the draft invoices' part reads its own (empty) partial index, never the table
    first = plan.split("CTE invoice_first", 1)[1].split("CTE the_rest", 1)[0]
    assert "ix_outbox_invoice_first" in first, plan
    # the rest of the batch (inside its CTE) reads a partial index of unsent rows
    cte = plan.split("CTE the_rest", 1)[1].split("\n  ->", 1)[0]
    assert any(ix in cte for ix in ("ix_outbox_claimable", "ix_outbox_waiting_created")), plan
    if backlog >= 1000:
        assert "Index Scan using ix_outbox_claimable" in cte, plan
        assert "Sort" not in cte, plan


def test_sqlite_claim_searches_an_index(sqlite_url: str) -> None:
    """SQLite's planner may prefer the status index to the partial one; either way the claim
    must be an index search over claimable rows, never a scan of everything ever sent."""
    engine = make_engine(sqlite_url)
    try:
        map_tenant(engine, "acme", "cus_A")
        base = dict(tenant_id="acme", meter="api_requests", quantity=1, occurred_at=T0,
                    status="sent", attempt_count=1, call_count=1, key_generation=0,
                    next_attempt_at=T0 - timedelta(days=1), created_at=T0, updated_at=T0,
                    stripe_customer_id="cus_A")
        with engine.begin() as conn:
            conn.execute(insert(T), [dict(base, idempotency_key=f"old{i}")
                                     for i in range(20_000)])
        add(engine, 3)
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE")
        captured: list[tuple[str, Any]] = []

        def capture(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
                    executemany: bool) -> None:
            if statement.lstrip().upper().startswith("UPDATE STRIPE_USAGE_OUTBOX SET STATUS"):
                captured.append((statement, parameters))

        event.listen(engine, "before_cursor_execute", capture)
        try:
            assert len(claim(engine, at(1), limit=10).events) == 3
        finally:
            event.remove(engine, "before_cursor_execute", capture)
        assert len(captured) == 1
        statement, parameters = captured[0]
        with engine.connect() as conn:
            plan = [str(r[-1]) for r in conn.exec_driver_sql(
                "EXPLAIN QUERY PLAN " + statement, parameters)]
            conn.rollback()
        outbox = [line for line in plan if "stripe_usage_outbox" in line]
        assert outbox, plan
        for line in outbox:
            # a scan of the partial index reads claimable rows only; anything else must be
            # an index search
            assert (line.startswith("SCAN stripe_usage_outbox USING INDEX ix_outbox_claimable")
                    or line.startswith("SEARCH stripe_usage_outbox USING")), plan
            assert "ix_outbox_claimable" in line or "PRIMARY KEY (rowid=?)" in line, plan
    finally:
        engine.dispose()


def test_claim_sql_uses_literal_status_predicates(engine: Engine) -> None:
    """The partial index's predicate must be provable from the query's text: the status
    filter is a literal in the SQL, not a bound parameter."""
    map_tenant(engine, "acme", "cus_A")
    add(engine, 1)
    seen: list[str] = []

    def capture(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", capture)
    try:
        claim(engine, at(1))
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    claim_sql = [s for s in seen if "SET status" in s]
    assert len(claim_sql) == 1
    assert "status IN ('pending', 'retrying')" in claim_sql[0]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM stripe_usage_outbox "
                                 "WHERE status = 'processing'")).scalar() == 1
