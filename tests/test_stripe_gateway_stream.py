"""Meter event streams through the real SDK against the fake: each answer Stripe can give a
stream request, classified for every event in it; sessions shared, renewed ahead of expiry and
on expiry (the resend is reported, not an attempt); v1 and v2 share Stripe's identifier dedupe."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import stripe
from support.fake_stripe import FakeStripe

from webapp.outbox.states import Outcome
from webapp.stripe_gateway import (
    MeterEvent,
    SdkGateway,
    StreamResult,
    classify_stream_error,
    split_refused,
)
from webapp.stripe_gateway.stream import stream_params

METER = "api_requests"
KEY = "sk_test_stream_0123456789"


class Clock:
    """The gateway's clock, settable."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def fake() -> Iterator[FakeStripe]:
    with FakeStripe(meters=(METER,), separate_streams=True) as f:
        yield f


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def gateway(fake: FakeStripe, clock: Clock) -> Iterator[SdkGateway]:
    gw = SdkGateway(KEY, api_base=fake.base_url, meter_events_base=fake.meter_events_url,
                       timeout_seconds=5, clock=clock)
    yield gw
    gw.close()


def events(n: int, prefix: str = "ev", *, customer: str = "cus_a",
           at: datetime | None = None) -> list[MeterEvent]:
    when = at or datetime.now(UTC) - timedelta(minutes=1)
    return [MeterEvent(METER, customer, i + 1, f"{prefix}-{i}", when) for i in range(n)]


def outcomes(result: StreamResult) -> list[Outcome]:
    return [r.outcome for r in result.results]


def test_params_carry_v1s_identifier_payload_and_second_as_rfc3339() -> None:
    at = datetime(2026, 11, 30, 12, 0, 5, 900_000, tzinfo=UTC)
    event = MeterEvent(METER, "cus_x", 7, "usage:42", at, customer_key="customer",
                       value_key="units")
    assert stream_params(event) == {
        "event_name": METER, "identifier": event.params()["identifier"],
        "timestamp": "2026-11-30T12:00:05Z", "payload": {"customer": "cus_x", "units": "7"}}
    assert event.params()["timestamp"] == int(at.timestamp())


def test_a_200_delivers_every_event_with_the_request_id(
        fake: FakeStripe, gateway: SdkGateway) -> None:
    result = gateway.send_batch(events(100))
    assert outcomes(result) == [Outcome.DELIVERED] * 100
    assert (result.requests, result.resent_after_expiry, result.unconfirmed) == (1, 0, False)
    assert result.request_id and result.request_id == fake.stream_log()[-1]["request_id"]
    assert {r.request_id for r in result.results} == {result.request_id}
    assert len(fake.accepted()) == 100 and fake.accept_count() == 100
    assert fake.accepted()["ev-3"].value == "4"


def test_more_than_100_events_or_none_are_refused_before_any_call(
        fake: FakeStripe, gateway: SdkGateway) -> None:
    with pytest.raises(ValueError, match="1 to 100"):
        gateway.send_batch(events(101))
    with pytest.raises(ValueError):
        gateway.send_batch([])
    assert fake.stream_calls() == 0 and fake.stream_sessions() == 0


@pytest.mark.parametrize("kind", ["500", "502", "504"])
def test_a_5xx_leaves_every_event_unknown(fake: FakeStripe, gateway: SdkGateway,
                                          kind: str) -> None:
    fake.fail_next(kind, apply=True)
    result = gateway.send_batch(events(5))
    assert outcomes(result) == [Outcome.UNKNOWN] * 5
    assert all(r.http_status == int(kind) and r.request_id for r in result.results)
    # Resending the same events is safe: Stripe's identifier dedupe takes each once.
    again = gateway.send_batch(events(5))
    assert outcomes(again) == [Outcome.DELIVERED] * 5
    assert fake.accept_count() == 5 and fake.stream_duplicates() == 5


def test_a_timeout_leaves_every_event_unknown(fake: FakeStripe, clock: Clock) -> None:
    gw = SdkGateway(KEY, api_base=fake.base_url, meter_events_base=fake.meter_events_url,
                       timeout_seconds=0.3, clock=clock)
    try:
        fake.fail_next("slow", seconds=1.0)
        result = gw.send_batch(events(3))
    finally:
        gw.close()
    assert outcomes(result) == [Outcome.UNKNOWN] * 3
    assert result.results[0].error_class == "APIConnectionError"


