"""Issue 3, lanes: one call in flight per (Stripe customer, meter) across real worker processes on
PostgreSQL, different lanes in parallel, and a SIGKILLed worker's lane free again at once.

The fake counts a call that starts while another call of its lane is still in flight
(``overlaps()``); Stripe allows one concurrent call per customer per meter.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import make_settings, pg_schema_url, start_worker, wait_for, worker_env
from sqlalchemy import Engine, func, select, text
from sqlalchemy.orm import Session
from support.fake_stripe import FakeStripe

from webapp.db import make_engine
from webapp.models import DeliveryAttempt, OutboxEvent, utcnow
from webapp.outbox import enqueue_usage, operations
from webapp.worker import Drainer, gateway_from
from webapp.worker.lanes import lane_key, lane_locks

T = OutboxEvent.__table__
A = DeliveryAttempt.__table__
CUSTOMERS = {"t1": "cus_one", "t2": "cus_two", "t3": "cus_three"}
METERS = ("api_requests", "storage_gb")
LANES = [(c, m) for c in CUSTOMERS.values() for m in METERS]


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait(timeout=10)


def setup_lanes(engine: Engine, fake: FakeStripe) -> None:
    for meter in METERS:
        fake.add_meter(meter)
    for tenant, customer in CUSTOMERS.items():
        operations.set_tenant(engine, tenant, stripe_customer_id=customer, name=None, now=utcnow())


def enqueue_round_robin(engine: Engine, n: int, prefix: str,
                        lanes: list[tuple[str, str]] | None = None) -> dict[str, tuple[str, str]]:
    """``n`` events spread over the lanes in turn; returns key -> lane."""
    by_customer = {c: t for t, c in CUSTOMERS.items()}
    lanes = lanes or LANES
    out: dict[str, tuple[str, str]] = {}
    with Session(engine) as db, db.begin():
        for i in range(n):
            customer, meter = lanes[i % len(lanes)]
            key = f"{prefix}-{i}"
            enqueue_usage(db, tenant_id=by_customer[customer], quantity=i + 1,
                          idempotency_key=key, meter=meter)
            out[key] = (customer, meter)
    return out


def per_lane(fake: FakeStripe) -> Counter[tuple[str, str]]:
    return Counter((ev.customer, ev.event_name) for ev in fake.accepted().values())


def test_four_workers_never_overlap_a_lane_and_every_lane_progresses(
        pg_url: str, pg: Engine, fake_stripe: FakeStripe,
        workers: list[subprocess.Popen[bytes]], tmp_path: Path) -> None:
    setup_lanes(pg, fake_stripe)
    keys = enqueue_round_robin(pg, 600, "lane")
    fake_stripe.set_latency(0.05)
    env = worker_env(pg_url, fake_stripe.base_url, OUTBOX_BATCH_SIZE="20",
                     OUTBOX_CONCURRENCY="4")
    for i in range(4):
        workers.append(start_worker(env, tmp_path / f"worker{i}.log"))

    wait_for(lambda: fake_stripe.accept_count() >= 300, 60, message="half the events sent")
    halfway = per_lane(fake_stripe)
    # Every lane is moving, none is starved while others run ahead (100 events per lane).
    assert set(halfway) == set(LANES)
    assert min(halfway.values()) >= 15, halfway

    def all_sent() -> bool:
        with pg.connect() as conn:
            counts = dict(conn.execute(select(T.c.status, func.count())
                                       .group_by(T.c.status)).all())
        return counts == {"sent": len(keys)}

    wait_for(all_sent, 60, message="all events sent and recorded")
    assert fake_stripe.overlaps() == {}
    with pg.connect() as conn:
        senders = conn.execute(select(func.count(func.distinct(A.c.worker)))
                               .where(A.c.outcome == "delivered")).scalar_one()
    # The guarantee was under real pressure: lanes in parallel, several processes sending.
    assert fake_stripe.max_in_flight() >= 3
    assert senders >= 2
    assert set(fake_stripe.accepted()) == set(keys)
    assert fake_stripe.duplicate_identifier_rejections() == 0
    assert all(p.poll() is None for p in workers), "a worker died"


def test_a_sigkilled_workers_lane_is_free_at_once(
        pg_url: str, pg: Engine, fake_stripe: FakeStripe,
        workers: list[subprocess.Popen[bytes]], tmp_path: Path) -> None:
    setup_lanes(pg, fake_stripe)
    lane = LANES[0]
    keys = enqueue_round_robin(pg, 30, "kill", lanes=[lane])
    fake_stripe.set_latency(2.0)
    # A claim long enough that a busy machine's new worker, started after the kill, still
    # sends before it: the lane is what must be free at once, not the dead claims.
    env = worker_env(pg_url, fake_stripe.base_url, OUTBOX_BATCH_SIZE="2",
                     OUTBOX_CONCURRENCY="2", OUTBOX_CLAIM_TIMEOUT_SECONDS="180")
    victim = start_worker(env, tmp_path / "victim.log")
    workers.append(victim)

    def in_flight() -> list[dict[str, Any]]:
        return [e for e in fake_stripe.request_log() if e["ended"] is None and e["lane"] == lane]

    wait_for(lambda: bool(in_flight()), 30, interval=0.02, message="a call in flight")
    [call] = in_flight()
    # The victim holds the lane: nobody else can take it.
    probe = lane_locks(pg)
    try:
        assert probe.acquire([lane]) == set()
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=10)
        killed_at = time.monotonic()
        wait_for(lambda: probe.acquire([lane]) == {lane}, 5, interval=0.02,
                 message="the lane's advisory lock to be free after SIGKILL")
        freed_after = time.monotonic() - killed_at
        probe.release([lane])
    finally:
        probe.close()
    assert freed_after < 5.0

    # The victim's claimed rows wait for their claim deadline; the lane does not. It held the
    # batch it was sending and, claimed ahead (a backlog), the next one: two batches of 2.
    with pg.connect() as conn:
        held = conn.execute(select(T.c.idempotency_key, T.c.processing_deadline_at)
                            .where(T.c.status == "processing")).all()
    assert call["identifier"] in {k for k, _ in held} and 1 <= len(held) <= 4
    deadline = min(d for _, d in held)

    # Let the dead worker's call finish on Stripe's side before another call of the lane starts
    # (Stripe would still be executing it), then a fresh worker sends the lane's other events.
    wait_for(lambda: not in_flight(), 10, interval=0.02, message="the killed call to end")
    fake_stripe.set_latency(0.01)
    workers.append(start_worker(env, tmp_path / "rescuer.log"))
    others = set(keys) - {k for k, _ in held}
    wait_for(lambda: others <= set(fake_stripe.accepted()), 90,
             message="the lane's other events sent by another worker")
    assert utcnow() < deadline, "should have gone out well before the dead claim's deadline"
    with pg.connect() as conn:
        still = conn.execute(select(T.c.status).where(
            T.c.idempotency_key.in_([k for k, _ in held]))).scalars().all()
    assert still == ["processing"] * len(held)
    assert fake_stripe.overlaps() == {}


def test_one_process_sends_lanes_in_parallel_one_call_per_lane(
        engine: Engine, db_url: str, fake_stripe: FakeStripe) -> None:
    """In one process (the guarantee SQLite relies on): OUTBOX_CONCURRENCY calls at a time,
    never two of one lane."""
    setup_lanes(engine, fake_stripe)
    keys = enqueue_round_robin(engine, 120, "one")
    fake_stripe.set_latency(0.02)
    settings = make_settings(db_url, stripe_api_base=fake_stripe.base_url, concurrency=4)
    drainer = Drainer(engine, settings, gateway_from(settings))
    try:
        wait_for(lambda: drainer.drain_once() is not None
                 and fake_stripe.accept_count() == len(keys), 60, interval=0.01,
                 message="all sent")
    finally:
        drainer.close()
    assert fake_stripe.overlaps() == {}
    assert 2 <= fake_stripe.max_in_flight() <= 4


def test_a_lane_busy_in_another_process_is_skipped_not_waited_on(
        pg: Engine, pg_url: str, fake_stripe: FakeStripe) -> None:
    setup_lanes(pg, fake_stripe)
    busy, free = LANES[0], LANES[1]
    keys = enqueue_round_robin(pg, 10, "skip", lanes=[busy, free])
    other = lane_locks(pg)  # stands for another worker, mid-call on ``busy``
    settings = make_settings(pg_url, stripe_api_base=fake_stripe.base_url)
    drainer = Drainer(pg, settings, gateway_from(settings))
    try:
        assert other.acquire([busy]) == {busy}
        summary = drainer.drain_once()
        assert summary.claimed == 10 and summary.sent == 5 and summary.released == 5
        assert summary.duration_ms < 3000
        assert {k for k, lane in keys.items() if lane == free} == set(fake_stripe.accepted())
        with pg.connect() as conn:
            waiting = conn.execute(select(T.c.status, T.c.attempt_count, T.c.call_count)
                                   .where(T.c.status != "sent")).all()
        assert waiting == [("pending", 0, 0)] * 5  # released untouched, for later
        other.release([busy])
        wait_for(lambda: drainer.drain_once() is not None
                 and fake_stripe.accept_count() == len(keys), 15, message="the rest sent")
    finally:
        other.close()
        drainer.close()



def test_lanes_of_two_outboxes_in_one_database_are_apart(pg: Engine) -> None:
    """Advisory locks belong to the database; an outbox in another schema of it (a second
    deployment, a staging copy) has lanes of its own and never makes this one skip. The
    usual ``public`` schema keeps the keys earlier versions used (a rolling upgrade)."""
    public = make_engine(pg_schema_url("public"))
    here, again, elsewhere = lane_locks(pg), lane_locks(pg), lane_locks(public)
    lane = LANES[0]
    try:
        assert here.acquire([lane]) == {lane}
        assert again.acquire([lane]) == set()          # the same outbox: busy
        assert elsewhere.acquire([lane]) == {lane}     # another schema's outbox: its own lane
        here.release([lane])
        assert again.acquire([lane]) == {lane}
        with public.connect() as conn:
            held = conn.execute(text(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND ((classid::bigint << 32) | objid::bigint) = :k AND objsubid = 1"),
                {"k": lane_key(lane)}).scalar_one()
        assert held == 1  # public's lock is the key without a schema
    finally:
        for locks in (here, again, elsewhere):
            locks.close()
        public.dispose()
