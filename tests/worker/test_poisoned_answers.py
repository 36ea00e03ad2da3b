"""Poisoned answers: whatever Stripe sends back (a 300-character error code, a 400-character
request id, a 5,000-character message with emoji, a NUL or a lone surrogate; error reports,
meter listings and summaries errors full of them), recording what came of it never fails.
Each event moves on as its outcome class says, with Stripe's values cut to their columns,
keeping the start.

On SQLite and PostgreSQL (which enforces ``varchar(n)`` and refuses NUL in text), through the
real SDK against the fake (``FakeStripe.poison``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from conftest import make_settings
from flask import Flask
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session
from support.fake_stripe import AsyncError, FakeStripe

from webapp import create_app
from webapp.db import reading
from webapp.models import (
    AuditEntry,
    DeliveryAttempt,
    OutboxEvent,
    ReconciliationRun,
    StripeErrorSample,
    StripeEvent,
    StripeMeter,
    SyncState,
    utcnow,
)
from webapp.outbox import control, enqueue_usage, operations
from webapp.outbox.meters import known_meters
from webapp.worker import (
    Drainer,
    EventPoller,
    MeterRefresher,
    cancel_events,
    gateway_from,
    reconcile,
)

T = OutboxEvent.__table__
A = DeliveryAttempt.__table__
SECRET = "whsec_test_0123456789abcdef"

LONG_CODE = "code_" + "c" * 295                                   # 300 characters
LONG_REQUEST_ID = "req_" + "r" * 396                              # 400 characters
#: 5,000 characters: an emoji, a NUL and a lone surrogate (JSON-escaped on the wire) early on.
LONG_MESSAGE = ("Invalid value 😀 nul:\x00 half:\ud800 end. " + "m" * 5000)[:5000]
EXPECTED_MESSAGE = "Invalid value 😀 nul:\ufffd half:\ufffd end. "


@pytest.fixture
def fake() -> Iterator[FakeStripe]:
    with FakeStripe() as f:
        yield f


@pytest.fixture
def settings(db_url: str, fake: FakeStripe) -> Any:
    return make_settings(db_url, stripe_api_base=fake.base_url, stripe_webhook_secret=SECRET)


@pytest.fixture
def drainer(engine: Engine, settings: Any) -> Iterator[Drainer]:
    operations.set_tenant(engine, "acme", stripe_customer_id="cus_acme", name=None,
                          now=utcnow())
    d = Drainer(engine, settings, gateway_from(settings))
    yield d
    d.close()


def enqueue(engine: Engine, key: str, **kw: Any) -> int:
    with Session(engine) as db, db.begin():
        return int(enqueue_usage(db, tenant_id=kw.get("tenant", "acme"), quantity=3,
                                 idempotency_key=key, **{k: v for k, v in kw.items()
                                                         if k != "tenant"}).id)


def row(engine: Engine, event_id: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(T).where(T.c.id == event_id)).one()


def attempts(engine: Engine, event_id: int) -> list[Any]:
    with engine.connect() as conn:
        return conn.execute(select(A).where(A.c.event_id == event_id).order_by(A.c.id)).all()


def assert_cut_message(text: str | None, limit: int) -> None:
    assert text is not None and len(text) <= limit
    assert text.startswith(EXPECTED_MESSAGE) and "\x00" not in text


# -- sending ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("fault", "status", "outcome", "counted"), [
    ("400", "dead", "permanent", True),           # the audit's case: a permanent refusal
    ("500", "retrying", "unknown", True),         # outcome unknown, a fresh key next
    ("503", "retrying", "not_executed", False),
    ("429", "retrying", "not_executed", False),
    ("409", "retrying", "not_executed", False),
])
def test_an_error_with_poisoned_fields_moves_the_event_on_with_them_cut(
        engine: Engine, fake: FakeStripe, drainer: Drainer, fault: str, status: str,
        outcome: str, counted: bool) -> None:
    eid = enqueue(engine, f"poison:{fault}")
    fake.poison(code=LONG_CODE, request_id=LONG_REQUEST_ID, message=LONG_MESSAGE)
    fake.fail_next(fault)
    summary = drainer.drain_once()
    assert (summary.claimed, summary.calls, summary.fenced) == (1, 1, 0)
    r = row(engine, eid)
    assert (r.status, r.last_outcome, r.last_http_status) == (status, outcome, int(fault))
    assert r.claim_token is None and r.processing_deadline_at is None
    assert r.last_error_code == LONG_CODE[:100]
    assert r.last_request_id == LONG_REQUEST_ID[:255]
    assert_cut_message(r.last_error_message, 2000)
    if status == "dead":
        assert_cut_message(r.dead_reason, 2000)
    [att] = attempts(engine, eid)
    assert (att.outcome, att.counted, att.applied) == (outcome, counted, True)
    assert att.error_code == LONG_CODE[:100] and att.stripe_request_id == LONG_REQUEST_ID[:255]
    assert_cut_message(att.error_message, 2000)
    if status == "retrying":        # and once Stripe answers plainly, it is sent
        fake.poison()
        with engine.begin() as conn:
            conn.execute(T.update().where(T.c.id == eid).values(next_attempt_at=utcnow()))
        drainer.drain_once()
        r = row(engine, eid)
        assert (r.status, r.last_error_code, r.last_request_id) == ("sent", None, None)


def test_a_200_with_a_400_character_request_id_is_sent(engine: Engine, fake: FakeStripe,
                                                       drainer: Drainer) -> None:
    eid = enqueue(engine, "poison:200")
    fake.poison(request_id=LONG_REQUEST_ID)
    assert drainer.drain_once().sent == 1
    assert row(engine, eid).status == "sent"
    [att] = attempts(engine, eid)
    assert (att.outcome, att.http_status) == ("delivered", 200)
    assert att.stripe_request_id == LONG_REQUEST_ID[:255]


def test_a_lost_connection_is_retried_and_a_poisoned_401_pauses_with_a_clean_reason(
        engine: Engine, fake: FakeStripe, drainer: Drainer) -> None:
    """The timeout path carries nothing of Stripe's; a systemic answer's message is kept as
    the pause's reason, cut and cleaned, and the event is released untouched."""
    eid = enqueue(engine, "poison:drop")
    fake.fail_next("drop_before")
    drainer.drain_once()
    assert row(engine, eid).status == "retrying"
    with engine.begin() as conn:
        conn.execute(T.update().where(T.c.id == eid).values(next_attempt_at=utcnow()))
    fake.poison(code=LONG_CODE, request_id=LONG_REQUEST_ID, message=LONG_MESSAGE)
    fake.set_auth_failure(401)
    drainer.drain_once()
    assert row(engine, eid).status == "retrying"
    with reading(engine) as conn:
        state = control.pause_state(conn)
    assert state.paused and state.reason is not None
    assert EXPECTED_MESSAGE in state.reason and "\x00" not in state.reason


