"""What a delivered call leaves on the event and its attempt rows."""

from __future__ import annotations

import json
from typing import Any

import stripe
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from webapp.config import Settings
from webapp.models import DeliveryAttempt, OutboxEvent, utcnow
from webapp.outbox import enqueue_usage
from webapp.outbox.operations import set_tenant
from webapp.worker import Drainer, gateway_from


def test_delivery_records_request_id_and_clears_the_last_error(
        engine: Engine, settings: Settings, fake_stripe: Any) -> None:
    set_tenant(engine, "acme", stripe_customer_id="cus_acme", name=None, now=utcnow())
    with Session(engine) as db, db.begin():
        event_id = enqueue_usage(db, tenant_id="acme", quantity=2, idempotency_key="gw-1").id
    fake_stripe.fail_next("503")
    drainer = Drainer(engine, settings, gateway_from(settings))
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

    from webapp.stripe_gateway import MeterEvent, SdkGateway

    fake_stripe.add_meter("api_requests")
    gateway = SdkGateway("sk_test_telemetry", api_base=fake_stripe.base_url,
                            timeout_seconds=5)
    at = utcnow() - timedelta(minutes=1)
    for i in range(3):
        result = gateway.send(MeterEvent("api_requests", "cus_t", 1, f"tel-{i}", at),
                              f"tel-{i}:0")
        assert result.http_status == 200
    log = fake_stripe.request_log()
    assert len(log) == 3 and not any(entry["client_telemetry"] for entry in log)


def test_a_meters_time_window_is_read_from_the_listing(fake_stripe: Any) -> None:
    """``event_time_window``: Stripe's text for a pre-aggregated meter, None for an ordinary
    one; such a meter is not one events may be sent to."""
    from webapp.stripe_gateway import SdkGateway

    fake_stripe.add_meter("seats", event_time_window="day")
    fake_stripe.add_meter("calls", event_time_window="hour", status="inactive")
    gateway = SdkGateway("sk_test_meters", api_base=fake_stripe.base_url, timeout_seconds=5)
    try:
        listed = {m.event_name: m for m in gateway.list_meters()}
    finally:
        gateway.close()
    assert {name: (m.status, m.event_time_window, m.active) for name, m in listed.items()} == {
        "api_requests": ("active", None, True), "seats": ("active", "day", False),
        "calls": ("inactive", "hour", False)}
    assert listed["seats"].kept_status == "pre_aggregated" and listed["seats"].pre_aggregated


# -- classifying Stripe's errors (stripe-python 16.1) -----------------------------------------

def _error(cls: type, status: int, code: str | None, message: str = "x") -> Any:

    body = {"error": {"type": "invalid_request_error", "message": message,
                      **({"code": code} if code else {})}}
    if cls is stripe.InvalidRequestError:  # (message, param, code, body, status, json, headers)
        return cls(message, None, code, json.dumps(body), status, body, {"Request-Id": "r"})
    return cls(message, json.dumps(body), status, body, {"Request-Id": "req_1"})


def test_the_code_is_read_from_the_error_object() -> None:
    """``exc.code`` is filled only for invalid-request errors; Stripe's code of a 429 (and of
    409, 401…) is on ``exc.error.code``."""
    from webapp.stripe_gateway import classify_error

    limited = classify_error(_error(stripe.RateLimitError, 429, "rate_limit"))
    assert (limited.outcome.value, limited.error_code) == ("not_executed", "rate_limit")
    in_use = classify_error(_error(stripe.APIError, 409, "idempotency_key_in_use"))
    assert (in_use.outcome.value, in_use.error_code) == ("not_executed",
                                                         "idempotency_key_in_use")


def test_a_rate_limit_answered_with_a_400_is_not_executed() -> None:
    from webapp.stripe_gateway import classify_error

    for exc in (_error(stripe.RateLimitError, 400, "rate_limit"),
                _error(stripe.InvalidRequestError, 400, "rate_limit")):
        assert classify_error(exc).outcome.value == "not_executed"
    other = classify_error(_error(stripe.InvalidRequestError, 400, "parameter_invalid_integer"))
    assert other.outcome.value == "permanent"


def test_no_such_meter_is_a_missing_meter_not_a_dead_event() -> None:
    from webapp.stripe_gateway import classify_error

    exc = _error(stripe.InvalidRequestError, 400, None,
                 "No active meter was found for event_name 'x'.")
    assert classify_error(exc).outcome.value == "meter_missing"


def test_a_cancel_returns_the_adjustments_status_and_id_as_stripe_answered(
        fake_stripe: Any) -> None:
    """Stripe's v1 adjustment carries a status and, as documented, no id: the answer then has
    none, and the call's request id; an id is passed on when the answer carries one. A
    refusal is classified like any call, with no status."""
    from datetime import timedelta

    from webapp.stripe_gateway import MeterEvent, SdkGateway

    fake_stripe.add_meter("api_requests")
    gateway = SdkGateway("sk_test_cancel", api_base=fake_stripe.base_url, timeout_seconds=5)
    at = utcnow() - timedelta(minutes=1)
    for i in range(2):
        assert gateway.send(MeterEvent("api_requests", "cus_c", 1, f"c-{i}", at),
                            f"c-{i}").http_status == 200
    plain = gateway.cancel_meter_event("api_requests", "c-0")
    fake_stripe.answer_adjustments(status="complete", ids=True)
    with_id = gateway.cancel_meter_event("api_requests", "c-1")
    refused = gateway.cancel_meter_event("api_requests", "never-sent")
    first, second = fake_stripe.adjustments()
    assert (plain.call.outcome.value, plain.status, plain.adjustment_id) == (
        "delivered", "pending", None)
    assert plain.call.request_id == first["request_id"]
    assert (with_id.status, with_id.adjustment_id) == ("complete", second["id"])
    assert second["id"].startswith("mea_") and with_id.call.request_id == second["request_id"]
    assert (refused.call.outcome.value, refused.call.http_status, refused.status,
            refused.adjustment_id) == ("permanent", 400, None, None)
