"""Lane shards on PostgreSQL: draining workers split the lanes between them, so that with a
backlog they claim disjoint lanes instead of claiming each other's and releasing them.

Ownership is a preference of the claim only (lane locks still decide who sends), so these
tests check the split itself, the claim's order of preference, and that a worker which is
short of its share, or whose shards ran dry, still never leaves events unclaimed.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import _pg_database, make_settings, start_worker, wait_for, worker_env
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session
from support.fake_stripe import FakeStripe

from webapp.db import make_engine
from webapp.models import OutboxEvent, utcnow
from webapp.outbox import claims, enqueue_usage, operations
from webapp.outbox.claims import SHARDS
from webapp.worker import Drainer, gateway_from
from webapp.worker import shards as shards_module
from webapp.worker.lanes import LaneLocks, lane_locks
from webapp.worker.shards import ShardView, shard_space

T = OutboxEvent.__table__
METER = "api_requests"


@pytest.fixture
def no_throttle(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rebalance at every call, so a test can step workers through it."""
    monkeypatch.setattr(shards_module, "REBALANCE_SECONDS", 0.0)


@pytest.fixture
def locks(pg: Engine) -> Iterator[list[LaneLocks]]:
    made: list[LaneLocks] = []
    yield made
    for lk in made:
        lk.close()


def worker(pg: Engine, made: list[LaneLocks]) -> LaneLocks:
    lk = lane_locks(pg)
    made.append(lk)
    return lk


def step(*workers: LaneLocks, rounds: int = 3) -> list[ShardView]:
    views: list[ShardView] = []
    for _ in range(rounds):
        views = [w.shard_view() for w in workers]
    return views


def shard_of(pg: Engine, customer: str, meter: str = METER) -> int:
    """The lane's shard as the claim computes it."""
    with pg.connect() as conn:
        return int(conn.execute(text(
            f"SELECT hashtextextended(:c || chr(31) || :m, 0) & {SHARDS - 1}"),
            {"c": customer, "m": meter}).scalar_one())


def lanes_in_distinct_shards(pg: Engine, n: int) -> dict[str, int]:
    """``n`` customers whose lanes (with METER) fall into ``n`` different shards."""
    out: dict[str, int] = {}
    i = 0
    while len(out) < n:
        customer = f"cus_shard{i}"
        shard = shard_of(pg, customer)
        if shard not in out.values():
            out[customer] = shard
        i += 1
    return out


def enqueue(pg: Engine, customers: dict[str, int], per_lane: int) -> None:
    for customer in customers:
        operations.set_tenant(pg, f"t-{customer}", stripe_customer_id=customer, name=None,
                       now=utcnow())
    with Session(pg) as db, db.begin():
        for i in range(per_lane):
            for customer in customers:
                enqueue_usage(db, tenant_id=f"t-{customer}", quantity=1, meter=METER,
                              idempotency_key=f"{customer}-{i}")


def claim(pg: Engine, limit: int, view: ShardView) -> list[claims.ClaimedEvent]:
    return claims.claim_batch(pg, worker="w", limit=limit, now=utcnow(),
                             claim_timeout_seconds=60, skip_shards=view.skip,
                             fill_from_skipped=view.fill).events


def test_workers_split_the_shards_and_take_over_a_leavers(
        pg: Engine, locks: list[LaneLocks], no_throttle: None) -> None:
    a = worker(pg, locks)
    [alone] = step(a)
    assert a.shards() == set(range(SHARDS)) and alone == ShardView((), True)

    b = worker(pg, locks)
    va, vb = step(a, b)
    assert len(a.shards()) == len(b.shards()) == SHARDS // 2
    assert a.shards() | b.shards() == set(range(SHARDS))
    assert set(va.skip) == b.shards() and set(vb.skip) == a.shards()

    c = worker(pg, locks)
    views = step(a, b, c)
    # 64 over 3: 22, 21, 21, every worker at its share (none left to fill from the others).
    assert sorted(len(w.shards()) for w in (a, b, c)) == [21, 21, 22]
    assert all(v.fill for v in views)
    assert not (a.shards() & b.shards() or a.shards() & c.shards() or b.shards() & c.shards())

    # A worker that stops draining (its breaker opened) is no longer counted.
    assert c.shard_view(draining=False) == ShardView()
    assert c.shards() == set()
    step(a, b)
    assert a.shards() | b.shards() == set(range(SHARDS))

    # A worker that goes away loses its shards with its connection (as the server ends it).
    b.close()
    wait_for(lambda: (a.shard_view(), a.shards())[1] == set(range(SHARDS)), 10,
             interval=0.02, message="a to take b's shards")