# -- cancelling -------------------------------------------------------------------------------

#: A status and an adjustment id as a poisoned answer would carry them.
POISONED_STATUS = "complete nul:\x00 half:\ud800 " + "s" * 300
POISONED_ID = "mea_😀 nul:\x00 half:\ud800 " + "i" * 400


@pytest.mark.parametrize("with_id", [False, True], ids=["request-id", "adjustment-id"])
def test_a_cancel_answered_with_a_poisoned_status_and_id_is_recorded_with_them_cut(
        engine: Engine, fake: FakeStripe, drainer: Drainer, settings: Any,
        with_id: bool) -> None:
    eid = enqueue(engine, "poison:cancel")
    assert drainer.drain_once().sent == 1
    fake.poison(request_id=LONG_REQUEST_ID)
    fake.answer_adjustments(status=POISONED_STATUS, ids=POISONED_ID if with_id else False)
    gateway = gateway_from(settings)
    assert gateway is not None
    try:
        out = cancel_events(engine, gateway, [eid], actor="ops@example.com",
                            reason="duplicate", note="poisoned answer", now=utcnow())
    finally:
        gateway.close()
    assert (out.cancelled, out.refused) == ([eid], [])
    r = row(engine, eid)
    status = "complete nul:\ufffd half:\ufffd " + "s" * 300
    reference = ("mea_😀 nul:\ufffd half:\ufffd " + "i" * 400 if with_id else LONG_REQUEST_ID)
    assert r.status == "cancelled"
    assert (r.cancel_adjustment_status, r.cancel_adjustment_id) == (status[:20],
                                                                    reference[:255])
    with engine.connect() as conn:
        [note] = conn.execute(select(AuditEntry.__table__.c.note)
                              .where(AuditEntry.__table__.c.action == "cancel")).scalars()
    assert note == (f"poisoned answer\nStripe answered: event {eid}: adjustment "
                    f"{status[:20]}, id {reference[:255]}")


# -- error reports --------------------------------------------------------------------------

