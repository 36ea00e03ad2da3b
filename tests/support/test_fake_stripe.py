"""Pins the behaviour of ``tests.support.fake_stripe`` by driving it with the real stripe SDK.

Every outcome the drainer has to classify (see docs/stripe.md) is produced here through
``stripe.StripeClient`` with ``max_network_retries=0``, and the exception class, status, headers
and the fake's own record of what was applied are asserted.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import pytest
import requests
import stripe

from support.clock import SettableClock as Clock
from support.fake_stripe import AcceptedEvent, FakeStripe

REPO_ROOT = Path(__file__).resolve().parents[2]
API_KEY = "sk_test_fake_0123456789abcdef"
METER = "api_requests"
NOW = 1_800_000_000.0  # the fake's injected clock


@pytest.fixture
def clock() -> Clock:
    return Clock(NOW)


@pytest.fixture
def fake(clock: Clock) -> Iterator[FakeStripe]:
    with FakeStripe(meters=(METER, "other_meter"), clock=clock) as f:
        yield f


def make_client(base_url: str, api_key: str = API_KEY, timeout: float = 5.0) -> Any:
    return stripe.StripeClient(
        api_key,
        base_addresses={"api": base_url, "meter_events": base_url},
        max_network_retries=0,
        http_client=stripe.RequestsClient(timeout=timeout),
    )


@pytest.fixture
def client(fake: FakeStripe) -> Iterator[Any]:
    c = make_client(fake.base_url)
    yield c
    c._requestor._client.close()


def params(
    identifier: str = "evt-1",
    *,
    customer: str = "cus_A",
    value: str = "3",
    timestamp: int | None = None,
    event_name: str = METER,
) -> dict[str, Any]:
    return {
        "event_name": event_name,
        "payload": {"stripe_customer_id": customer, "value": value},
        "identifier": identifier,
        "timestamp": int(NOW) - 60 if timestamp is None else timestamp,
    }


def headers_of(err: stripe.StripeError) -> Mapping[str, str]:
    """The response headers of an SDK error (case-insensitive, as requests gives them)."""
    assert err.headers is not None
    return err.headers


def error_of(err: stripe.StripeError) -> dict[str, Any]:
    """The ``error`` object of an SDK error's JSON body."""
    assert isinstance(err.json_body, dict)
    return cast(dict[str, Any], err.json_body["error"])


def send(client: Any, p: dict[str, Any], key: str) -> Any:
    return client.v1.billing.meter_events.create(params=p, options={"idempotency_key": key})


# --------------------------------------------------------------------------- success and dedupe


def test_accepts_event_and_records_it(fake: FakeStripe, client: Any) -> None:
    event = send(client, params("evt-1", customer="cus_A", value="42"), "k1")

    assert event.object == "billing.meter_event"
    assert event.identifier == "evt-1"
    assert event.event_name == METER
    assert event.payload.to_dict() == {"stripe_customer_id": "cus_A", "value": "42"}
    assert event.timestamp == int(NOW) - 60
    assert event.livemode is False
    assert event.last_response.request_id.startswith("req_")
    assert fake.accepted() == {
        "evt-1": AcceptedEvent(
            identifier="evt-1",
            event_name=METER,
            customer="cus_A",
            value="42",
            timestamp=int(NOW) - 60,
            received_at=NOW,
            payload={"stripe_customer_id": "cus_A", "value": "42"},
            named="evt-1",          # what a sample reporting it would name
        )
    }
    assert fake.accept_count() == 1
    assert fake.calls() == 1
    [entry] = fake.request_log()
    assert entry["status"] == 200
    assert entry["identifier"] == "evt-1"
    assert entry["idempotency_key"] == "k1"
    assert entry["lane"] == ("cus_A", METER)
    assert entry["ended"] >= entry["started"]


def test_duplicate_identifier_is_a_400_without_code(fake: FakeStripe, client: Any) -> None:
    send(client, params("evt-dup"), "k1")

    with pytest.raises(stripe.InvalidRequestError) as info:
        send(client, params("evt-dup", value="5"), "k2")

    err = info.value
    assert err.http_status == 400
    assert err.code is None
    assert str(err.user_message) == "An event already exists with identifier evt-dup."
    assert err.user_message.startswith("An event already exists with identifier")
    assert headers_of(err)["Stripe-Should-Retry"] == "false"
    assert (err.request_id or "").startswith("req_")
    assert error_of(err)["type"] == "invalid_request_error"
    assert "code" not in error_of(err)
    assert fake.duplicate_identifier_rejections() == 1
    assert fake.accepted()["evt-dup"].value == "3"  # the first one stays
    assert fake.accept_count() == 1