@pytest.mark.parametrize("kind", ["429", "409", "503"])
def test_429_409_503_leave_every_event_not_executed(fake: FakeStripe, gateway: SdkGateway,
                                                    kind: str) -> None:
    fake.fail_next(kind, **({"retry_after": 2} if kind == "429" else {}))
    result = gateway.send_batch(events(4))
    assert outcomes(result) == [Outcome.NOT_EXECUTED] * 4
    if kind == "429":
        assert result.results[0].retry_after == 2.0
    assert fake.accept_count() == 0


@pytest.mark.parametrize("status", [401, 403])
def test_401_403_are_systemic(fake: FakeStripe, gateway: SdkGateway, status: int) -> None:
    fake.set_auth_failure(status)
    result = gateway.send_batch(events(3))
    assert outcomes(result) == [Outcome.SYSTEMIC] * 3


def test_a_refused_session_key_is_systemic_and_sends_nothing(fake: FakeStripe,
                                                             clock: Clock) -> None:
    gw = SdkGateway("pk_test_not_a_secret", api_base=fake.base_url,
                       meter_events_base=fake.meter_events_url, timeout_seconds=5,
                       clock=clock)
    try:
        result = gw.send_batch(events(2))
    finally:
        gw.close()
    assert outcomes(result) == [Outcome.SYSTEMIC] * 2
    assert result.requests == 0 and fake.stream_calls() == 0


def test_a_400_naming_an_event_makes_only_that_one_permanent(
        fake: FakeStripe, gateway: SdkGateway) -> None:
    batch = events(6)
    fake.fail_for("ev-3", "400")
    result = gateway.send_batch(batch)
    assert fake.stream_log()[-1]["status"] == 400
    assert outcomes(result) == [Outcome.NOT_EXECUTED] * 3 + [Outcome.PERMANENT] + \
        [Outcome.NOT_EXECUTED] * 2
    assert not result.unconfirmed
    bad = result.results[3]
    assert bad.http_status == 400 and bad.request_id and "refused" in (bad.message or "")
    assert "another event" in (result.results[0].message or "")
    # The rest resend safely, and only they are taken.
    rest = [e for i, e in enumerate(batch) if i != 3]
    assert outcomes(gateway.send_batch(rest)) == [Outcome.DELIVERED] * 5
    assert set(fake.accepted()) == {e.identifier for e in rest}


def test_a_400_naming_no_event_is_unconfirmed_and_halving_finds_the_bad_one(
        fake: FakeStripe, gateway: SdkGateway) -> None:
    batch = events(10)
    fake.stream_message_names_event = False
    fake.fail_for("ev-6", "400")
    first = gateway.send_batch(batch)
    assert first.unconfirmed and first.refusal is not None
    assert outcomes(first) == [Outcome.NOT_EXECUTED] * 10
    found = split_refused(gateway.send_batch, batch, first)
    assert not found.unconfirmed
    assert outcomes(found) == [Outcome.DELIVERED] * 6 + [Outcome.PERMANENT] + \
        [Outcome.DELIVERED] * 3
    assert found.results[6].http_status == 400
    # 10 → 5 sent + 5 refused → 2 refused + 3 sent → 1 sent + 1 refused: one plus six.
    assert found.requests == 1 + 6 == fake.stream_calls()
    assert set(fake.accepted()) == {e.identifier for e in batch} - {"ev-6"}


def test_halving_stops_at_its_bound_and_stays_unconfirmed(
        fake: FakeStripe, gateway: SdkGateway) -> None:
    batch = events(8)
    fake.stream_message_names_event = False
    fake.fail_for("ev-0", "400")
    first = gateway.send_batch(batch)
    found = split_refused(gateway.send_batch, batch, first, max_requests=2)
    assert found.unconfirmed and found.requests == 3
    assert outcomes(found)[:4] == [Outcome.NOT_EXECUTED] * 4
    assert outcomes(found)[4:] == [Outcome.DELIVERED] * 4


