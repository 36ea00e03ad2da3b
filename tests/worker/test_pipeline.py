"""The worker loop on PostgreSQL claims the next batch while it sends the current one
(``run_drainer``, pipelined). A batch claimed ahead must never outlive the reason to send it:
it goes back to the queue, untouched, when the worker stops or when its current batch met a
systemic answer. A real ``run_drainer`` in a thread, against the fake over the real SDK."""

from __future__ import annotations

import threading
from unittest.mock import patch

from conftest import make_settings, wait_for
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session
from support.fake_stripe import FakeStripe

from webapp.models import DeliveryAttempt, OutboxEvent, utcnow
from webapp.outbox import enqueue_usage, operations
from webapp.outbox.control import pause_state
from webapp.worker import Drainer, gateway_from, run_drainer

T = OutboxEvent.__table__
A = DeliveryAttempt.__table__
BATCH = 5
EVENTS = 40


def start(pg: Engine, pg_url: str, fake: FakeStripe) -> tuple[Drainer, threading.Thread]:
    for i in range(EVENTS // BATCH):
        operations.set_tenant(pg, f"t{i}", stripe_customer_id=f"cus_{i}", name=None, now=utcnow())
    with Session(pg) as db, db.begin():
        for i in range(EVENTS):
            enqueue_usage(db, tenant_id=f"t{i % (EVENTS // BATCH)}", quantity=i + 1,
                          idempotency_key=f"pipe-{i}")
    settings = make_settings(pg_url, stripe_api_base=fake.base_url, batch_size=BATCH,
                             concurrency=1)
    drainer = Drainer(pg, settings, gateway_from(settings))
    assert drainer.pipelined and drainer.meters is not None
    drainer.meters.active()  # a worker reads Stripe's meters as it starts
    thread = threading.Thread(target=run_drainer, args=(drainer,), name="drainer", daemon=True)
    thread.start()
    return drainer, thread


def stop(drainer: Drainer, thread: threading.Thread) -> None:
    drainer.request_stop()
    thread.join(timeout=30)
    assert not thread.is_alive()


def counts(pg: Engine) -> dict[str, int]:
    with pg.connect() as conn:
        return dict(conn.execute(select(T.c.status, func.count()).group_by(T.c.status)).all())


def test_stopping_releases_the_batch_claimed_ahead(pg_url: str, pg: Engine,
                                                   fake_stripe: FakeStripe) -> None:
    fake_stripe.set_latency(0.3)
    drainer, thread = start(pg, pg_url, fake_stripe)
    try:
        # One batch being sent, the next one claimed ahead: two batches held.
        wait_for(lambda: counts(pg).get("processing", 0) == 2 * BATCH, 10, interval=0.02,
                 message="a batch in flight and one claimed ahead")
    finally:
        stop(drainer, thread)
    after = counts(pg)
    assert "processing" not in after, after
    assert after.get("sent", 0) + after.get("pending", 0) == EVENTS
    assert after.get("sent", 0) == fake_stripe.accept_count() < EVENTS
    with pg.connect() as conn:
        # What was released was never called: no attempt, nothing spent.
        untouched = conn.execute(select(func.count()).where(
            T.c.status == "pending", T.c.call_count == 0, T.c.attempt_count == 0,
            T.c.claim_token.is_(None), T.c.claimed_by.is_(None))).scalar_one()
    assert untouched == after.get("pending", 0) > 0


def test_a_systemic_answer_releases_the_batch_claimed_ahead(pg_url: str, pg: Engine,
                                                            fake_stripe: FakeStripe) -> None:
    fake_stripe.set_latency(0.2)  # the next batch is claimed ahead while this call runs
    with patch(f"{__name__}.run_drainer"):   # start, meters read, not running yet
        drainer, thread = start(pg, pg_url, fake_stripe)
        thread.join()
    fake_stripe.set_auth_failure(401)
    thread = threading.Thread(target=run_drainer, args=(drainer,), name="drainer", daemon=True)
    thread.start()
    try:
        # The first call is in flight and the next batch is already claimed…
        wait_for(lambda: counts(pg).get("processing", 0) == 2 * BATCH, 10, interval=0.01,
                 message="a batch in flight and one claimed ahead")

        def paused() -> bool:
            with pg.connect() as conn:
                return pause_state(conn).paused
        # … then the 401 pauses sending for every worker.
        wait_for(paused, 10, interval=0.02, message="sending paused by the 401")
        wait_for(lambda: "processing" not in counts(pg), 10, interval=0.02,
                 message="both batches back in the queue")
    finally:
        stop(drainer, thread)
    # One call: the 401 aborted its own batch, and the batch claimed ahead was released
    # instead of being sent into the pause.
    assert fake_stripe.calls() == 1
    assert counts(pg) == {"pending": EVENTS}
    with pg.connect() as conn:
        assert conn.execute(select(func.count()).select_from(A)).scalar_one() == 1
        assert conn.execute(select(func.max(T.c.call_count))).scalar_one() == 0
        assert conn.execute(select(func.count()).where(T.c.claim_token.is_not(None))
                            ).scalar_one() == 0