def test_duplicate_identifier_400_is_not_saved_under_the_key(fake: FakeStripe, client: Any) -> None:
    send(client, params("evt-dup"), "k1")
    for _ in range(2):
        with pytest.raises(stripe.InvalidRequestError) as info:
            send(client, params("evt-dup"), "k2")
        assert "Idempotent-Replayed" not in headers_of(info.value)
    assert fake.duplicate_identifier_rejections() == 2


def test_same_key_same_params_replays_the_saved_200(fake: FakeStripe, client: Any) -> None:
    first = send(client, params("evt-1"), "k1")
    again = send(client, params("evt-1"), "k1")

    assert again.to_dict() == first.to_dict()
    headers = again.last_response.headers
    assert headers["Idempotent-Replayed"] == "true"
    assert headers["Original-Request"] == first.last_response.request_id
    assert fake.accept_count() == 1
    assert fake.duplicate_identifier_rejections() == 0
    assert fake.calls() == 2
    assert [e["replayed"] for e in fake.request_log()] == [False, True]


def test_same_key_different_params_is_an_idempotency_error(fake: FakeStripe, client: Any) -> None:
    send(client, params("evt-1", timestamp=int(NOW) - 60), "k1")

    with pytest.raises(stripe.IdempotencyError) as info:
        send(client, params("evt-1", timestamp=int(NOW) - 30), "k1")

    assert info.value.http_status == 400
    assert error_of(info.value)["type"] == "idempotency_error"
    assert "same parameters" in info.value.user_message
    assert fake.accept_count() == 1


def test_idempotency_keys_are_scoped_to_the_api_key(fake: FakeStripe, client: Any) -> None:
    send(client, params("evt-1"), "shared-key")
    other = make_client(fake.base_url, api_key="sk_test_other_account_key")
    event = send(other, params("evt-2"), "shared-key")  # no IdempotencyError: other account
    assert event.identifier == "evt-2"
    assert "Idempotent-Replayed" not in event.last_response.headers


# --------------------------------------------------------------------------- 5xx, outcome unknown


@pytest.mark.parametrize("apply", [True, False])
@pytest.mark.parametrize("status", ["500", "502", "504"])
def test_saved_5xx_is_replayed_and_applied_per_flag(
    fake: FakeStripe, client: Any, status: str, apply: bool
) -> None:
    fake.fail_next(status, apply=apply)

    with pytest.raises(stripe.APIError) as first:
        send(client, params("evt-5xx"), "k1")
    assert first.value.http_status == int(status)
    assert error_of(first.value)["type"] == "api_error"
    assert ("evt-5xx" in fake.accepted()) is apply

    # Same key, same params: Stripe replays the saved 5xx (no fault is queued any more).
    with pytest.raises(stripe.APIError) as replay:
        send(client, params("evt-5xx"), "k1")
    assert replay.value.http_status == int(status)
    assert headers_of(replay.value)["Idempotent-Replayed"] == "true"
    assert replay.value.http_body == first.value.http_body

    # A fresh key: the identifier decides.
    if apply:
        with pytest.raises(stripe.InvalidRequestError) as dup:
            send(client, params("evt-5xx"), "k2")
        assert dup.value.user_message.startswith("An event already exists with identifier")
        assert fake.duplicate_identifier_rejections() == 1
    else:
        assert send(client, params("evt-5xx"), "k2").identifier == "evt-5xx"
        assert fake.duplicate_identifier_rejections() == 0
    assert fake.accept_count() == 1


# --------------------------------------------------------------------------- not executed


def test_429_carries_retry_after_and_is_not_saved(fake: FakeStripe, client: Any) -> None:
    fake.fail_next("429", retry_after=7)

    with pytest.raises(stripe.RateLimitError) as info:
        send(client, params("evt-1"), "k1")

    assert info.value.http_status == 429
    assert headers_of(info.value)["Retry-After"] == "7"
    assert fake.accepted() == {}
    # Not saved: the same key now executes.
    assert send(client, params("evt-1"), "k1").identifier == "evt-1"
    assert fake.accept_count() == 1


def test_503_is_not_executed_and_not_saved(fake: FakeStripe, client: Any) -> None:
    fake.fail_next("503")

    with pytest.raises(stripe.APIError) as info:
        send(client, params("evt-1"), "k1")

    assert info.value.http_status == 503
    assert not isinstance(info.value, stripe.RateLimitError)
    assert fake.accepted() == {}
    event = send(client, params("evt-1"), "k1")
    assert "Idempotent-Replayed" not in event.last_response.headers
    assert fake.accept_count() == 1


