"""Meter event streams (``STRIPE_METER_EVENT_API=v2_stream``): each answer of a stream request
mapped onto the outcome classes, on SQLite and PostgreSQL.

The real ``stripe`` SDK (through ``SdkGateway.send_batch``) against the loopback fake, with
``Drainer`` instances in-process. What Stripe saw is read back from the fake (``accepted()``,
``stream_log()``); what the outbox decided, from the tables.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session
from support.fake_stripe import FakeStripe

from webapp.config import Settings
from webapp.models import DeliveryAttempt, OutboxEvent, utcnow
from webapp.outbox import claims, control, enqueue_usage, operations
from webapp.outbox.states import DEAD_PAST_WINDOW
from webapp.worker import Drainer, gateway_from
from webapp.worker.breaker import CircuitBreaker
from webapp.worker.streaming import pack

from .test_delivery_outcomes import CUSTOMER, METER, Clock, enqueue, row, snapshot

T = OutboxEvent.__table__
A = DeliveryAttempt.__table__


def attempts_by_event(engine: Engine) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    with engine.connect() as conn:
        for r in conn.execute(select(A).order_by(A.c.id)).mappings():
            out.setdefault(r["event_id"], []).append(dict(r))
    return out


def statuses(engine: Engine) -> dict[int, str]:
    with engine.connect() as conn:
        return {r.id: r.status for r in conn.execute(select(T.c.id, T.c.status))}


@pytest.fixture
def stream_settings(settings: Settings) -> Settings:
    return settings.with_overrides(meter_event_api="v2_stream")


@pytest.fixture
def make_drainer(engine: Engine, stream_settings: Settings) -> Iterator[Callable[..., Drainer]]:
    made: list[Drainer] = []

    def make(settings: Settings | None = None, **kw: Any) -> Drainer:
        settings = settings or stream_settings
        d = Drainer(engine, settings, gateway_from(settings), **kw)
        if d.meters is not None:
            d.meters.active()
        made.append(d)
        return d

    yield make
    for d in made:
        d.close()


@pytest.fixture
def drainer(make_drainer: Callable[..., Drainer]) -> Drainer:
    return make_drainer()


@pytest.fixture(autouse=True)
def _tenants(engine: Engine) -> None:
    for i in range(3):
        operations.set_tenant(engine, f"t{i}", stripe_customer_id=f"{CUSTOMER}{i}", name=None,
                              now=utcnow())


def enqueue_many(engine: Engine, n: int, prefix: str, tenants: int = 3) -> list[int]:
    return [enqueue(engine, f"{prefix}-{i}", tenant=f"t{i % tenants}", quantity=i + 1)
            for i in range(n)]


def drain_all(drainer: Drainer, engine: Engine, ids: list[int], status: str = "sent",
              passes: int = 200) -> None:
    for _ in range(passes):
        if all(statuses(engine)[i] == status for i in ids):
            return
        drainer.drain_once()
        drainer.stopping.wait(0.02)
    raise AssertionError(f"not all {status}: {statuses(engine)}")


# -- delivered ------------------------------------------------------------------------------------

def test_200_sends_every_event_in_one_request_with_its_request_id(
        engine: Engine, fake_stripe: FakeStripe, drainer: Drainer) -> None:
    ids = enqueue_many(engine, 9, "ok")
    summary = drainer.drain_once()
    assert (summary.claimed, summary.sent, summary.calls) == (9, 9, 9)
    [req] = fake_stripe.stream_log()
    assert sorted(req["identifiers"]) == sorted(f"ok-{i}" for i in range(9))
    accepted = fake_stripe.accepted()
    for i, eid in enumerate(ids):
        got = accepted[f"ok-{i}"]
        assert (got.customer, got.event_name, got.value) == (f"{CUSTOMER}{i % 3}", METER,
                                                             str(i + 1))
        [att] = attempts_by_event(engine)[eid]
        assert (att["outcome"], att["counted"], att["http_status"]) == ("delivered", True, 200)
        assert att["stripe_request_id"] == req["request_id"]
    assert fake_stripe.calls() == 0 and fake_stripe.stream_sessions() == 1


# -- outcome unknown ------------------------------------------------------------------------------

@pytest.mark.parametrize("fault", [{"kind": "drop"}, {"kind": "500", "apply": True},
                                   {"kind": "502", "apply": False}])
def test_lost_answer_or_5xx_is_unknown_for_each_then_resent_once(
        engine: Engine, fake_stripe: FakeStripe, drainer: Drainer,
        fault: dict[str, Any]) -> None:
    ids = enqueue_many(engine, 6, "unk")
    fake_stripe.fail_next(**fault)
    drainer.drain_once()
    for eid in ids:
        r = row(engine, eid)
        assert (r["status"], r["last_outcome"], r["attempt_count"]) == ("retrying", "unknown", 1)
        assert r["first_unknown_at"] is not None
    drain_all(drainer, engine, ids)
    assert fake_stripe.accept_count() == 6
    assert sorted(fake_stripe.accepted()) == sorted(f"unk-{i}" for i in range(6))
    for eid in ids:
        assert [a["outcome"] for a in attempts_by_event(engine)[eid]] == ["unknown",
                                                                          "delivered"]
    log = fake_stripe.stream_log()
    # The same identifiers again (each once; backoff jitter may spread them over requests).
    assert sorted(i for e in log[1:] for i in e["identifiers"]) == sorted(log[0]["identifiers"])


def test_unknown_outcome_past_the_dedupe_window_is_not_resent(
        engine: Engine, fake_stripe: FakeStripe, make_drainer: Callable[..., Drainer]) -> None:
    clock = Clock()
    drainer = make_drainer(clock=clock)
    ids = enqueue_many(engine, 3, "win")
    fake_stripe.fail_next("drop_before")
    drainer.drain_once()
    assert {row(engine, i)["last_outcome"] for i in ids} == {"unknown"}
    with engine.begin() as conn:  # the first unknown outcome, a day ago
        conn.execute(update(T).where(T.c.id == ids[0]).values(
            first_unknown_at=utcnow() - timedelta(hours=23, minutes=30)))
    clock.advance(5)
    drain_all(drainer, engine, ids[1:])
    r = row(engine, ids[0])
    assert (r["status"], r["dead_reason"]) == ("dead", DEAD_PAST_WINDOW)
    assert "win-0" not in fake_stripe.accepted()


# -- not executed ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["429", "409", "503"])
def test_429_409_503_are_not_executed_and_not_counted(
        engine: Engine, fake_stripe: FakeStripe, drainer: Drainer, kind: str) -> None:
    ids = enqueue_many(engine, 4, "ne")
    fake_stripe.fail_next(kind)
    drainer.drain_once()
    for eid in ids:
        r = row(engine, eid)
        assert (r["status"], r["attempt_count"], r["call_count"]) == ("retrying", 0, 1)
        assert r["first_unknown_at"] is None
    drain_all(drainer, engine, ids)
    assert fake_stripe.accept_count() == 4
    for eid in ids:
        assert [(a["outcome"], a["counted"]) for a in attempts_by_event(engine)[eid]] == [
            ("not_executed", False), ("delivered", True)]


# -- refused --------------------------------------------------------------------------------------

@pytest.mark.parametrize("named", ["param", "message", "nowhere"],
                         ids=["named-in-param", "named-in-message", "found-by-halving"])
def test_400_dead_letters_only_the_refused_event_the_rest_are_sent(
        engine: Engine, fake_stripe: FakeStripe, drainer: Drainer, named: str) -> None:
    """Stripe's v2 errors carry no ``param``: the event at fault is read from the message
    when it names ``events[i]``, and found by halving when nothing names it."""
    ids = enqueue_many(engine, 10, "bad")
    fake_stripe.stream_names_event = named == "param"
    fake_stripe.stream_message_names_event = named == "message"
    fake_stripe.fail_for("bad-7", "400")
    before = fake_stripe.stream_calls()
    drain_all(drainer, engine, [i for i in ids if i != ids[7]])
    r = row(engine, ids[7])
    assert (r["status"], r["last_outcome"], r["last_http_status"]) == ("dead", "permanent", 400)
    assert sorted(fake_stripe.accepted()) == sorted(f"bad-{i}" for i in range(10) if i != 7)
    by_event = attempts_by_event(engine)
    assert [a["outcome"] for a in by_event[ids[7]]] == ["permanent"]
    for i, eid in enumerate(ids):
        if i != 7:  # resent untouched: one attempt each, the delivery
            assert [a["outcome"] for a in by_event[eid]] == ["delivered"]
            assert row(engine, eid)["attempt_count"] == 1
    # Named: the refused request and the other nine again; found by halving: more requests.
    requests = fake_stripe.stream_calls() - before
    assert requests == 2 if named != "nowhere" else requests > 2


# -- systemic -------------------------------------------------------------------------------------

@pytest.mark.parametrize("status", [401, 403])
def test_401_403_pause_sending_and_change_no_event(
        engine: Engine, fake_stripe: FakeStripe, drainer: Drainer, status: int) -> None:
    enqueue_many(engine, 5, "auth")
    before = snapshot(engine)
    fake_stripe.set_auth_failure(status)
    drainer.drain_once()
    assert snapshot(engine) == before
    with engine.connect() as conn:
        pause = control.pause_state(conn)
    assert pause.paused and pause.kind == control.SYSTEMIC and str(status) in (pause.reason or "")
    assert fake_stripe.accept_count() == 0


# -- session expiry -------------------------------------------------------------------------------

def test_expired_session_is_renewed_and_the_resend_is_not_an_attempt(
        engine: Engine, fake_stripe: FakeStripe, drainer: Drainer) -> None:
    first = enqueue_many(engine, 3, "exp-a")
    drainer.drain_once()
    fake_stripe.expire_stream_tokens()
    second = enqueue_many(engine, 3, "exp-b")
    summary = drainer.drain_once()
    assert summary.sent == 3 and fake_stripe.stream_sessions() == 2
    assert [e["status"] for e in fake_stripe.stream_log()] == [200, 401, 200]
    for eid in first + second:
        r = row(engine, eid)
        assert (r["status"], r["attempt_count"], r["call_count"]) == ("sent", 1, 1)
        assert len(attempts_by_event(engine)[eid]) == 1


# -- lanes ----------------------------------------------------------------------------------------

def test_lanes_never_overlap_and_requests_hold_at_most_100(
        engine: Engine, fake_stripe: FakeStripe, make_drainer: Callable[..., Drainer],
        stream_settings: Settings) -> None:
    drainer = make_drainer(stream_settings.with_overrides(batch_size=600, concurrency=4))
    fake_stripe.set_latency(0.02)
    ids = enqueue_many(engine, 250, "big", tenants=1) + enqueue_many(engine, 90, "small")
    drain_all(drainer, engine, ids)
    log = fake_stripe.stream_log()
    assert all(len(e["identifiers"]) <= 100 for e in log)
    assert fake_stripe.overlaps() == {}
    assert fake_stripe.accept_count() == 340


def test_pack_keeps_each_lane_whole_in_one_request_or_its_own_job() -> None:
    lanes: list[list[Any]] = [[("a", i) for i in range(250)], [("b", i) for i in range(60)],
                              [("c", i) for i in range(50)], [("d", i) for i in range(40)]]
    jobs = pack(lanes)  # type: ignore[arg-type]
    assert [len(r) for r in jobs[0]] == [100, 100, 50]  # lane a: three requests in order
    assert sorted(len(j[0]) for j in jobs[1:]) == [50, 100] and all(len(j) == 1
                                                                    for j in jobs[1:])
    for lane in "abcd":  # each lane in one job only
        assert sum(any(e[0] == lane for r in j for e in r) for j in jobs) == 1


def test_a_timeout_is_unknown_for_each_and_the_same_identifiers_go_again(
        engine: Engine, fake_stripe: FakeStripe, make_drainer: Callable[..., Drainer],
        stream_settings: Settings) -> None:
    drainer = make_drainer(stream_settings.with_overrides(stripe_timeout_seconds=1.0))
    ids = enqueue_many(engine, 4, "slow")
    fake_stripe.fail_next("slow", seconds=2.0)  # applied, answered after our timeout
    drainer.drain_once()
    for eid in ids:
        r = row(engine, eid)
        assert (r["status"], r["last_outcome"]) == ("retrying", "unknown")
        assert r["last_error_class"] == "APIConnectionError"
    drain_all(drainer, engine, ids)
    assert fake_stripe.accept_count() == 4 and fake_stripe.stream_duplicates() == 4


# -- breaker and graceful stop --------------------------------------------------------------------

def test_an_outage_opens_the_breaker_after_a_few_requests_and_loses_nothing(
        engine: Engine, fake_stripe: FakeStripe, make_drainer: Callable[..., Drainer]) -> None:
    breaker = CircuitBreaker(window=5, min_calls=3, cooldown=0.3)
    drainer = make_drainer(breaker=breaker)
    ids = enqueue_many(engine, 12, "out")
    fake_stripe.set_outage(True)
    try:
        for _ in range(40):
            if breaker.state == "open":
                break
            drainer.drain_once()
            drainer.stopping.wait(0.05)
        assert breaker.state == "open"
        assert drainer.drain_once().skipped == "circuit breaker open"
        for eid in ids:  # refused connections: nothing left, nothing counted
            assert row(engine, eid)["attempt_count"] == 0
    finally:
        fake_stripe.set_outage(False)
    drain_all(drainer, engine, ids)
    assert breaker.state == "closed" and fake_stripe.accept_count() == 12


def test_a_stop_while_a_lane_is_sent_releases_its_later_requests_untouched(
        engine: Engine, fake_stripe: FakeStripe, make_drainer: Callable[..., Drainer],
        stream_settings: Settings) -> None:
    drainer = make_drainer(stream_settings.with_overrides(batch_size=300))
    ids = enqueue_many(engine, 250, "stop", tenants=1)  # one lane: three requests in turn
    fake_stripe.set_latency(0.3)
    timer = threading.Timer(0.15, drainer.request_stop)
    timer.start()
    summary = drainer.drain_once()
    timer.join()
    assert (summary.claimed, summary.sent, summary.released) == (250, 100, 150)
    assert len(fake_stripe.stream_log()) == 1 and fake_stripe.accept_count() == 100
    left = [row(engine, eid) for eid in ids if row(engine, eid)["status"] != "sent"]
    assert len(left) == 150
    assert {(r["status"], r["attempt_count"], r["call_count"]) for r in left} == {
        ("pending", 0, 0)}


def test_a_claim_too_short_for_one_more_request_sends_nothing(
        engine: Engine, fake_stripe: FakeStripe, drainer: Drainer) -> None:
    enqueue_many(engine, 5, "short")
    claim = claims.claim_batch(engine, worker=drainer.worker, limit=10, now=utcnow(),
                               claim_timeout_seconds=60)
    margin = drainer.settings.claim_safety_margin_seconds
    short = dataclasses.replace(claim, deadline=utcnow() + timedelta(seconds=margin - 1))
    sent = drainer.sender.send(short)
    assert fake_stripe.stream_calls() == 0 and not any(r.attempts for r in sent.results)
    assert sorted(i for r in sent.results for i in r.release) == sorted(
        e.id for e in claim.events)
    claims.release(engine, claim.token, [e.id for e in claim.events], now=utcnow())


def test_a_400_saying_the_meter_is_missing_holds_the_event_and_releases_the_rest(
        engine: Engine, fake_stripe: FakeStripe, drainer: Drainer) -> None:
    ids = enqueue_many(engine, 4, "nometer")
    before = snapshot(engine)
    fake_stripe.fail_for("nometer-2", "400")
    fake_stripe.stream_names_event = True  # the event at fault in a param: the poison below
    # replaces the message that would name it
    fake_stripe.poison(message=f"No such meter: no active meter has event_name '{METER}'.")
    summary = drainer.drain_once()
    assert (summary.claimed, summary.sent, summary.dead) == (4, 0, 0)
    assert snapshot(engine) == before  # held for the meter, or back untouched
    assert [a["outcome"] for a in attempts_by_event(engine)[ids[2]]] == ["meter_missing"]
    assert all(eid not in attempts_by_event(engine) for eid in ids if eid != ids[2])
    assert drainer.meters is not None and METER not in drainer.meters.active()


# -- the sandbox's rate -----------------------------------------------------------------------

@pytest.mark.slow  # seconds of wall time: out of `make check`
def test_a_sandbox_key_keeps_stream_requests_within_25_a_second(
        db_url: str, engine: Engine, fake_stripe: FakeStripe) -> None:
    """In a sandbox stream requests count against the basic 25 requests/s: with an
    ``sk_test_`` key and nothing set by hand, a backlog of 30 lanes (a request each, sent 8 at
    a time) goes out at no more than 25 requests in any second."""
    settings = Settings.from_env({
        "DATABASE_URL": db_url, "STRIPE_API_KEY": "sk_test_sandbox_rate_0123456789",
        "STRIPE_API_BASE": fake_stripe.base_url,
        "STRIPE_METER_EVENTS_BASE": fake_stripe.meter_events_url,
        "STRIPE_METER_EVENT_API": "v2_stream", "OUTBOX_CONCURRENCY": "8"}, testing=True)
    assert settings.stripe_max_requests_per_second <= 25
    for i in range(30):
        operations.set_tenant(engine, f"lane{i}", stripe_customer_id=f"cus_lane{i}", name=None,
                              now=utcnow())
    with Session(engine) as db, db.begin():
        ids = [int(enqueue_usage(db, tenant_id=f"lane{lane}", quantity=1,
                                 idempotency_key=f"rate-{lane}-{n}").id)
               for lane in range(30) for n in range(60)]
    drainer = Drainer(engine, settings, gateway_from(settings))
    try:
        drain_all(drainer, engine, ids)
    finally:
        drainer.close()
    started = sorted(e["started"] for e in fake_stripe.stream_log())
    assert len(started) >= 30
    busiest = max(sum(1 for t in started if s <= t < s + 1.0) for s in started)
    assert busiest <= 25, busiest
