"""Pins ``FakeStripe.poison`` and the poisoned listings through the real stripe SDK: what
the SDK hands the outbox when Stripe's answers carry hostile values (a 300-character code, a
400-character request id, a 5,000-character message with emoji, a NUL, a lone surrogate)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import stripe

from support.fake_stripe import AsyncError, FakeStripe

API_KEY = "sk_test_fake_0123456789abcdef"
CODE = "code_" + "c" * 295
REQUEST_ID = "req_" + "r" * 396
MESSAGE = ("bad 😀 \x00 \ud800 " + "m" * 5000)[:5000]


@pytest.fixture
def fake() -> Iterator[FakeStripe]:
    with FakeStripe() as f:
        yield f


@pytest.fixture
def client(fake: FakeStripe) -> Iterator[Any]:
    c = stripe.StripeClient(API_KEY, base_addresses={"api": fake.base_url,
                                                     "meter_events": fake.base_url},
                            max_network_retries=0,
                            http_client=stripe.RequestsClient(timeout=5))
    yield c
    c._requestor._client.close()


def send(client: Any, identifier: str) -> Any:
    return client.v1.billing.meter_events.create(
        params={"event_name": "api_requests", "identifier": identifier,
                "payload": {"stripe_customer_id": "cus_A", "value": "1"},
                "timestamp": int(time.time()) - 60},
        options={"idempotency_key": identifier})


@pytest.mark.parametrize(("fault", "error"), [
    ("400", stripe.InvalidRequestError), ("429", stripe.RateLimitError),
    ("500", stripe.APIError), ("503", stripe.APIError), ("401", stripe.AuthenticationError)])
def test_errors_carry_the_poison_and_keep_their_class(fake: FakeStripe, client: Any,
                                                      fault: str, error: type) -> None:
    fake.poison(code=CODE, request_id=REQUEST_ID, message=MESSAGE)
    fake.fail_next(fault)
    with pytest.raises(error) as caught:
        send(client, f"p-{fault}")
    exc = caught.value
    assert exc.http_status == int(fault) and exc.request_id == REQUEST_ID
    assert isinstance(exc.json_body, dict)
    assert exc.json_body["error"]["code"] == CODE
    assert exc.json_body["error"]["message"] == MESSAGE      # NUL and surrogate intact


def test_a_200_carries_the_poisoned_request_id_and_poison_off_is_plain(
        fake: FakeStripe, client: Any) -> None:
    fake.poison(request_id=REQUEST_ID)
    assert send(client, "p-ok").last_response.request_id == REQUEST_ID
    fake.poison()
    assert send(client, "p-ok-2").last_response.request_id.startswith("req_")
    fake.poison(code=CODE)
    fake.reset()
    fake.fail_next("400")
    with pytest.raises(stripe.InvalidRequestError) as caught:
        send(client, "p-reset")
    assert caught.value.code == "parameter_invalid"


def test_meters_and_reports_carry_what_they_are_given(fake: FakeStripe, client: Any) -> None:
    long_id = "mtr_" + "i" * 300
    fake.add_meter("odd", meter_id=long_id, display_name="D" * 400, customer_key="k" * 150)
    listed = {m.event_name: m for m in
              client.v1.billing.meters.list(params={"limit": 100}).auto_paging_iter()}
    assert listed["odd"].id == long_id and listed["odd"].display_name == "D" * 400
    assert listed["odd"].customer_mapping.event_payload_key == "k" * 150
    event_id = fake.report_errors([AsyncError("odd", CODE, MESSAGE, "x" * 300)],
                                  event_id="evt_" + "e" * 300, summary="S" * 5000)
    event = client.v2.core.events.retrieve(event_id).to_dict()
    assert event["id"] == "evt_" + "e" * 300
    assert event["data"]["developer_message_summary"] == "S" * 5000
    [error_type] = event["data"]["reason"]["error_types"]
    assert error_type["code"] == CODE
    assert error_type["sample_errors"][0]["error_message"] == MESSAGE