def test_queued_409_is_an_api_error_with_key_in_use_code(fake: FakeStripe, client: Any) -> None:
    fake.fail_next("409")

    with pytest.raises(stripe.APIError) as info:
        send(client, params("evt-1"), "k1")

    assert info.value.http_status == 409
    assert error_of(info.value)["code"] == "idempotency_key_in_use"
    assert fake.accepted() == {}
    assert send(client, params("evt-1"), "k1").identifier == "evt-1"


def test_concurrent_request_with_the_same_key_gets_409(fake: FakeStripe, client: Any) -> None:
    fake.set_latency(0.4)
    results: list[object] = []
    first = threading.Thread(target=lambda: results.append(send(client, params("evt-1"), "k1")))
    first.start()
    deadline = time.monotonic() + 2
    while fake.calls() < 1 and time.monotonic() < deadline:
        time.sleep(0.005)

    with pytest.raises(stripe.APIError) as info:
        send(client, params("evt-1"), "k1")
    first.join(5)

    assert info.value.http_status == 409
    assert error_of(info.value)["code"] == "idempotency_key_in_use"
    assert len(results) == 1 and results[0].identifier == "evt-1"  # type: ignore[attr-defined]
    assert fake.accept_count() == 1


# --------------------------------------------------------------------------- network faults


def test_drop_applies_the_event_but_sends_no_response(fake: FakeStripe, client: Any) -> None:
    fake.fail_next("drop")

    with pytest.raises(stripe.APIConnectionError):
        send(client, params("evt-drop"), "k1")

    assert "evt-drop" in fake.accepted()
    entry = fake.request_log()[-1]
    assert entry["status"] is None
    assert entry["fault"] == "drop"
    assert entry["fault_applied"] is True
    # The response was saved under the key: a retry with it gets the replay.
    again = send(client, params("evt-drop"), "k1")
    assert again.last_response.headers["Idempotent-Replayed"] == "true"
    assert fake.accept_count() == 1


def test_drop_before_applies_nothing(fake: FakeStripe, client: Any) -> None:
    fake.fail_next("drop_before")

    with pytest.raises(stripe.APIConnectionError):
        send(client, params("evt-1"), "k1")

    assert fake.accepted() == {}
    event = send(client, params("evt-1"), "k1")
    assert "Idempotent-Replayed" not in event.last_response.headers


def test_slow_response_times_out_but_the_event_is_applied(fake: FakeStripe) -> None:
    impatient = make_client(fake.base_url, timeout=0.3)
    fake.fail_next("slow", seconds=1.0)

    with pytest.raises(stripe.APIConnectionError):
        send(impatient, params("evt-slow"), "k1")

    assert "evt-slow" in fake.accepted()


def test_outage_refuses_connections_then_recovers_on_the_same_port(
    fake: FakeStripe, client: Any
) -> None:
    send(client, params("evt-1"), "k1")  # leaves a keep-alive connection in the pool
    base_url = fake.base_url

    fake.set_outage(True)
    with pytest.raises(stripe.APIConnectionError) as info:
        send(client, params("evt-2"), "k2")
    assert "refused" in str(info.value).lower()
    assert fake.calls() == 1

    fake.set_outage(False)
    assert fake.base_url == base_url
    assert send(client, params("evt-2"), "k2").identifier == "evt-2"
    assert set(fake.accepted()) == {"evt-1", "evt-2"}


# --------------------------------------------------------------------------- auth


def test_invalid_key_is_an_authentication_error_with_masked_key(fake: FakeStripe) -> None:
    bad_key = "pk_nope_secretsecret1234"
    with pytest.raises(stripe.AuthenticationError) as info:
        send(make_client(fake.base_url, api_key=bad_key), params(), "k1")

    assert info.value.http_status == 401
    assert info.value.user_message.startswith("Invalid API Key provided: ")
    assert "secretsecret" not in info.value.user_message
    assert info.value.user_message.endswith("1234")
    assert fake.accepted() == {}


def test_missing_key_is_401(fake: FakeStripe) -> None:
    resp = requests.post(
        fake.base_url + "/v1/billing/meter_events",
        data={"event_name": METER},
        timeout=5,
    )
    assert resp.status_code == 401
    assert resp.json()["error"]["type"] == "invalid_request_error"
    assert resp.headers["Request-Id"].startswith("req_")
    assert fake.calls() == 1