def poll(engine: Engine, settings: Any) -> dict[str, int]:
    gateway = gateway_from(settings)
    assert gateway is not None
    try:
        return EventPoller(engine, gateway).run_once().as_dict()
    finally:
        gateway.close()


def test_a_report_with_poisoned_fields_rejects_the_event_with_them_cut(
        engine: Engine, fake: FakeStripe, settings: Any, drainer: Drainer) -> None:
    eid = enqueue(engine, "poison:report")
    drainer.drain_once()
    assert row(engine, eid).status == "sent"
    long_id = "evt_" + "e" * 296
    fake.report_errors([AsyncError("api_requests", LONG_CODE, LONG_MESSAGE, "poison:report"),
                        AsyncError("api_requests", LONG_CODE, "x", "i" * 300),
                        AsyncError("api_requests", LONG_CODE, "y", "nul\x00" + "j" * 20)],
                       event_id=long_id, summary=LONG_MESSAGE * 3)
    assert poll(engine, settings) == {"events": 1, "rejected": 1, "unmatched": 2}
    r = row(engine, eid)
    assert (r.status, r.reject_code) == ("rejected", LONG_CODE[:100])
    assert_cut_message(r.reject_message, 2000)
    # A report id too long for its key column keeps its start plus a digest of the whole.
    assert len(r.reject_event_id) == 255 and r.reject_event_id.startswith(long_id[:200])
    with engine.connect() as conn:
        [stored] = conn.execute(select(StripeEvent.__table__)).all()
        samples = conn.execute(select(StripeErrorSample.__table__)
                               .order_by(StripeErrorSample.__table__.c.id)).all()
    assert stored.id == r.reject_event_id and stored.error_count == 3
    assert len(stored.summary) == 2000 and "\x00" not in stored.summary
    assert {s.stripe_event_id for s in samples} == {stored.id}
    assert [s.code for s in samples] == [LONG_CODE[:100]] * 3
    assert [s.identifier for s in samples] == ["poison:report", "i" * 255,
                                               "nul\ufffd" + "j" * 20]
    # Listed again, it is known by its key: stored once.
    assert poll(engine, settings) == {"events": 0, "rejected": 0, "unmatched": 0}
    # Another id with the same 300-character start is another report, not a duplicate.
    fake.report_errors([AsyncError("api_requests", "c", "m", "nobody")],
                       event_id=long_id + "-2")
    assert poll(engine, settings) == {"events": 1, "rejected": 0, "unmatched": 1}
    with engine.connect() as conn:
        assert len(set(conn.execute(select(StripeEvent.__table__.c.id)).scalars())) == 2


@pytest.fixture
def web(engine: Engine, settings: Any) -> Flask:
    return create_app({"TESTING": True}, settings=settings, engine=engine, start_drainer=False)


def test_a_pushed_report_with_a_long_id_is_stored_once(engine: Engine, fake: FakeStripe,
                                                       web: Flask, drainer: Drainer) -> None:
    eid = enqueue(engine, "poison:push")
    drainer.drain_once()
    event_id = fake.report_errors([AsyncError("api_requests", LONG_CODE, LONG_MESSAGE,
                                              "poison:push")], event_id="evt_" + "p" * 400)
    body, signature = fake.signed_push(event_id, SECRET)
    client = web.test_client()
    resp = client.post("/stripe/webhook", data=body, headers={"Stripe-Signature": signature})
    assert resp.status_code == 200 and resp.get_json()["status"] == "stored"
    assert (row(engine, eid).status, row(engine, eid).reject_code) == ("rejected",
                                                                       LONG_CODE[:100])
    again = client.post("/stripe/webhook", data=body, headers={"Stripe-Signature": signature})
    assert again.status_code == 200 and again.get_json()["status"] == "duplicate"


# -- meters --------------------------------------------------------------------------------