def test_halving_stops_on_a_systemic_answer(fake: FakeStripe, gateway: SdkGateway) -> None:
    batch = events(4)
    fake.stream_message_names_event = False
    fake.fail_for("ev-3", "400")
    first = gateway.send_batch(batch)

    def send(part: Sequence[MeterEvent]) -> StreamResult:
        fake.set_auth_failure(401)
        return gateway.send_batch(part)

    found = split_refused(send, batch, first)
    assert outcomes(found) == [Outcome.SYSTEMIC] * 4 and found.requests == 2


def test_an_expired_session_is_renewed_and_the_same_request_resent(
        fake: FakeStripe, gateway: SdkGateway) -> None:
    assert outcomes(gateway.send_batch(events(2, "a"))) == [Outcome.DELIVERED] * 2
    fake.expire_stream_tokens()
    batch = events(3, "b")
    result = gateway.send_batch(batch)
    assert outcomes(result) == [Outcome.DELIVERED] * 3
    assert (result.requests, result.resent_after_expiry) == (2, 1)
    assert gateway.stream_sessions == 2 == fake.stream_sessions()
    log = fake.stream_log()
    assert [e["status"] for e in log[-2:]] == [401, 200]
    assert log[-2]["identifiers"] == log[-1]["identifiers"] == [e.identifier for e in batch]
    assert log[-2]["token"] != log[-1]["token"]
    assert fake.accept_count() == 5


def test_a_session_is_renewed_ahead_of_its_expiry(fake: FakeStripe, gateway: SdkGateway,
                                                  clock: Clock) -> None:
    gateway.send_batch(events(1, "a"))
    clock.now += timedelta(minutes=13, seconds=50)  # 70 s before the 15 minutes end
    gateway.send_batch(events(1, "b"))
    assert fake.stream_sessions() == 1
    clock.now += timedelta(seconds=20)  # 50 s before: renewed before sending
    result = gateway.send_batch(events(1, "c"))
    assert result.resent_after_expiry == 0 and fake.stream_sessions() == 2
    tokens = [e["token"] for e in fake.stream_log()]
    assert tokens[0] == tokens[1] != tokens[2]


def test_threads_share_one_session(fake: FakeStripe, gateway: SdkGateway) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: gateway.send_batch(events(5, f"t{i}")), range(16)))
    assert all(outcomes(r) == [Outcome.DELIVERED] * 5 for r in results)
    assert fake.stream_sessions() == 1 and fake.accept_count() == 80


def test_an_event_sent_by_v1_then_by_a_stream_counts_once(
        fake: FakeStripe, gateway: SdkGateway) -> None:
    batch = events(3, "mixed")
    assert gateway.send(batch[0], batch[0].identifier).outcome is Outcome.DELIVERED
    assert outcomes(gateway.send_batch(batch)) == [Outcome.DELIVERED] * 3
    assert fake.accept_count() == 3 and fake.stream_duplicates() == 1
    # … and back: v1 finds the stream's events already there.
    again = gateway.send(batch[2], batch[2].identifier + ":again")
    assert again.outcome is Outcome.DELIVERED and again.http_status == 400
    assert fake.accept_count() == 3


def test_a_check_failed_after_the_200_is_reported_where_the_poller_reads_it(
        fake: FakeStripe, gateway: SdkGateway) -> None:
    fake.add_customer("cus_known")
    good = events(1, "ok", customer="cus_known")
    old = events(1, "old", customer="cus_known",
                 at=datetime.now(UTC) - timedelta(days=36))
    stranger = events(1, "who", customer="cus_stranger")
    result = gateway.send_batch(good + old + stranger, "bo-stream-one")
    assert outcomes(result) == [Outcome.DELIVERED] * 3
    assert result.keys == ("bo-stream-one",) * 3
    since = datetime.now(UTC) - timedelta(minutes=5)
    assert fake.flush_reports()
    from webapp.outbox.error_reports import REPORT_TYPES

    listed = list(gateway.list_events(REPORT_TYPES, created_gte=since))
    assert len(listed) == 1
    report = gateway.retrieve_event(listed[0].id)
    # The samples name the request's idempotency key, as the SDK documents them.
    named = sorted((s.identifier, s.code) for s in report.samples)
    assert named == [("bo-stream-one", "meter_event_customer_not_found"),
                     ("bo-stream-one", "timestamp_too_far_in_past")]
    assert report.meter_id and report.error_count == 2
    fake.stream_samples_name = "identifier"  # as Stripe's example shows them
    gateway.send_batch(events(1, "who2", customer="cus_stranger"))
    fake.flush_reports()
    latest = gateway.retrieve_event(list(gateway.list_events(
        REPORT_TYPES, created_gte=since))[-1].id)
    assert [s.identifier for s in latest.samples] == ["who2-0"]


