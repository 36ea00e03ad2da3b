"""Switching ``STRIPE_METER_EVENT_API`` on a live backlog, with real worker processes: a v1
worker stopped mid-backlog, a v2_stream worker after it, then v1 again, while the fake loses
answers and fails requests. Nothing is lost and nothing is doubled: both APIs send the same
identifier per event, and Stripe (the fake) takes an identifier once whichever API it came by.
On SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import start_worker, stop_process, wait_for, worker_env
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session
from support.fake_stripe import FakeStripe

from webapp.models import OutboxEvent, utcnow
from webapp.outbox import enqueue_usage, operations

pytestmark = pytest.mark.slow

T = OutboxEvent.__table__
EVENTS = 600
CUSTOMERS = [f"cus_switch{i}" for i in range(6)]


def sent(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).where(T.c.status == "sent")).scalar_one())


@pytest.fixture
def backlog(engine: Engine) -> Iterator[dict[str, tuple[str, int]]]:
    for i, customer in enumerate(CUSTOMERS):
        operations.set_tenant(engine, f"t{i}", stripe_customer_id=customer, name=None,
                              now=utcnow())
    committed: dict[str, tuple[str, int]] = {}
    with Session(engine) as db, db.begin():
        for i in range(EVENTS):
            key = f"sw-{i}"
            enqueue_usage(db, tenant_id=f"t{i % len(CUSTOMERS)}", quantity=i + 1,
                          idempotency_key=key, meter="api_requests")
            committed[key] = (CUSTOMERS[i % len(CUSTOMERS)], i + 1)
    yield committed


def test_switching_a_live_backlog_v1_v2_v1_loses_and_doubles_nothing(
        db_url: str, engine: Engine, fake_stripe: FakeStripe, backlog: dict[str, Any],
        tmp_path: Path) -> None:
    fake_stripe.set_latency(0.01)
    # Lost answers after applying, and 5xx half of them applied: the next worker, in the
    # other mode, resends those events with the same identifiers.
    fake_stripe.set_faults(drop_response_rate=0.05, error_5xx_rate=0.05,
                           apply_before_5xx_rate=0.5)
    base = worker_env(db_url, fake_stripe.base_url, fake_stripe.meter_events_url,
                      OUTBOX_BATCH_SIZE="30",
                      OUTBOX_CONCURRENCY="4")
    stages = [("v1", EVENTS // 4), ("v2_stream", EVENTS // 2), ("v1", EVENTS)]
    for n, (api, until) in enumerate(stages):
        proc = start_worker(dict(base, STRIPE_METER_EVENT_API=api), tmp_path / f"w{n}.log")
        try:
            wait_for(lambda u=until: sent(engine) >= u or proc.poll() is not None, 60,
                     interval=0.02, message=f"{until} events sent ({api})")
            if until == EVENTS:
                fake_stripe.set_faults()
                wait_for(lambda: sent(engine) == EVENTS, 60, interval=0.1,
                         message="every event sent")
        finally:
            code = stop_process(proc)
        assert code == 0, (tmp_path / f"w{n}.log").read_text()[-3000:]

    accepted = fake_stripe.accepted()
    assert {k: (a.customer, int(a.value)) for k, a in accepted.items()} == backlog
    assert fake_stripe.accept_count() == EVENTS
    assert fake_stripe.overlaps() == {}
    # Each mode really sent part of the backlog.
    assert fake_stripe.calls() > 0 and fake_stripe.stream_calls() > 0
    stream_ids = {i for e in fake_stripe.stream_log() if e["status"] == 200
                  for i in e["identifiers"]}
    v1_ids = {e["identifier"] for e in fake_stripe.request_log() if e["status"] == 200}
    assert stream_ids and v1_ids and stream_ids | v1_ids <= set(backlog)
