"""Issue 3, graceful stop: SIGTERM to a real ``billing-outbox worker`` in the middle of a busy
drain. It stops claiming, finishes its in-flight calls, records their outcomes, releases every
other claim so it is claimable at once (not after the claim deadline), and exits 0 within the
HTTP timeout. Both backends.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from conftest import start_worker, wait_for, worker_env
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session
from support.fake_stripe import FakeStripe

from webapp.config import CONNECT_TIMEOUT_SECONDS
from webapp.models import OutboxEvent, utcnow
from webapp.outbox import claims, enqueue_usage, operations

T = OutboxEvent.__table__
TIMEOUT = 5.0  # STRIPE_TIMEOUT_SECONDS in worker_env
CLAIM_TIMEOUT = 30.0  # OUTBOX_CLAIM_TIMEOUT_SECONDS in worker_env


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    made: list[subprocess.Popen[bytes]] = []
    yield made
    for p in made:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)


def test_sigterm_during_a_busy_drain(engine: Engine, db_url: str, fake_stripe: FakeStripe,
                                     procs: list[subprocess.Popen[bytes]],
                                     tmp_path: Path) -> None:
    for i in range(6):
        operations.set_tenant(engine, f"t{i}", stripe_customer_id=f"cus_{i}",
                              name=None, now=utcnow())
    keys = []
    with Session(engine) as db, db.begin():
        for i in range(240):
            key = f"stop-{i}"
            enqueue_usage(db, tenant_id=f"t{i % 6}", quantity=i + 1, idempotency_key=key)
            keys.append(key)
    fake_stripe.set_latency(0.3)
    env = worker_env(db_url, fake_stripe.base_url, STRIPE_TIMEOUT_SECONDS=str(TIMEOUT),
                     OUTBOX_CLAIM_TIMEOUT_SECONDS=str(CLAIM_TIMEOUT), OUTBOX_CONCURRENCY="8")
    log_path = tmp_path / "worker.log"
    worker = start_worker(env, log_path)
    procs.append(worker)

    def busy() -> bool:
        in_flight = [e for e in fake_stripe.request_log() if e["ended"] is None]
        return fake_stripe.accept_count() >= 12 and len(in_flight) >= 3

    wait_for(busy, 30, interval=0.02, message="a busy drain with calls in flight")
    with engine.connect() as conn:
        claimed = conn.execute(select(func.count()).select_from(T)
                               .where(T.c.status == "processing")).scalar_one()
    assert claimed > 6  # it holds more than the calls in flight: those must be released
    worker.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    code = worker.wait(timeout=TIMEOUT + CONNECT_TIMEOUT_SECONDS + 10)
    took = time.monotonic() - signalled
    assert code == 0, log_path.read_text()[-3000:]
    assert took <= TIMEOUT + CONNECT_TIMEOUT_SECONDS + 3, took
    assert "stopped" in log_path.read_text()

    # Every call that went out has its outcome recorded; nothing is left processing.
    now = utcnow()
    with engine.connect() as conn:
        rows = conn.execute(select(T.c.idempotency_key, T.c.status, T.c.processing_deadline_at,
                                   T.c.claim_token, T.c.next_attempt_at)).all()
    by_status: dict[str, set[str]] = {}
    for r in rows:
        by_status.setdefault(r.status, set()).add(r.idempotency_key)
    assert "processing" not in by_status
    assert by_status["sent"] == set(fake_stripe.accepted())
    left = [r for r in rows if r.status != "sent"]
    assert left, "the test needs events left over"
    assert {r.status for r in left} <= {"pending", "retrying"}
    assert all(r.processing_deadline_at is None and r.claim_token is None for r in left)
    # Claimable at once: due within a poll interval, not after the 30 s claim deadline.
    assert all(r.next_attempt_at <= now + timedelta(seconds=1) for r in left)
    claim = claims.claim_batch(engine, worker="test", limit=10_000,
                              now=utcnow() + timedelta(seconds=1), claim_timeout_seconds=60)
    assert {e.identifier for e in claim.events} == {r.idempotency_key for r in left}
    claims.release(engine, claim.token, [e.id for e in claim.events], now=utcnow())

    # A new worker finishes the job; Stripe has every event exactly once.
    fake_stripe.set_latency(0.0)
    procs.append(start_worker(env, tmp_path / "worker2.log"))
    wait_for(lambda: fake_stripe.accept_count() == len(keys), 60, message="all sent")
    assert set(fake_stripe.accepted()) == set(keys)
    assert fake_stripe.duplicate_identifier_rejections() == 0
    assert fake_stripe.overlaps() == {}