def test_every_stream_request_carries_a_key_of_its_own_even_when_resent(
        fake: FakeStripe, gateway: SdkGateway) -> None:
    """Each request a key of its own: given, or made; a resend after an expired session is
    a new request with a new key, and the result names the key that carried the events."""
    first = gateway.send_batch(events(2, "k"))
    second = gateway.send_batch(events(2, "l"), "bo-stream-given")
    fake.expire_stream_tokens()
    third = gateway.send_batch(events(1, "m"), "bo-stream-expired")
    keys = [e["idempotency_key"] for e in fake.stream_log()]
    assert keys[1] == "bo-stream-given" and keys[2] == "bo-stream-expired"
    assert len(set(keys)) == len(keys) == 4
    assert all(k.startswith("bo-stream-") for k in keys)
    assert first.keys == (keys[0],) * 2 and second.keys == ("bo-stream-given",) * 2
    assert third.resent_after_expiry == 1 and third.keys == (keys[3],)


def test_a_session_that_expires_again_at_once_leaves_the_events_not_executed(
        fake: FakeStripe, gateway: SdkGateway) -> None:
    fake.stream_token_seconds = 0  # every token is expired when issued
    result = gateway.send_batch(events(2))
    assert outcomes(result) == [Outcome.NOT_EXECUTED] * 2
    assert (result.requests, result.resent_after_expiry) == (2, 1)
    assert fake.stream_sessions() == 2 and fake.accept_count() == 0


def test_a_clock_far_from_stripes_does_not_renew_every_request(
        fake: FakeStripe, gateway: SdkGateway, clock: Clock) -> None:
    clock.now += timedelta(minutes=20)  # this process's clock runs 20 minutes ahead
    for prefix in "abc":
        assert outcomes(gateway.send_batch(events(1, prefix))) == [Outcome.DELIVERED]
    assert fake.stream_sessions() == 1


def test_no_session_means_nothing_left(fake: FakeStripe, gateway: SdkGateway) -> None:
    """A session call that fails sends no event: never an unknown outcome."""
    fake.set_outage(True)
    try:
        refused = gateway.send_batch(events(2))
    finally:
        fake.set_outage(False)
    assert outcomes(refused) == [Outcome.NOT_EXECUTED] * 2 and refused.requests == 0
    assert (refused.results[0].message or "").startswith("no meter event session")
    assert fake.stream_calls() == 0


def test_a_refused_connection_to_the_stream_is_not_executed(
        fake: FakeStripe, gateway: SdkGateway) -> None:
    gateway.send_batch(events(1, "warm"))
    fake.set_outage(True)
    try:
        result = gateway.send_batch(events(2))
    finally:
        fake.set_outage(False)
    assert outcomes(result) == [Outcome.NOT_EXECUTED] * 2


def _invalid(param: str | None, message: str = "Invalid payload.", *,
             code: str | None = None) -> Any:
    body = {"error": {"type": "invalid_request_error", "message": message, "param": param,
                      "code": code}}
    cls: Any = stripe.InvalidRequestError  # (message, param, code, body, status, json, headers)
    return cls(message, param, code, json.dumps(body), 400, body, {"request-id": "req_x"})