def test_nine_workers_each_get_a_share(pg: Engine, locks: list[LaneLocks],
                                       no_throttle: None) -> None:
    fleet = [worker(pg, locks) for _ in range(9)]
    step(*fleet)
    views = step(*fleet, rounds=1)
    assert sorted(len(w.shards()) for w in fleet) == [7] * 8 + [8]
    assert all(v.fill for v in views)


def test_a_silent_owners_shards_are_claimed_by_the_others(
        pg: Engine, locks: list[LaneLocks], no_throttle: None,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    a, b = worker(pg, locks), worker(pg, locks)
    step(a, b)
    assert len(a.shards()) == len(b.shards()) == SHARDS // 2
    # a's drain loop is stuck: its lock connection runs nothing more.
    monkeypatch.setattr(shards_module, "STALE_OWNER_SECONDS", 0.3)
    time.sleep(0.5)
    view = b.shard_view()
    assert len(b.shards()) == SHARDS // 2        # a still holds its locks...
    assert view.skip == () and view.fill        # ...but b claims their events as its own
    b.shard_view()
    said = [r for r in caplog.records if "has not been heard from" in r.getMessage()]
    assert len(said) == 1  # once, not at every rebalance


def test_the_lock_connection_asks_the_server_to_notice_a_silent_peer(
        pg: Engine, locks: list[LaneLocks]) -> None:
    a = worker(pg, locks)
    a.shard_view()
    conn = a._connection()
    assert conn.execute(text("SHOW tcp_keepalives_idle")).scalar_one() in ("30", "30s")


def test_a_joiner_waits_for_its_share_before_taking_from_others(
        pg: Engine, locks: list[LaneLocks], no_throttle: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = worker(pg, locks), worker(pg, locks)
    step(a)
    assert len(a.shards()) == SHARDS
    view = b.shard_view()
    # Every shard is a's for now: b claims nothing of theirs until a gives some up...
    assert b.shards() == set() and len(view.skip) == SHARDS and view.fill is False
    a.shard_view()
    view = b.shard_view()
    assert len(b.shards()) == SHARDS // 2 and view.fill is True
    # ...or until it has been short of its share for SHORT_OF_SHARE_SECONDS (a stuck owner).
    c = worker(pg, locks)
    assert c.shard_view().fill is False
    monkeypatch.setattr(shards_module, "SHORT_OF_SHARE_SECONDS", 0.0)
    assert c.shard_view().fill is True


def test_each_schema_has_shards_of_its_own(pg: Engine, locks: list[LaneLocks],
                                           no_throttle: None) -> None:
    schemas = _pg_database()
    other = make_engine(next(schemas))
    try:
        a, b = worker(pg, locks), worker(other, locks)
        step(a, b)
        assert len(a.shards()) == len(b.shards()) == SHARDS
    finally:
        for lk in locks:
            lk.close()
        other.dispose()
        schemas.close()  # drops the second schema


def test_the_claim_prefers_lanes_no_other_worker_owns(pg: Engine) -> None:
    customers = lanes_in_distinct_shards(pg, 4)
    enqueue(pg, customers, per_lane=5)
    mine = list(customers)[:2]
    skip = tuple(k for k in range(SHARDS) if k not in {customers[c] for c in mine})

    # The events of others' shards come first in the queue, yet they are left to them...
    got = claim(pg, 6, ShardView(skip, fill=True))
    assert {e.stripe_customer_id for e in got} == set(mine) and len(got) == 6
    # ...until there is not enough else: then the batch is filled from them, oldest first.
    got = claim(pg, 10, ShardView(skip, fill=True))
    assert len(got) == 10
    assert sum(e.stripe_customer_id in mine for e in got) == 4
    # While waiting for its share, a worker does not fill from them.
    assert claim(pg, 10, ShardView(skip, fill=False)) == []
    everything = tuple(range(SHARDS))
    assert claim(pg, 10, ShardView(everything, fill=False)) == []
    assert len(claim(pg, 1, ShardView(everything, fill=True))) == 1
    rest = claim(pg, 100, ShardView(skip, fill=True))
    assert len(rest) == 20 - 17
    with pg.connect() as conn:
        assert conn.execute(select(T.c.status).distinct()).scalars().all() == ["processing"]


def test_a_joiner_waits_for_its_share_and_a_one_off_drain_does_not(
        pg_url: str, pg: Engine, fake_stripe: FakeStripe, locks: list[LaneLocks],
        no_throttle: None) -> None:
    fake_stripe.add_meter(METER)
    enqueue(pg, lanes_in_distinct_shards(pg, 3), per_lane=2)
    owner = worker(pg, locks)
    step(owner)  # a running worker holds every shard
    settings = make_settings(pg_url, stripe_api_base=fake_stripe.base_url)
    joiner = Drainer(pg, settings, gateway_from(settings))
    once = Drainer(pg, settings, gateway_from(settings))
    once.shards = False  # as the ``drain`` command sets it
    try:
        summary = joiner.drain_once()
        assert summary.claimed == 0 and summary.skipped is None
        assert once.drain_once().sent == 6
        assert once.lanes.shards() == set()
    finally:
        joiner.close()
        once.close()


def test_two_workers_with_a_backlog_release_almost_nothing(
        pg_url: str, pg: Engine, fake_stripe: FakeStripe, tmp_path: Path) -> None:
    """Two worker processes, 40 lanes, 2,000 events: each drains its own lanes, and only the
    last batches, once one worker's lanes ran dry, meet the other's. Without the shards each
    batch held lanes of the other's and events were claimed and released again and again
    (seen here: several thousand releases for these 2,000 events)."""
    fake_stripe.add_meter(METER)
    customers = lanes_in_distinct_shards(pg, 40)
    enqueue(pg, customers, per_lane=50)
    operations.pause(pg, actor="test", reason="workers starting", now=utcnow())
    env = worker_env(pg_url, fake_stripe.base_url, OUTBOX_BATCH_SIZE="200",
                     OUTBOX_CONCURRENCY="16")
    fake_stripe.set_latency(0.01)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs = [start_worker(env, tmp_path / f"w{i}.log") for i in range(2)]
        with pg.connect() as conn:
            # Paused, they count each other and split the shards: 32 each.
            schema = conn.execute(text("SELECT current_schema()")).scalar_one()
            wait_for(lambda: conn.execute(text(
                "SELECT array_agg(n) FROM (SELECT count(*) AS n FROM pg_locks "
                "WHERE locktype = 'advisory' AND objsubid = 2 AND objid < :shards "
                "AND classid = CAST(:space AS oid) AND database = (SELECT oid FROM "
                "pg_database WHERE datname = current_database()) GROUP BY pid) AS held"),
                {"shards": SHARDS, "space": shard_space(schema)}).scalar_one() == [32, 32],
                30, message="the shards split between the workers")
        operations.resume(pg, actor="test", now=utcnow())
        wait_for(lambda: fake_stripe.accept_count() == 2000, 120, message="all sent")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
    released = sum(_released(tmp_path / f"w{i}.log") for i in range(2))
    sent_by = [_sent(tmp_path / f"w{i}.log") for i in range(2)]
    assert fake_stripe.overlaps() == {}
    assert sum(sent_by) == 2000 and min(sent_by) >= 500, sent_by
    assert released < 600, released


def _summaries(path: Path) -> list[dict[str, Any]]:
    import ast
    out = []
    for line in path.read_text().splitlines():
        if "drained: {" in line:
            out.append(ast.literal_eval(line.split("drained: ", 1)[1]))
    return out


def _released(path: Path) -> int:
    return sum(s["released"] for s in _summaries(path))


def _sent(path: Path) -> int:
    return sum(s["sent"] for s in _summaries(path))
