"""Issue 3, outcome classes and the dedupe-window guard, on SQLite and PostgreSQL.

Every test drives the real ``stripe`` SDK (through ``SdkGateway``) against the loopback fake
via ``STRIPE_API_BASE``, with ``Drainer`` instances in-process; where time matters the drainer
gets an injected clock. What Stripe saw is read back from the fake (``accepted()``,
``request_log()``); what the outbox decided is read back from the tables.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from conftest import cli, wait_for, worker_env
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session
from support.fake_stripe import FakeStripe

from webapp.config import ConfigError, Settings
from webapp.models import DeliveryAttempt, OutboxEvent, utcnow
from webapp.outbox import enqueue_usage, operations
from webapp.outbox.states import DEAD_PAST_WINDOW
from webapp.read.stats import stats
from webapp.worker import Drainer, gateway_from

T = OutboxEvent.__table__
A = DeliveryAttempt.__table__
METER = "api_requests"
CUSTOMER = "cus_acme"
DUPLICATE_PREFIX = "An event already exists with identifier"


# -- helpers --------------------------------------------------------------------------------------

class Clock:
    """Real time plus an offset the test moves forward."""

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def __call__(self) -> datetime:
        return utcnow() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)


def map_tenant(engine: Engine, tenant: str = "acme", customer: str = CUSTOMER) -> None:
    operations.set_tenant(engine, tenant, stripe_customer_id=customer, name=None, now=utcnow())


def enqueue(engine: Engine, key: str, *, tenant: str = "acme", quantity: int = 3,
            meter: str = METER, occurred_at: datetime | None = None) -> int:
    with Session(engine) as db, db.begin():
        row = enqueue_usage(db, tenant_id=tenant, quantity=quantity, idempotency_key=key,
                            meter=meter, occurred_at=occurred_at)
        return int(row.id)


def row(engine: Engine, event_id: int) -> dict[str, Any]:
    with engine.connect() as conn:
        return dict(conn.execute(select(T).where(T.c.id == event_id)).mappings().one())


def attempts(engine: Engine, event_id: int) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(
            select(A).where(A.c.event_id == event_id).order_by(A.c.id)).mappings()]


def calls_for(fake: FakeStripe, identifier: str) -> list[dict[str, Any]]:
    return [e for e in fake.request_log() if e["identifier"] == identifier]


def drain_until(drainer: Drainer, engine: Engine, event_id: int, status: str = "sent",
                timeout: float = 20.0) -> None:
    def done() -> bool:
        drainer.drain_once()
        return row(engine, event_id)["status"] == status

    wait_for(done, timeout, interval=0.02, message=f"event {event_id} to become {status}")


#: The fields a systemic failure must leave exactly as they were.
UNTOUCHED = ("status", "attempt_count", "call_count", "key_generation", "next_attempt_at",
             "first_unknown_at", "dead_reason", "last_outcome", "sent_at")


def snapshot(engine: Engine) -> dict[int, tuple[Any, ...]]:
    with engine.connect() as conn:
        rows = conn.execute(select(T.c.id, *[T.c[c] for c in UNTOUCHED])).all()
    return {r[0]: tuple(r[1:]) for r in rows}


@pytest.fixture
def make_drainer(engine: Engine) -> Iterator[Callable[..., Drainer]]:
    made: list[Drainer] = []

    def make(settings: Settings, **kw: Any) -> Drainer:
        d = Drainer(engine, settings, gateway_from(settings), **kw)
        if d.meters is not None:
            d.meters.active()  # a worker reads Stripe's meters as it starts
        made.append(d)
        return d

    yield make
    for d in made:
        d.close()


@pytest.fixture
def drainer(make_drainer: Callable[..., Drainer], settings: Settings) -> Drainer:
    return make_drainer(settings)


@pytest.fixture(autouse=True)
def _tenant(engine: Engine) -> None:
    map_tenant(engine)


# -- delivered ------------------------------------------------------------------------------------

def test_200_is_sent_with_the_events_fields(engine: Engine, fake_stripe: FakeStripe,
                                            drainer: Drainer) -> None:
    at = utcnow().replace(microsecond=0) - timedelta(hours=2)
    eid = enqueue(engine, "ok-1", quantity=42, occurred_at=at)
    summary = drainer.drain_once()
    assert (summary.claimed, summary.sent, summary.calls) == (1, 1, 1)
    r = row(engine, eid)
    assert (r["status"], r["attempt_count"], r["call_count"]) == ("sent", 1, 1)
    assert r["sent_at"] is not None and r["processing_deadline_at"] is None
    got = fake_stripe.accepted()["ok-1"]
    assert (got.customer, got.event_name, got.value, got.timestamp) == (
        CUSTOMER, METER, "42", int(at.timestamp()))
    [att] = attempts(engine, eid)
    assert (att["outcome"], att["counted"], att["http_status"], att["applied"]) == (
        "delivered", True, 200, True)
    assert att["idempotency_key"] == "ok-1"


def test_lost_response_is_retried_with_the_same_key_and_stripe_replays_it(
        engine: Engine, fake_stripe: FakeStripe, drainer: Drainer) -> None:
    eid = enqueue(engine, "drop-1")
    fake_stripe.fail_next("drop")  # applied, then the connection closes without an answer
    drainer.drain_once()
    r = row(engine, eid)
    assert (r["status"], r["last_outcome"], r["attempt_count"]) == ("retrying", "unknown", 1)
    assert r["first_unknown_at"] is not None and r["key_generation"] == 0
    drain_until(drainer, engine, eid)
    log = calls_for(fake_stripe, "drop-1")
    assert [e["idempotency_key"] for e in log] == ["drop-1", "drop-1"]
    assert log[1]["status"] == 200 and log[1]["replayed"] is True
    assert fake_stripe.accept_count() == 1 and list(fake_stripe.accepted()) == ["drop-1"]
    assert [a["outcome"] for a in attempts(engine, eid)] == ["unknown", "delivered"]


def test_lost_response_then_a_fresh_key_meets_the_duplicate_identifier_400(
        engine: Engine, fake_stripe: FakeStripe, make_drainer: Callable[..., Drainer],
        settings: Settings) -> None:
    """The response is lost, the event exhausts its budget (one attempt), a person requeues it
    (a fresh transport key): Stripe answers "An event already exists with identifier …", which
    means delivered. Stripe still has it once."""
    drainer = make_drainer(settings.with_overrides(max_attempts=1))
    eid = enqueue(engine, "drop-2")
    fake_stripe.fail_next("drop")
    drainer.drain_once()
    r = row(engine, eid)
    assert r["status"] == "dead" and r["dead_reason"].startswith("retries exhausted")
    operations.requeue(engine, [eid], actor="test", now=utcnow(),
                window_seconds=settings.dedupe_window_seconds)
    drain_until(drainer, engine, eid)
    log = calls_for(fake_stripe, "drop-2")
    assert len(log) == 2 and log[0]["idempotency_key"] != log[1]["idempotency_key"]
    assert log[1]["status"] == 400 and log[1]["replayed"] is False
    assert fake_stripe.duplicate_identifier_rejections() == 1
    assert fake_stripe.accept_count() == 1
    last = attempts(engine, eid)[-1]
    assert last["outcome"] == "delivered" and last["http_status"] == 400
    assert last["error_message"].startswith(f"{DUPLICATE_PREFIX} drop-2")
    assert row(engine, eid)["status"] == "sent"


def test_saved_500_is_not_replayed_a_fresh_key_delivers_it_once(
        engine: Engine, fake_stripe: FakeStripe, drainer: Drainer) -> None:
    eid = enqueue(engine, "s500-1")
    fake_stripe.fail_next("500", apply=False)
    drainer.drain_once()
    r = row(engine, eid)
    assert (r["status"], r["last_outcome"], r["last_http_status"]) == ("retrying", "unknown", 500)
    assert r["key_generation"] == 1 and r["attempt_count"] == 1
    drain_until(drainer, engine, eid)
    log = calls_for(fake_stripe, "s500-1")
    assert [e["status"] for e in log] == [500, 200]
    assert log[0]["idempotency_key"] != log[1]["idempotency_key"]
    assert log[1]["replayed"] is False
    assert fake_stripe.accept_count() == 1
    r = row(engine, eid)
    assert (r["status"], r["attempt_count"], r["call_count"]) == ("sent", 2, 2)
    assert [a["idempotency_key"] for a in attempts(engine, eid)] == [e["idempotency_key"]
                                                                     for e in log]


def test_500_after_applying_then_fresh_key_gets_duplicate_identifier_and_is_sent(
        engine: Engine, fake_stripe: FakeStripe, drainer: Drainer) -> None:
    eid = enqueue(engine, "a500-1")
    fake_stripe.fail_next("500", apply=True)
    drain_until(drainer, engine, eid)
    log = calls_for(fake_stripe, "a500-1")
    assert [e["status"] for e in log] == [500, 400]
    assert log[0]["idempotency_key"] != log[1]["idempotency_key"]
    assert fake_stripe.accept_count() == 1 and fake_stripe.duplicate_identifier_rejections() == 1
    assert [a["outcome"] for a in attempts(engine, eid)] == ["unknown", "delivered"]


def test_timeout_is_retried_with_the_same_key(
        engine: Engine, fake_stripe: FakeStripe, make_drainer: Callable[..., Drainer],
        settings: Settings) -> None:
    drainer = make_drainer(settings.with_overrides(stripe_timeout_seconds=1.0))
    eid = enqueue(engine, "slow-1")
    fake_stripe.fail_next("slow", seconds=2.0)  # applied, answered after our timeout
    drainer.drain_once()
    r = row(engine, eid)
    assert (r["status"], r["last_outcome"], r["key_generation"]) == ("retrying", "unknown", 0)
    assert r["last_error_class"] == "APIConnectionError"
    drain_until(drainer, engine, eid)
    log = calls_for(fake_stripe, "slow-1")
    assert len(log) >= 2
    assert {e["idempotency_key"] for e in log} == {"slow-1"}
    assert fake_stripe.accept_count() == 1 and fake_stripe.duplicate_identifier_rejections() == 0
    assert log[-1]["status"] == 200 and log[-1]["replayed"] is True


# -- not executed ---------------------------------------------------------------------------------

def test_429_honours_retry_after_and_is_not_counted(
        engine: Engine, fake_stripe: FakeStripe, make_drainer: Callable[..., Drainer],
        settings: Settings) -> None:
    # Retry-After is honoured up to OUTBOX_MAX_BACKOFF_SECONDS (test_states pins the cap).
    clock = Clock()
    drainer = make_drainer(settings.with_overrides(max_backoff_seconds=10.0), clock=clock)
    eid = enqueue(engine, "r429-1")
    fake_stripe.fail_next("429", retry_after=3)
    before = utcnow()
    drainer.drain_once()
    r = row(engine, eid)
    assert (r["status"], r["attempt_count"], r["call_count"]) == ("retrying", 0, 1)
    assert r["next_attempt_at"] >= before + timedelta(seconds=3)
    assert r["first_unknown_at"] is None
    [att] = attempts(engine, eid)
    assert (att["outcome"], att["counted"], att["http_status"]) == ("not_executed", False, 429)
    calls = fake_stripe.calls()
    assert drainer.drain_once().claimed == 0 and fake_stripe.calls() == calls
    clock.advance(3.5)
    drain_until(drainer, engine, eid)
    r = row(engine, eid)
    assert (r["attempt_count"], r["call_count"]) == (1, 2)
    assert [e["idempotency_key"] for e in calls_for(fake_stripe, "r429-1")] == ["r429-1"] * 2


@pytest.mark.parametrize("kind", ["409", "503", "refused"])
def test_not_executed_is_retried_and_not_counted(
        kind: str, engine: Engine, fake_stripe: FakeStripe, drainer: Drainer) -> None:
    eid = enqueue(engine, f"ne-{kind}")
    if kind == "refused":
        fake_stripe.set_outage(True)
    else:
        fake_stripe.fail_next(kind)
    drainer.drain_once()
    if kind == "refused":
        fake_stripe.set_outage(False)
    r = row(engine, eid)
    assert (r["status"], r["attempt_count"], r["call_count"]) == ("retrying", 0, 1)
    assert r["first_unknown_at"] is None and r["key_generation"] == 0
    [att] = attempts(engine, eid)
    assert (att["outcome"], att["counted"]) == ("not_executed", False)
    assert att["http_status"] == (None if kind == "refused" else int(kind))
    drain_until(drainer, engine, eid)
    r = row(engine, eid)
    assert (r["attempt_count"], r["call_count"]) == (1, 2)
    assert fake_stripe.accept_count() == 1
    keys = [a["idempotency_key"] for a in attempts(engine, eid)]
    assert keys == [f"ne-{kind}"] * 2


# -- permanent ------------------------------------------------------------------------------------

def test_old_timestamp_400_is_dead_at_once_with_stripes_details(
        engine: Engine, fake_stripe: FakeStripe, drainer: Drainer, db_url: str) -> None:
    eid = enqueue(engine, "old-1")
    with engine.begin() as conn:
        conn.execute(update(T).where(T.c.id == eid)
                     .values(occurred_at=utcnow() - timedelta(days=40)))
    summary = drainer.drain_once()
    assert summary.dead == 1
    r = row(engine, eid)
    [call] = calls_for(fake_stripe, "old-1")
    assert call["status"] == 400
    assert (r["status"], r["attempt_count"], r["last_outcome"]) == ("dead", 1, "permanent")
    assert "35 days" in r["last_error_message"] and r["dead_reason"] == r["last_error_message"]
    assert r["last_error_code"] == "timestamp_too_far_in_past"
    assert r["last_request_id"] == call["request_id"] and r["last_request_id"].startswith("req_")
    assert r["last_http_status"] == 400 and r["last_error_class"] == "InvalidRequestError"
    assert fake_stripe.accept_count() == 0
    drainer.drain_once()
    assert len(calls_for(fake_stripe, "old-1")) == 1  # never resent

    # A requeue of it is refused with the reason (ops and CLI); nothing changes.
    with pytest.raises(operations.OperationError, match="more than 35 days ago"):
        operations.requeue(engine, [eid], actor="test", now=utcnow(),
                    window_seconds=drainer.settings.dedupe_window_seconds)
    done = cli("requeue", str(eid), env=worker_env(db_url, fake_stripe.base_url))
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "more than 35 days ago" in lines[0]
    assert row(engine, eid)["status"] == "dead"


def test_an_event_of_a_meter_stripe_does_not_have_waits_untouched(
        engine: Engine, fake_stripe: FakeStripe, drainer: Drainer) -> None:
    """Its meter is not among Stripe's: not claimed, not sent, not dead — it waits (and
    the dashboard names the meter); nothing else is paused."""
    eid = enqueue(engine, "nometer-1", meter="no_such_meter")
    other = enqueue(engine, "meter-ok-1")
    drainer.drain_once()
    r = row(engine, eid)
    assert (r["status"], r["call_count"], r["last_outcome"]) == ("pending", 0, None)
    assert row(engine, other)["status"] == "sent"
    assert [e["identifier"] for e in fake_stripe.request_log()] == ["meter-ok-1"]
    assert stats(engine, now=utcnow())["paused"] is False


def test_idempotency_error_is_dead_and_logged_as_an_error(
        engine: Engine, fake_stripe: FakeStripe, drainer: Drainer,
        caplog: pytest.LogCaptureFixture) -> None:
    eid = enqueue(engine, "idem-1", quantity=5)
    fake_stripe.fail_next("500", apply=False)  # saved under key "idem-1"
    drainer.drain_once()
    assert row(engine, eid)["key_generation"] == 1
    # A bug: the row's content changes and the old key is used again.
    with engine.begin() as conn:
        conn.execute(update(T).where(T.c.id == eid)
                     .values(quantity=6, key_generation=0, next_attempt_at=utcnow()))
    caplog.set_level(logging.ERROR)
    drain_until(drainer, engine, eid, status="dead")
    r = row(engine, eid)
    last = calls_for(fake_stripe, "idem-1")[-1]
    assert last["idempotency_key"] == "idem-1" and last["status"] == 400
    assert (r["last_outcome"], r["last_error_class"]) == ("permanent", "IdempotencyError")
    assert "Keys for idempotent requests" in r["dead_reason"]
    assert r["last_request_id"] == last["request_id"]
    errors = [rec for rec in caplog.records
              if rec.levelno >= logging.ERROR and "idempotency_error" in rec.getMessage()]
    assert errors, [rec.getMessage() for rec in caplog.records]
    assert fake_stripe.accept_count() == 0


# -- systemic -------------------------------------------------------------------------------------

def _three_lanes(engine: Engine) -> list[int]:
    map_tenant(engine, "beta", "cus_beta")
    return [enqueue(engine, f"sys-{i}", tenant=("acme", "beta")[i % 2]) for i in range(6)]


@pytest.mark.parametrize("status", [401, 403])
def test_auth_failure_pauses_everyone_and_changes_no_event(
        status: int, engine: Engine, fake_stripe: FakeStripe, drainer: Drainer, db_url: str,
        caplog: pytest.LogCaptureFixture) -> None:
    ids = _three_lanes(engine)
    before = snapshot(engine)
    fake_stripe.set_auth_failure(status)
    caplog.set_level(logging.WARNING)
    drainer.drain_once()
    assert fake_stripe.calls() >= 1
    assert snapshot(engine) == before
    assert all(a["outcome"] == "systemic" for i in ids for a in attempts(engine, i))
    data = stats(engine, now=utcnow())
    assert data["paused"] is True and str(status) in data["pause_reason"]
    assert data["pause_kind"] == "systemic"
    assert any("paused" in rec.getMessage() and str(status) in rec.getMessage()
               for rec in caplog.records if rec.levelno >= logging.ERROR)

    # Paused: nobody sends (no probe yet), nothing changes.
    calls = fake_stripe.calls()
    summary = drainer.drain_once()
    assert summary.paused and summary.claimed == 0 and fake_stripe.calls() == calls
    assert snapshot(engine) == before

    fake_stripe.set_auth_failure(None)
    if status == 401:  # the operator's view and command, as processes (once is enough)
        env = worker_env(db_url, fake_stripe.base_url)
        out = cli("stats", "--json", env=env)
        assert out.returncode == 0, out.stderr
        shown = json.loads(out.stdout)
        assert shown["paused"] is True and str(status) in shown["pause_reason"]
        assert shown["counts"]["pending"] == len(ids)
        done = cli("resume", env=env)
        assert done.returncode == 0, done.stderr
        assert json.loads(cli("stats", "--json", env=env).stdout)["paused"] is False
    else:
        assert operations.resume(engine, actor="test", now=utcnow()) is True
    assert stats(engine, now=utcnow())["paused"] is False
    wait_for(lambda: drainer.drain_once() is not None and fake_stripe.accept_count() == len(ids),
             15, message="everything sent after resume")
    assert all(row(engine, i)["status"] == "sent" and row(engine, i)["attempt_count"] == 1
               for i in ids)


def test_probe_resumes_a_systemic_pause_once_stripe_recovers(
        engine: Engine, fake_stripe: FakeStripe, drainer: Drainer) -> None:
    ids = _three_lanes(engine)
    before = snapshot(engine)
    fake_stripe.set_auth_failure(401)
    drainer.drain_once()
    assert stats(engine, now=utcnow())["paused"] is True
    drainer.probe_interval_seconds = 0
    calls = fake_stripe.calls()
    summary = drainer.drain_once()  # a probe, still failing: one call, nothing changes
    assert summary.paused and summary.claimed == 1
    assert fake_stripe.calls() == calls + 1 and snapshot(engine) == before
    assert stats(engine, now=utcnow())["paused"] is True

    fake_stripe.set_auth_failure(None)
    summary = drainer.drain_once()
    assert summary.claimed == 1 and summary.sent == 1 and summary.paused is False
    assert stats(engine, now=utcnow())["paused"] is False
    wait_for(lambda: drainer.drain_once() is not None and fake_stripe.accept_count() == len(ids),
             15, message="everything sent after the probe")


def test_a_person_pause_is_not_lifted_by_a_probe(
        engine: Engine, fake_stripe: FakeStripe, drainer: Drainer) -> None:
    enqueue(engine, "op-1")
    operations.pause(engine, actor="test", reason="maintenance", now=utcnow())
    drainer.probe_interval_seconds = 0
    assert drainer.drain_once().claimed == 0 and fake_stripe.calls() == 0
    assert stats(engine, now=utcnow())["pause_reason"] == "maintenance"


def test_404_on_the_endpoint_is_systemic(
        engine: Engine, fake_stripe: FakeStripe, make_drainer: Callable[..., Drainer],
        settings: Settings) -> None:
    ids = _three_lanes(engine)
    before = snapshot(engine)
    drainer = make_drainer(settings.with_overrides(
        stripe_api_base=fake_stripe.base_url + "/wrong-prefix"))
    drainer.drain_once()
    assert snapshot(engine) == before
    data = stats(engine, now=utcnow())
    assert data["paused"] is True and "404" in data["pause_reason"]
    assert fake_stripe.accept_count() == 0 and ids


def test_a_missing_default_meter_holds_its_events_until_it_exists(
        engine: Engine, fake_stripe: FakeStripe, make_drainer: Callable[..., Drainer],
        settings: Settings) -> None:
    """Every event on the configured default meter would be rejected alike: they wait,
    untouched, with sending running for the other meters, and go out once it exists."""
    drainer = make_drainer(settings.with_overrides(stripe_meter_event_name="cpu_seconds"))
    ids = [enqueue(engine, f"meter-{i}", meter="cpu_seconds") for i in range(4)]
    before = snapshot(engine)
    drainer.drain_once()
    assert fake_stripe.calls() == 0 and snapshot(engine) == before
    data = stats(engine, now=utcnow())
    assert data["paused"] is False and data["counts"]["dead"] == 0
    fake_stripe.add_meter("cpu_seconds")
    gateway = drainer.gateway
    assert drainer.meters is not None and gateway is not None
    drainer.meters.refresher.run_once()    # the schedule's next read of Stripe's meters
    drainer.meters.invalidate()
    wait_for(lambda: drainer.drain_once() is not None and fake_stripe.accept_count() == len(ids),
             15, message="everything sent once the meter exists")


# -- the dedupe window ----------------------------------------------------------------------------

def _unknown_event(engine: Engine, fake: FakeStripe, drainer: Drainer, key: str) -> int:
    eid = enqueue(engine, key)
    fake.fail_next("500", apply=False)
    drainer.drain_once()
    r = row(engine, eid)
    assert r["status"] == "retrying" and r["first_unknown_at"] is not None
    return eid


def test_unknown_outcome_past_the_window_is_never_resent(
        engine: Engine, fake_stripe: FakeStripe, make_drainer: Callable[..., Drainer],
        settings: Settings, db_url: str) -> None:
    clock = Clock()
    drainer = make_drainer(settings, clock=clock)
    eid = _unknown_event(engine, fake_stripe, drainer, "win-1")
    calls = fake_stripe.calls()
    clock.advance(settings.dedupe_window_seconds + 60)
    summary = drainer.drain_once()
    assert summary.claimed == 1 and summary.dead == 1 and summary.calls == 0
    assert fake_stripe.calls() == calls
    r = row(engine, eid)
    assert (r["status"], r["dead_reason"]) == ("dead", DEAD_PAST_WINDOW)
    assert r["dead_reason"] == "outcome unknown past Stripe's dedupe window"
    clock.advance(3600)
    drainer.drain_once()
    assert fake_stripe.calls() == calls

    env = worker_env(db_url, fake_stripe.base_url)
    refused = cli("requeue", str(eid), env=env)
    assert refused.returncode != 0
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "--force" in lines[0] and "twice" in lines[0], lines
    assert row(engine, eid)["status"] == "dead"

    forced = cli("requeue", str(eid), "--force", env=env)
    assert forced.returncode == 0, forced.stderr
    assert "bills twice" in forced.stderr
    r = row(engine, eid)
    assert (r["status"], r["attempt_count"], r["first_unknown_at"]) == ("pending", 0, None)
    # The forced resend goes out (its first try never landed: Stripe takes it once).
    clock.offset = timedelta(0)
    drain_until(drainer, engine, eid)
    assert fake_stripe.accept_count() == 1


def test_unknown_outcome_inside_the_window_is_resent(
        engine: Engine, fake_stripe: FakeStripe, make_drainer: Callable[..., Drainer],
        settings: Settings) -> None:
    clock = Clock()
    drainer = make_drainer(settings, clock=clock)
    eid = _unknown_event(engine, fake_stripe, drainer, "win-2")
    clock.advance(settings.dedupe_window_seconds - 120)
    drain_until(drainer, engine, eid)
    assert len(calls_for(fake_stripe, "win-2")) == 2


def test_a_retry_that_would_land_past_the_window_goes_dead_instead(
        engine: Engine, fake_stripe: FakeStripe, make_drainer: Callable[..., Drainer],
        settings: Settings) -> None:
    clock = Clock()
    drainer = make_drainer(settings, clock=clock)
    eid = _unknown_event(engine, fake_stripe, drainer, "win-3")
    clock.advance(settings.dedupe_window_seconds - 0.05)  # next backoff ≥ 0.1 s
    fake_stripe.fail_next("500", apply=False)
    drainer.drain_once()  # another unknown; its backoff would cross the window
    r = row(engine, eid)
    assert (r["status"], r["dead_reason"]) == ("dead", DEAD_PAST_WINDOW)
    assert fake_stripe.accept_count() == 0


def test_requeue_keeps_identifier_customer_and_timestamp_and_resets_the_budget(
        engine: Engine, fake_stripe: FakeStripe, make_drainer: Callable[..., Drainer],
        settings: Settings, db_url: str) -> None:
    drainer = make_drainer(settings.with_overrides(max_attempts=2))
    at = utcnow().replace(microsecond=0) - timedelta(days=3)
    eid = enqueue(engine, "rq-1", quantity=9, occurred_at=at)
    fake_stripe.fail_next("502", count=2, apply=False)
    drain_until(drainer, engine, eid, status="dead")
    dead = row(engine, eid)
    assert dead["attempt_count"] == 2 and dead["dead_reason"].startswith("retries exhausted")
    map_tenant(engine, "acme", "cus_someone_else")  # a later mapping change
    done = cli("requeue", str(eid), env=worker_env(db_url, fake_stripe.base_url))
    assert done.returncode == 0, done.stderr
    r = row(engine, eid)
    assert (r["status"], r["attempt_count"]) == ("pending", 0)
    assert (r["idempotency_key"], r["stripe_customer_id"], r["occurred_at"], r["tenant_id"]) == (
        "rq-1", CUSTOMER, at, "acme")
    assert r["key_generation"] > dead["key_generation"]
    drain_until(drainer, engine, eid)
    got = fake_stripe.accepted()["rq-1"]
    assert (got.customer, got.timestamp, got.value) == (CUSTOMER, int(at.timestamp()), "9")
    keys = [e["idempotency_key"] for e in calls_for(fake_stripe, "rq-1")]
    assert len(set(keys)) == len(keys) == 3


def test_backoff_whose_horizon_exceeds_the_window_is_refused_at_start(
        db_url: str, fake_stripe: FakeStripe) -> None:
    env = {"DATABASE_URL": db_url, "OUTBOX_MAX_ATTEMPTS": "60",
           "OUTBOX_MAX_BACKOFF_SECONDS": "3600", "OUTBOX_DEDUPE_WINDOW": "23h"}
    with pytest.raises(ConfigError, match="OUTBOX_DEDUPE_WINDOW"):
        Settings.from_env(env)
    ok = dict(env, OUTBOX_MAX_ATTEMPTS="12")
    assert Settings.from_env(ok).retry_horizon_seconds() < 23 * 3600
    # A shorter window makes the default budget unsafe too.
    with pytest.raises(ConfigError, match="retry horizon"):
        Settings.from_env({"DATABASE_URL": db_url, "OUTBOX_DEDUPE_WINDOW": "1h"})

    wenv = worker_env(db_url, fake_stripe.base_url, OUTBOX_MAX_ATTEMPTS="60",
                      OUTBOX_MAX_BACKOFF_SECONDS="3600")
    done = cli("worker", env=wenv, timeout=30)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "OUTBOX_DEDUPE_WINDOW" in lines[0], lines
    assert fake_stripe.calls() == 0