def test_classifying_a_400_by_its_param() -> None:
    results, refusal = classify_stream_error(_invalid("events[1].timestamp"), 3)
    assert [r.outcome for r in results] == [Outcome.NOT_EXECUTED, Outcome.PERMANENT,
                                            Outcome.NOT_EXECUTED]
    assert refusal is None and results[1].message == "Invalid payload."
    for param in (None, "events", "events[7].payload", "payload"):
        results, refusal = classify_stream_error(_invalid(param), 3)
        assert [r.outcome for r in results] == [Outcome.NOT_EXECUTED] * 3
        assert refusal is not None and refusal.outcome is Outcome.PERMANENT
    # Stripe's words for a missing meter keep their meaning: that event waits for its meter.
    results, _ = classify_stream_error(
        _invalid("events[0].event_name", "No active meter was found for event_name 'x'."), 2)
    assert [r.outcome for r in results] == [Outcome.METER_MISSING, Outcome.NOT_EXECUTED]
    # The older form of a rate limit is a 400 too: nothing was applied.
    limited = stripe.RateLimitError("Too many requests", http_status=400,
                                    json_body={"error": {"code": "rate_limit"}})
    results, refusal = classify_stream_error(limited, 2)
    assert [r.outcome for r in results] == [Outcome.NOT_EXECUTED] * 2 and refusal is None


def test_a_renewal_asked_with_an_already_replaced_token_reuses_the_new_one() -> None:
    from webapp.stripe_gateway.stream import Session, SessionTokens

    made: list[str] = []

    def create() -> Session:
        made.append(f"tok{len(made)}")
        return Session(made[-1], timedelta(minutes=15))

    now = datetime(2026, 12, 1, tzinfo=UTC)
    tokens = SessionTokens(create, clock=lambda: now)
    first = tokens.token()
    second = tokens.renew(first)       # one thread saw it expire: renewed
    assert tokens.renew(first) == second == tokens.token()  # another thread, late: reused
    assert made == ["tok0", "tok1"] and tokens.created == 2


# -- Stripe's two hosts ------------------------------------------------------------------------

def test_streams_reach_only_the_meter_events_host_and_the_rest_only_the_api(
        fake: FakeStripe, gateway: SdkGateway) -> None:
    """The fake serves streams on a port of their own and answers 404 to them on the API's,
    as Stripe does: the session and every other call go to the API, streams to theirs."""
    result = gateway.send_batch(events(3))
    assert outcomes(result) == [Outcome.DELIVERED] * 3
    assert gateway.list_meters()
    hits = fake.hits()
    streams = [h for h in hits if h[2] == "/v2/billing/meter_event_stream"]
    others = [h for h in hits if h[2] != "/v2/billing/meter_event_stream"]
    assert streams and {h[0] for h in streams} == {"meter_events"}
    assert {h[2] for h in others} >= {"/v2/billing/meter_event_session", "/v1/billing/meters"}
    assert {h[0] for h in others} == {"api"}
    assert fake.accept_count() == 3


def test_streams_sent_to_the_api_host_are_refused_and_nothing_is_taken(
        fake: FakeStripe, clock: Clock) -> None:
    """The mix-up this guards against: with both bases on the API's host, every stream
    request is a 404, which stops sending (systemic), and Stripe takes nothing."""
    gw = SdkGateway(KEY, api_base=fake.base_url, meter_events_base=fake.base_url,
                       timeout_seconds=5, clock=clock)
    try:
        result = gw.send_batch(events(2))
    finally:
        gw.close()
    assert outcomes(result) == [Outcome.SYSTEMIC] * 2
    assert {r.http_status for r in result.results} == {404}
    assert fake.accept_count() == 0 and fake.stream_calls() == 0


def test_with_neither_base_set_the_sdk_has_stripes_two_hosts() -> None:
    from webapp.config import Settings
    from webapp.worker import gateway_from

    gw = gateway_from(Settings(database_url="sqlite://", stripe_api_key=KEY))
    assert gw is not None
    try:
        bases = gw.base_addresses
    finally:
        gw.close()
    assert bases["api"] == "https://api.stripe.com"
    assert bases["meter_events"] == "https://meter-events.stripe.com"
    gw = gateway_from(Settings(database_url="sqlite://", stripe_api_key=KEY,
                               stripe_api_base="http://127.0.0.1:9"))
    assert gw is not None
    try:
        assert gw.base_addresses["meter_events"] == "http://127.0.0.1:9"
    finally:
        gw.close()
