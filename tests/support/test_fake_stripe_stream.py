"""Pins the fake's meter event streams: sessions, token expiry, the request-level 400s, the
checks made after the 200 (reported as error reports), dedupe shared with v1, v1's faults and
latency. Raw HTTP where the wire matters, the real SDK where its exception classes do."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import stripe

from support.clock import SettableClock as Clock
from support.fake_stripe import FakeStripe
from support.fake_stripe.reports import ERROR_REPORT, NO_METER_FOUND

API_KEY = "sk_test_fake_0123456789abcdef"
METER = "api_requests"
NOW = 1_800_000_000.0
NOW_TEXT = "2027-01-15T08:00:00Z"  # NOW as RFC 3339


@pytest.fixture
def clock() -> Clock:
    return Clock(NOW)


@pytest.fixture
def fake(clock: Clock) -> Iterator[FakeStripe]:
    with FakeStripe(meters=(METER,), clock=clock) as f:
        yield f


def session(fake: FakeStripe, key: str | None = API_KEY) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.post(f"{fake.base_url}/v2/billing/meter_event_session", headers=headers,
                         timeout=5)


def token(fake: FakeStripe) -> str:
    return str(session(fake).json()["authentication_token"])


def event(identifier: str, *, customer: str = "cus_a", value: str = "3",
          timestamp: str = NOW_TEXT, name: str = METER) -> dict[str, Any]:
    return {"event_name": name, "identifier": identifier, "timestamp": timestamp,
            "payload": {"stripe_customer_id": customer, "value": value}}


def stream(fake: FakeStripe, tok: str | None, events: Any) -> requests.Response:
    headers = {"Authorization": f"Bearer {tok}"} if tok else {}
    return requests.post(f"{fake.base_url}/v2/billing/meter_event_stream", headers=headers,
                         json={"events": events}, timeout=5)


def sdk(fake: FakeStripe) -> stripe.StripeClient:
    return stripe.StripeClient(API_KEY, max_network_retries=0, base_addresses={
        "api": fake.base_url, "meter_events": fake.base_url})


def test_a_session_is_created_with_the_secret_key_only(fake: FakeStripe) -> None:
    body = session(fake).json()
    assert body["object"] == "v2.billing.meter_event_session" and body["livemode"] is False
    assert body["authentication_token"] and body["id"]
    assert (body["created"], body["expires_at"]) == ("2027-01-15T08:00:00.000Z",
                                                     "2027-01-15T08:15:00.000Z")
    assert session(fake, None).status_code == 401
    assert session(fake, "pk_test_public").status_code == 401
    assert fake.stream_sessions() == 1


def test_the_stream_takes_a_session_token_only(fake: FakeStripe) -> None:
    for tok in (None, API_KEY, "mes_tok_never_issued"):
        resp = stream(fake, tok, [event("a")])
        assert resp.status_code == 401 and resp.json()["error"]["type"] == "invalid_request_error"
    resp = stream(fake, token(fake), [event("a")])
    assert (resp.status_code, resp.json()) == (200, {})
    assert fake.accepted()["a"].value == "3" and fake.accept_count() == 1
    assert fake.stream_calls() == 4 and fake.calls() == 0


def test_an_expired_token_raises_the_sdks_session_expired_error(fake: FakeStripe,
                                                               clock: Clock) -> None:
    client = sdk(fake)
    tok = client.v2.billing.meter_event_session.create().authentication_token
    client.v2.billing.meter_event_stream.create(params={"events": [event("a")]},  # type: ignore[list-item]
                                                options={"api_key": tok})
    clock.now += 15 * 60
    with pytest.raises(stripe.TemporarySessionExpiredError) as info:
        client.v2.billing.meter_event_stream.create(params={"events": [event("b")]},  # type: ignore[list-item]
                                                    options={"api_key": tok})
    assert info.value.http_status == 401
    assert info.value.code == "billing_meter_event_session_expired"
    fresh = client.v2.billing.meter_event_session.create().authentication_token
    fake.expire_stream_tokens()  # forced, whatever the clock says
    with pytest.raises(stripe.TemporarySessionExpiredError):
        client.v2.billing.meter_event_stream.create(params={"events": [event("c")]},  # type: ignore[list-item]
                                                    options={"api_key": fresh})
    assert set(fake.accepted()) == {"a"}


@pytest.mark.parametrize(("events", "param"), [
    ([event(f"e{i}") for i in range(101)], "events"),
    ([], "events"),
    ([event("a"), event("b"), {"identifier": "c", "payload": {}}], "events[2].event_name"),
    ([event("a"), event("b", timestamp="yesterday")], "events[1].timestamp"),
    ([event("a"), {**event("b"), "payload": {"value": 3}}], "events[1].payload"),
    ([event("x" * 101)], "events[0].identifier"),
])
def test_a_malformed_request_is_a_400_naming_the_event_and_applies_nothing(
        fake: FakeStripe, events: list[Any], param: str) -> None:
    """As Stripe's v2 errors: no ``param``; the message names the event (or, switched, a
    ``param`` does)."""
    resp = stream(fake, token(fake), events)
    assert resp.status_code == 400
    err = resp.json()["error"]
    if param.startswith("events["):
        assert err["type"] == "invalid_request_error" and "param" not in err
        assert err["message"].startswith(f"{param}: ")
    else:  # about the request as a whole
        assert err["param"] == param
    fake.stream_names_event = True
    err = stream(fake, token(fake), events).json()["error"]
    assert err["param"] == param
    assert fake.accept_count() == 0


def test_the_400_may_name_no_event(fake: FakeStripe) -> None:
    fake.stream_message_names_event = False
    resp = stream(fake, token(fake), [event("a"), event("b", timestamp="soon")])
    assert resp.status_code == 400 and "param" not in resp.json()["error"]
    fake.fail_for("a", "400")
    assert "param" not in stream(fake, token(fake), [event("a")]).json()["error"]


def test_the_sdk_carries_the_named_event_in_the_message_or_a_param(fake: FakeStripe) -> None:
    client = sdk(fake)
    tok = client.v2.billing.meter_event_session.create().authentication_token
    fake.fail_for("b", "400")
    with pytest.raises(stripe.InvalidRequestError) as info:
        client.v2.billing.meter_event_stream.create(
            params={"events": [event("a"), event("b")]},  # type: ignore[list-item]
            options={"api_key": tok})
    assert info.value.http_status == 400 and info.value.param is None
    assert info.value.user_message is None or "events[1]" in str(info.value)
    assert "events[1].payload" in str(info.value.error.message)  # type: ignore[union-attr]
    fake.stream_names_event = True
    fake.fail_for("b", "400")
    with pytest.raises(stripe.InvalidRequestError) as info:
        client.v2.billing.meter_event_stream.create(
            params={"events": [event("a"), event("b")]},  # type: ignore[list-item]
            options={"api_key": tok})
    assert info.value.param == "events[1].payload"


def test_the_checks_after_the_200_become_error_reports(fake: FakeStripe) -> None:
    fake.add_customer("cus_a")
    resp = stream(fake, token(fake), [
        event("ok"),
        event("zero", value="0"), event("frac", value="1.5"),
        event("long", value="1" * 16),
        event("old", timestamp="2026-12-10T07:59:59Z"),  # 36 days before NOW
        event("ahead", timestamp="2027-01-15T08:06:00Z"),
        event("who", customer="cus_b"),
        {**event("nocust"), "payload": {"value": "1"}},
        event("nometer", name="no_such_meter"),
    ])
    assert (resp.status_code, resp.json()) == (200, {})
    assert fake.accept_count() == 9
    assert [k for k, v in fake.accepted().items() if v.valid] == ["ok"]
    ids = fake.flush_reports()
    reports = {e["type"]: e for e in fake.events() if e["id"] in ids}
    assert set(reports) == {ERROR_REPORT, NO_METER_FOUND}
    assert "related_object" not in reports[NO_METER_FOUND]
    codes = {s["request"]["identifier"]: t["code"]
             for e in reports.values() for t in e["data"]["reason"]["error_types"]
             for s in t["sample_errors"]}
    assert codes == {
        "zero": "meter_event_invalid_value", "frac": "meter_event_invalid_value",
        "long": "meter_event_value_too_many_digits", "old": "timestamp_too_far_in_past",
        "ahead": "timestamp_in_future", "who": "meter_event_customer_not_found",
        "nocust": "meter_event_no_customer_defined", "nometer": "no_meter"}


def test_one_accepted_set_with_v1(fake: FakeStripe) -> None:
    client = sdk(fake)
    client.v1.billing.meter_events.create(params={
        "event_name": METER, "identifier": "both", "timestamp": int(NOW),
        "payload": {"stripe_customer_id": "cus_a", "value": "5"}})
    assert stream(fake, token(fake), [event("both"), event("only")]).status_code == 200
    assert fake.accept_count() == 2 and fake.stream_duplicates() == 1
    assert fake.accepted()["both"].value == "5"
    with pytest.raises(stripe.InvalidRequestError, match="already exists"):
        client.v1.billing.meter_events.create(params={
            "event_name": METER, "identifier": "only", "timestamp": int(NOW),
            "payload": {"stripe_customer_id": "cus_a", "value": "3"}})


@pytest.mark.parametrize(("kind", "status", "applied"), [
    ("503", 503, False), ("429", 429, False), ("409", 409, False), ("401", 401, False),
    ("500", 500, False), ("502", 502, False), ("504", 504, False)])
def test_v1s_faults_apply_to_streams(fake: FakeStripe, kind: str, status: int,
                                     applied: bool) -> None:
    tok = token(fake)
    fake.fail_next(kind)
    assert stream(fake, tok, [event("a"), event("b")]).status_code == status
    assert (fake.accept_count() > 0) is applied
    assert fake.stream_log()[-1]["fault"] == kind


def test_a_5xx_may_apply_first_and_a_drop_applies_then_closes(fake: FakeStripe) -> None:
    tok = token(fake)
    fake.fail_next("500", apply=True)
    assert stream(fake, tok, [event("a")]).status_code == 500
    fake.fail_next("drop")
    with pytest.raises(requests.ConnectionError):
        stream(fake, tok, [event("b")])
    assert set(fake.accepted()) == {"a", "b"}
    assert fake.stream_log()[-1]["status"] is None


def test_random_faults_and_latency_apply(fake: FakeStripe) -> None:
    tok = token(fake)
    fake.set_faults(unavailable_rate=1.0)
    assert stream(fake, tok, [event("a")]).status_code == 503
    fake.set_faults()
    fake.set_latency(0.2)
    started = time.monotonic()
    assert stream(fake, tok, [event("a")]).status_code == 200
    assert time.monotonic() - started >= 0.2


def test_concurrent_requests_of_one_lane_are_counted_as_overlaps(fake: FakeStripe) -> None:
    tok = token(fake)
    fake.set_latency(0.3)
    threads = [threading.Thread(target=stream, args=(fake, tok, [event(f"o{i}"), event(
        f"p{i}", customer=f"cus_{i}")])) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fake.overlaps() == {("cus_a", METER): 1}
    assert fake.max_in_flight() == 2


def test_control_endpoint_expires_tokens_and_state_counts_streams(fake: FakeStripe) -> None:
    tok = token(fake)
    assert requests.post(f"{fake.base_url}/_fake/expire_stream_tokens", timeout=5).ok
    resp = stream(fake, tok, [event("a")])
    assert resp.status_code == 401 and resp.json()["error"]["type"] == "temporary_session_expired"
    state = requests.get(f"{fake.base_url}/_fake/state", timeout=5).json()
    assert (state["stream_calls"], state["stream_sessions"]) == (1, 1)


def test_reset_keeps_issued_tokens_and_restores_the_switches(fake: FakeStripe) -> None:
    tok = token(fake)
    fake.stream_names_event = True
    fake.stream_message_names_event = False
    fake.stream_samples_name = "identifier"
    fake.stream_token_seconds = 0
    fake.reset()
    assert (fake.stream_names_event, fake.stream_message_names_event, fake.stream_samples_name,
            fake.stream_token_seconds) == (False, True, "request", 15 * 60)
    assert stream(fake, tok, [event("a")]).status_code == 200
    assert (fake.stream_calls(), fake.stream_sessions()) == (1, 0)