def test_meters_that_cannot_be_stored_as_listed_are_refused_and_the_others_sync(
        engine: Engine, fake: FakeStripe, settings: Any, drainer: Drainer) -> None:
    gateway = gateway_from(settings)
    assert gateway is not None
    refresher = MeterRefresher(engine, gateway)
    fake.add_meter("renamed")
    assert refresher.run_once() == 2
    # Stripe now lists poisoned meters beside the good one.
    fake.add_meter("renamed", meter_id="mtr_" + "i" * 300)          # an id too long: refused
    fake.add_meter("n" * 150)                                       # no event of ours has it
    fake.add_meter("odd_keys", customer_key="k" * 150)              # a payload key too long
    fake.add_meter("shown", display_name="D" * 400 + "\x00",        # only shown: cut
                   formula="f" * 50)
    try:
        assert refresher.run_once() == 2
    finally:
        gateway.close()
    with reading(engine) as conn:
        meters = known_meters(conn)
        detail = conn.execute(select(SyncState.__table__.c.detail)
                              .where(SyncState.__table__.c.name == "meters")).scalar_one()
    assert set(meters) == {"api_requests", "renamed", "shown"}
    assert meters["renamed"].status == "missing"          # its events wait, visibly
    assert meters["shown"].display_name == "D" * 255 and meters["shown"].formula == "f" * 20
    assert "3 refused" in detail and "'renamed'" in detail and "'odd_keys'" in detail
    # Sending to the good meter goes on.
    eid = enqueue(engine, "poison:meters")
    drainer.drain_once()
    assert row(engine, eid).status == "sent"
    with engine.connect() as conn:
        assert conn.execute(select(StripeMeter.__table__.c.meter_id).where(
            StripeMeter.__table__.c.event_name == "renamed")).scalar_one().startswith("mtr_fake")


def test_a_poisoned_failure_of_the_meter_listing_is_recorded(engine: Engine, fake: FakeStripe,
                                                             settings: Any) -> None:
    gateway = gateway_from(settings)
    assert gateway is not None
    fake.poison(code=LONG_CODE, request_id=LONG_REQUEST_ID, message=LONG_MESSAGE)
    fake.set_auth_failure(401)
    with pytest.raises(Exception, match="HTTP 401"):
        MeterRefresher(engine, gateway).run_once()
    gateway.close()
    with engine.connect() as conn:
        detail = conn.execute(select(SyncState.__table__.c.detail)).scalar_one()
    assert len(detail) <= 2000 and EXPECTED_MESSAGE in detail and "\x00" not in detail


# -- reconciliation -------------------------------------------------------------------------

def test_a_run_full_of_poisoned_errors_is_stored_as_a_list_that_parses(
        engine: Engine, fake: FakeStripe, settings: Any, seed: Any) -> None:
    now = utcnow()
    at = now - timedelta(days=2)
    for i in range(40):                  # one summaries call per customer, each refused
        seed.event(status="sent", stripe_customer_id=f"cus_{i}", occurred_at=at, now=at)
    with engine.begin() as conn:
        conn.execute(StripeMeter.__table__.insert().values(
            event_name="api_requests", meter_id="mtr_gone", status="active",
            customer_key="stripe_customer_id", value_key="value", formula="sum",
            seen_at=now, updated_at=now))
    fake.poison(code=LONG_CODE, request_id=LONG_REQUEST_ID, message=LONG_MESSAGE)
    gateway = gateway_from(settings)
    assert gateway is not None
    try:
        run = reconcile(engine, gateway, settings, trigger="cli", actor="a" * 300)
    finally:
        gateway.close()
    assert len(run.errors) == 40 and not run.ok
    with engine.connect() as conn:
        stored = conn.execute(select(ReconciliationRun.__table__)).one()
    errors = json.loads(stored.errors)
    assert len(stored.errors) <= 20000 and errors[-1].startswith("… and ")
    assert int(errors[-1].split()[2]) == 40 - (len(errors) - 1)
    assert all(EXPECTED_MESSAGE in e and len(e) <= 500 for e in errors[:-1])
    assert stored.actor == "a" * 255


def test_a_summary_that_is_no_number_is_an_error_of_the_run_not_a_crash(
        engine: Engine, fake: FakeStripe, settings: Any, seed: Any) -> None:
    now = utcnow()
    at = now - timedelta(days=2)
    for customer in ("cus_nan", "cus_fine"):
        seed.event(status="sent", stripe_customer_id=customer, occurred_at=at, now=at)
        fake.add_usage(customer, "api_requests", int(at.timestamp()),
                       float("nan") if customer == "cus_nan" else 1.0)
    gateway = gateway_from(settings)
    assert gateway is not None
    MeterRefresher(engine, gateway).run_once()
    try:
        run = reconcile(engine, gateway, settings, trigger="cli", now=now + timedelta(hours=2))
    finally:
        gateway.close()
    assert [e for e in run.errors if "cus_nan" in e and "MalformedAnswer" in e]
    assert len(run.errors) == 1 and run.id is not None
    assert run.comparison.checked == 1 and not run.comparison.mismatches   # cus_fine: 1 = 1
