"""What a delivered call leaves on the event and its attempt rows."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from webapp.config import Settings
from webapp.models import DeliveryAttempt, OutboxEvent, utcnow
from webapp.outbox import enqueue_usage
from webapp.outbox.operations import set_tenant
from webapp.worker import Drainer


def test_delivery_records_request_id_and_clears_the_last_error(
        engine: Engine, settings: Settings, fake_stripe: Any) -> None:
    set_tenant(engine, "acme", stripe_customer_id="cus_acme", name=None, now=utcnow())
    with Session(engine) as db, db.begin():
        event_id = enqueue_usage(db, tenant_id="acme", quantity=2, idempotency_key="gw-1").id
    fake_stripe.fail_next("503")
    drainer = Drainer(engine, settings)
    try:
        drainer.drain_once()
        with Session(engine) as db:
            ev = db.get(OutboxEvent, event_id)
            assert ev is not None and ev.status == "retrying"
            assert ev.last_http_status == 503 and ev.last_request_id
        with engine.begin() as conn:  # due now
            conn.execute(OutboxEvent.__table__.update().values(next_attempt_at=utcnow()))
        drainer.drain_once()
    finally:
        drainer.close()
    with Session(engine) as db:
        ev = db.get(OutboxEvent, event_id)
        assert ev is not None and ev.status == "sent"
        assert (ev.last_error_class, ev.last_error_code, ev.last_http_status,
                ev.last_error_message, ev.last_request_id) == (None, None, None, None, None)
        attempts = db.scalars(select(DeliveryAttempt).where(DeliveryAttempt.event_id == event_id)
                              .order_by(DeliveryAttempt.id)).all()
    assert [a.outcome for a in attempts] == ["not_executed", "delivered"]
    delivered = attempts[-1]
    logged = {r["request_id"] for r in fake_stripe.request_log() if r.get("status") == 200}
    assert delivered.stripe_request_id in logged


def test_the_sdk_client_telemetry_header_is_not_sent(fake_stripe: Any) -> None:
    """The gateway turns the SDK's client telemetry off: no call carries the previous
    call's latency to Stripe (it was several percent of the worker's CPU per call)."""
    from datetime import timedelta

    from webapp.stripe_gateway import MeterEvent, StripeGateway

    fake_stripe.add_meter("api_requests")
    gateway = StripeGateway("sk_test_telemetry", api_base=fake_stripe.base_url,
                            timeout_seconds=5)
    at = utcnow() - timedelta(minutes=1)
    for i in range(3):
        result = gateway.send(MeterEvent("api_requests", "cus_t", 1, f"tel-{i}", at),
                              f"tel-{i}:0")
        assert result.http_status == 200
    log = fake_stripe.request_log()
    assert len(log) == 3 and not any(entry["client_telemetry"] for entry in log)