@pytest.mark.parametrize(
    ("status", "exc"), [("401", stripe.AuthenticationError), ("403", stripe.PermissionError)]
)
def test_queued_auth_faults(
    fake: FakeStripe, client: Any, status: str, exc: type[stripe.StripeError]
) -> None:
    fake.fail_next(status)
    with pytest.raises(exc) as info:
        send(client, params(), "k1")
    assert info.value.http_status == int(status)
    assert fake.accepted() == {}
    assert send(client, params(), "k1").identifier == "evt-1"


def test_auth_failure_switch_holds_until_cleared(fake: FakeStripe, client: Any) -> None:
    fake.set_auth_failure(403)
    for key in ("k1", "k2"):
        with pytest.raises(stripe.PermissionError):
            send(client, params(), key)
    fake.set_auth_failure(401)
    with pytest.raises(stripe.AuthenticationError):
        send(client, params(), "k3")
    fake.set_auth_failure(None)
    assert send(client, params(), "k1").identifier == "evt-1"


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("overrides", "param", "code", "message_part"),
    [
        (
            {"timestamp": int(NOW) - 36 * 86400},
            "timestamp",
            "timestamp_too_far_in_past",
            "35 days",
        ),
        (
            {"timestamp": int(NOW) + 600},
            "timestamp",
            "timestamp_in_future",
            "5 minutes",
        ),
        ({"value": "1234567890123456"}, "payload[value]", None, "15"),
        ({"value": "1.5"}, "payload[value]", "parameter_invalid_integer", "whole number"),
        ({"event_name": "nope"}, "event_name", None, "No active meter was found"),
        ({"identifier": "x" * 101}, "identifier", None, "100"),
    ],
)
def test_validation_400s(
    fake: FakeStripe,
    client: Any,
    overrides: dict[str, Any],
    param: str,
    code: str | None,
    message_part: str,
) -> None:
    p = params()
    for name, val in overrides.items():
        if name == "value":
            p["payload"]["value"] = val
        else:
            p[name] = val

    with pytest.raises(stripe.InvalidRequestError) as info:
        send(client, p, "k1")

    err = info.value
    assert err.http_status == 400
    assert err.param == param
    assert err.code == code
    assert message_part in err.user_message
    assert not err.user_message.startswith("An event already exists")
    assert headers_of(err)["Stripe-Should-Retry"] == "false"
    assert fake.accepted() == {}
    # Validation 400s are not saved: the same key with corrected params executes.
    assert send(client, params(), "k1").identifier == "evt-1"


def test_boundary_values_are_accepted(fake: FakeStripe, client: Any) -> None:
    send(client, params("a", value="123456789012345"), "k1")
    send(client, params("b", value="-7"), "k2")
    send(client, params("c", timestamp=int(NOW) - 35 * 86400 + 1), "k3")
    send(client, params("d", timestamp=int(NOW) + 300), "k4")
    send(client, params("e", event_name="other_meter"), "k5")
    fake.add_meter("late_meter")
    send(client, params("f", event_name="late_meter"), "k6")
    assert set(fake.accepted()) == {"a", "b", "c", "d", "e", "f"}


def test_timestamp_window_follows_the_injected_clock(
    fake: FakeStripe, client: Any, clock: Clock
) -> None:
    clock.now = NOW + 40 * 86400
    with pytest.raises(stripe.InvalidRequestError) as info:
        send(client, params(), "k1")
    assert info.value.code == "timestamp_too_far_in_past"


# --------------------------------------------------------------------------- lanes and load


def _concurrently(*calls: Callable[[], object]) -> None:
    barrier = threading.Barrier(len(calls))
    errors: list[BaseException] = []

    def run(call: Callable[[], object]) -> None:
        barrier.wait()
        try:
            call()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(c,)) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not errors


def test_two_calls_in_the_same_lane_overlap(fake: FakeStripe, client: Any) -> None:
    fake.set_latency(0.2)
    _concurrently(
        lambda: send(client, params("e1", customer="cus_A"), "k1"),
        lambda: send(client, params("e2", customer="cus_A"), "k2"),
    )
    assert fake.overlaps() == {("cus_A", METER): 1}
    assert fake.max_in_flight() == 2
    assert fake.accept_count() == 2


def test_calls_in_different_lanes_do_not_overlap(fake: FakeStripe, client: Any) -> None:
    fake.set_latency(0.2)
    _concurrently(
        lambda: send(client, params("e1", customer="cus_A"), "k1"),
        lambda: send(client, params("e2", customer="cus_B"), "k2"),
        lambda: send(client, params("e3", customer="cus_A", event_name="other_meter"), "k3"),
    )
    assert fake.overlaps() == {}
    assert fake.max_in_flight() == 3


def test_sequential_calls_in_one_lane_do_not_overlap(fake: FakeStripe, client: Any) -> None:
    fake.set_latency(0.05)
    for i in range(3):
        send(client, params(f"e{i}"), f"k{i}")
    assert fake.overlaps() == {}
    assert fake.max_in_flight() == 1


def test_random_faults_are_deterministic_for_a_seed(clock: Clock) -> None:
    def run(seed: int) -> list[int | None]:
        with FakeStripe(seed=seed, clock=clock) as f:
            f.set_faults(error_5xx_rate=0.3, rate_limit_rate=0.2, unavailable_rate=0.1)
            c = make_client(f.base_url)
            for i in range(30):
                with contextlib.suppress(stripe.StripeError):
                    send(c, params(f"e{i}"), f"k{i}")
            return [e["status"] for e in f.request_log()]

    first, second, other = run(7), run(7), run(8)
    assert first == second
    assert first != other
    assert {429, 200} <= set(first)
    assert set(first) & {500, 502, 504}


def test_reset_clears_events_counters_and_faults(fake: FakeStripe, client: Any) -> None:
    send(client, params("e1"), "k1")
    fake.fail_next("500", count=3)
    fake.reset()
    assert (fake.accepted(), fake.calls(), fake.request_log()) == ({}, 0, [])
    event = send(client, params("e1"), "k1")  # no replay, no dup, no queued 500
    assert "Idempotent-Replayed" not in event.last_response.headers
    assert fake.accept_count() == 1


def test_keep_alive_and_content_length(fake: FakeStripe) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", int(fake.base_url.rsplit(":", 1)[1]))
    body = "event_name=api_requests&payload[stripe_customer_id]=cus_A&payload[value]=1&timestamp=%d"
    try:
        sockets = []
        for i in range(3):
            conn.request(
                "POST",
                "/v1/billing/meter_events",
                body=(body % int(NOW)) + f"&identifier=ka{i}",
                headers={
                    "Authorization": f"Bearer {API_KEY}",
                    "Content-Type": "application/x-www-form-urlencoded",
                },
            )
            resp = conn.getresponse()
            data = resp.read()
            assert resp.status == 200
            assert int(resp.headers["Content-Length"]) == len(data)
            assert json.loads(data)["identifier"] == f"ka{i}"
            sockets.append(conn.sock)
        assert sockets[0] is not None and sockets[0] is sockets[1] is sockets[2]
    finally:
        conn.close()


# --------------------------------------------------------------------------- process mode


def test_runs_as_a_process_with_control_endpoints() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.fake_stripe",
            "--port",
            "0",
            "--latency",
            "0.01",
            "--meter",
            "api_requests",
            "--meter",
            "other",
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Unbuffered output would hide a missing flush of the READY line.
        env={
            **{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"},
            "PYTHONPATH": str(REPO_ROOT),
        },
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 15)
        assert ready, "no READY line within 15 s"
        line = proc.stdout.readline().strip()
        assert line.startswith("READY http://127.0.0.1:")
        base = line.split(" ", 1)[1]
        client = make_client(base)

        send(client, params("p1", event_name="other", timestamp=int(time.time())), "k1")
        resp = requests.post(base + "/_fake/fail_next", json={"kind": "500"}, timeout=5)
        assert resp.status_code == 200
        with pytest.raises(stripe.APIError) as info:
            send(client, params("p2", timestamp=int(time.time())), "k2")
        assert info.value.http_status == 500

        state = requests.get(base + "/_fake/state", timeout=5).json()
        assert state["accepted"] == [
            {
                "identifier": "p1",
                "event_name": "other",
                "customer": "cus_A",
                "value": "3",
                "timestamp": state["accepted"][0]["timestamp"],
            }
        ]
        assert state["calls"] == 2  # control requests are not counted
        assert state["overlaps"] == []
        assert state["max_in_flight"] == 1
        assert state["duplicate_identifier_rejections"] == 0

        assert requests.post(base + "/_fake/reset", timeout=5).status_code == 200
        assert requests.get(base + "/_fake/state", timeout=5).json()["calls"] == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - only on a hang
            proc.kill()
            out, err = proc.communicate()
    assert proc.returncode == 0, err
    assert out == ""  # nothing but the READY line is printed
