"""After Stripe's 200: error reports read back (polled and pushed), meters read from Stripe,
on SQLite and PostgreSQL, through the real SDK against the fake.

The fake accepts an event for an unknown customer, or without the meter's payload keys, with a
200 and reports it later (``flush_reports``: one ``error_report_triggered`` event per meter,
a few samples per code) — as Stripe does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from conftest import make_settings
from flask import Flask
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session
from support.fake_stripe import AsyncError, FakeStripe

from webapp import create_app
from webapp.db import reading
from webapp.models import OutboxEvent, StripeErrorSample, StripeEvent, utcnow
from webapp.outbox import enqueue_usage, operations, rollups
from webapp.outbox.meters import active_meters
from webapp.outbox.states import idempotency_key
from webapp.read import counts
from webapp.worker import Drainer, EventPoller, MeterRefresher, gateway_from
from webapp.worker.stripe_events import PollSummary

T = OutboxEvent.__table__
SECRET = "whsec_test_0123456789abcdef"


@pytest.fixture
def fake() -> Iterator[FakeStripe]:
    with FakeStripe(customers=("cus_known",)) as f:
        yield f


@pytest.fixture
def settings(db_url: str, fake: FakeStripe) -> Any:
    return make_settings(db_url, stripe_api_base=fake.base_url, stripe_webhook_secret=SECRET)


@pytest.fixture
def drainer(engine: Engine, settings: Any) -> Iterator[Drainer]:
    d = Drainer(engine, settings, gateway_from(settings))
    yield d
    d.close()


def map_tenant(engine: Engine, tenant: str, customer: str) -> None:
    operations.set_tenant(engine, tenant, stripe_customer_id=customer, name=None, now=utcnow())


def enqueue(engine: Engine, key: str, *, tenant: str = "known", meter: str = "api_requests",
            quantity: int = 2) -> int:
    with Session(engine) as db, db.begin():
        return int(enqueue_usage(db, tenant_id=tenant, quantity=quantity, idempotency_key=key,
                                 meter=meter).id)


def row(engine: Engine, event_id: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(T).where(T.c.id == event_id)).one()


def drain_all(drainer: Drainer) -> None:
    while drainer.drain_once().claimed:
        pass


def poll(engine: Engine, settings: Any) -> PollSummary:
    gateway = gateway_from(settings)
    assert gateway is not None
    meters = MeterRefresher(engine, gateway)
    return EventPoller(engine, gateway, on_meter_codes=meters.run_once).run_once()


def sent_count(engine: Engine) -> int:
    with reading(engine) as conn:
        return counts.status_counts(conn)["sent"]


def test_an_unknown_customer_is_accepted_then_rejected_by_the_poll(
        engine: Engine, fake: FakeStripe, settings: Any, drainer: Drainer) -> None:
    map_tenant(engine, "known", "cus_known")
    map_tenant(engine, "ghost", "cus_ghost")          # Stripe has no such customer
    good = enqueue(engine, "good:1", tenant="known")
    bad = [enqueue(engine, f"bad:{i}", tenant="ghost") for i in range(2)]
    drain_all(drainer)
    assert {row(engine, i).status for i in [good, *bad]} == {"sent"}   # Stripe said 200
    fake.flush_reports()
    summary = poll(engine, settings)
    assert summary.as_dict() == {"events": 1, "rejected": 2, "unmatched": 0}
    for i in bad:
        r = row(engine, i)
        assert (r.status, r.reject_code) == ("rejected", "meter_event_customer_not_found")
        assert "cus_ghost" in r.reject_message and r.reject_event_id.startswith("evt_")
    assert row(engine, good).status == "sent"
    # The same events listed again change nothing: each is stored once, by its id.
    assert poll(engine, settings).as_dict() == {"events": 0, "rejected": 0, "unmatched": 0}
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(StripeEvent.__table__)).scalar() == 1


def test_samples_are_samples_and_unmatched_ones_are_kept(
        engine: Engine, fake: FakeStripe, settings: Any, drainer: Drainer) -> None:
    map_tenant(engine, "ghost", "cus_ghost")
    fake.sample_limit = 2
    ids = [enqueue(engine, f"bad:{i}", tenant="ghost") for i in range(5)]
    drain_all(drainer)
    fake.report_errors([AsyncError("api_requests", "meter_event_customer_not_found", "no",
                                   "someone-elses-event")], error_count=7)
    fake.flush_reports()
    summary = poll(engine, settings)
    # 2 samples of our 5 (the other 3 are reconciliation's to find), 1 of nobody's.
    assert summary.as_dict() == {"events": 2, "rejected": 2, "unmatched": 1}
    assert sorted(row(engine, i).status for i in ids) == ["rejected"] * 2 + ["sent"] * 3
    with engine.connect() as conn:
        events = {r.id: r for r in conn.execute(select(StripeEvent.__table__))}
        samples = conn.execute(select(StripeErrorSample.__table__)).all()
    assert sorted((e.error_count, e.sample_count) for e in events.values()) == [(5, 2), (7, 1)]
    assert {s.outcome for s in samples} == {"rejected", "unmatched"}
    assert [s.identifier for s in samples if s.outcome == "unmatched"] == ["someone-elses-event"]
    assert sum(json.loads(e.body)["data"]["reason"]["error_count"] for e in events.values()) == 12


def test_more_reports_than_one_page_are_all_read(
        engine: Engine, fake: FakeStripe, settings: Any, drainer: Drainer) -> None:
    fake.page_cap = 2
    map_tenant(engine, "ghost", "cus_ghost")
    ids = []
    for n in range(5):                                   # five reports, one event each
        ids.append(enqueue(engine, f"bad:{n}", tenant="ghost"))
        drain_all(drainer)
        fake.flush_reports()
    summary = poll(engine, settings)
    assert summary.events == 5 and summary.rejected == 5
    assert {row(engine, i).status for i in ids} == {"rejected"}


@pytest.mark.parametrize("newest_first", [False, True], ids=["oldest-first", "newest-first"])
def test_a_poll_cut_short_loses_no_report_whatever_the_list_order(
        engine: Engine, fake: FakeStripe, settings: Any, drainer: Drainer,
        newest_first: bool) -> None:
    """Reports are stored oldest first, so the mark the next poll starts from never passes a
    report that was not stored — even when Stripe lists the newest first and reading one
    fails half-way."""
    fake.events_newest_first = newest_first
    fake.page_cap = 2
    map_tenant(engine, "ghost", "cus_ghost")
    ids = [enqueue(engine, f"bad:{n}", tenant="ghost") for n in range(5)]
    drain_all(drainer)
    reports = [fake.report_errors([AsyncError("api_requests", "meter_event_customer_not_found",
                                              "no", f"bad:{n}")], created_ago=50 - 10 * n)
               for n in range(5)]                      # one report each, 10 s apart
    gateway = gateway_from(settings)
    assert gateway is not None
    broken = reports[2]

    class Flaky:
        """The real gateway, except reading the third report fails."""

        def list_events(self, *a: Any, **kw: Any) -> Any:
            return gateway.list_events(*a, **kw)

        def retrieve_event(self, event_id: str) -> Any:
            if event_id == broken:
                raise RuntimeError("connection reset")
            return gateway.retrieve_event(event_id)

    with pytest.raises(RuntimeError):
        EventPoller(engine, Flaky()).run_once()
    with engine.connect() as conn:
        stored = set(conn.execute(select(StripeEvent.__table__.c.id)).scalars())
    assert stored == set(reports[:2])               # the two older ones, never a newer one
    summary = poll(engine, settings)
    assert (summary.events, summary.rejected) == (3, 3)
    assert {row(engine, i).status for i in ids} == {"rejected"}


def test_two_reports_naming_one_event_in_one_poll_reject_it_once(
        engine: Engine, fake: FakeStripe, settings: Any, drainer: Drainer) -> None:
    """Reports are stored and applied several to a transaction: the second naming an event
    finds it already rejected, and the sent totals lose it once."""
    map_tenant(engine, "ghost", "cus_ghost")
    eid = enqueue(engine, "bad:twice", tenant="ghost", quantity=5)
    drain_all(drainer)
    later = datetime.fromtimestamp(utcnow().timestamp() + 3600, tz=utcnow().tzinfo)
    assert rollups.fold(engine, now=later, margin=rollups.fold_margin(30))
    for _ in range(2):
        fake.report_errors([AsyncError("api_requests", "meter_event_customer_not_found", "no",
                                       "bad:twice")])
    assert poll(engine, settings).as_dict() == {"events": 2, "rejected": 1, "unmatched": 0}
    assert row(engine, eid).status == "rejected"
    with engine.connect() as conn:
        outcomes = sorted(conn.execute(select(StripeErrorSample.__table__.c.outcome)).scalars())
    assert outcomes == ["already", "rejected"]
    with reading(engine) as conn:
        mark = rollups.read_mark(conn, rollups.SENT_USAGE)
    assert (mark.events, mark.quantity, sent_count(engine)) == (0, 0, 0)


def test_a_report_listed_late_is_still_read(
        engine: Engine, fake: FakeStripe, settings: Any, drainer: Drainer) -> None:
    """Stripe may list an event after newer ones were read: a poll starts a little before
    the newest stored report, and skips the ones it has by id."""
    map_tenant(engine, "ghost", "cus_ghost")
    first, late = enqueue(engine, "bad:first", tenant="ghost"), enqueue(
        engine, "bad:late", tenant="ghost")
    drain_all(drainer)
    fake.report_errors([AsyncError("api_requests", "meter_event_customer_not_found", "no",
                                   "bad:first")])
    assert poll(engine, settings).events == 1
    fake.report_errors([AsyncError("api_requests", "meter_event_customer_not_found", "no",
                                   "bad:late")], created_ago=120)
    assert poll(engine, settings).as_dict() == {"events": 1, "rejected": 1, "unmatched": 0}
    assert {row(engine, first).status, row(engine, late).status} == {"rejected"}


def test_a_sample_names_an_event_by_its_retry_key(
        engine: Engine, fake: FakeStripe, settings: Any, drainer: Drainer) -> None:
    map_tenant(engine, "ghost", "cus_ghost")
    eid = enqueue(engine, "bad:retry", tenant="ghost")
    drain_all(drainer)
    fake.report_errors([AsyncError("api_requests", "meter_event_customer_not_found", "no",
                                   idempotency_key("bad:retry", 2))])
    assert poll(engine, settings).rejected == 1
    assert row(engine, eid).status == "rejected"


def test_a_sample_for_an_event_in_flight_waits_until_it_is_sent(
        engine: Engine, fake: FakeStripe, settings: Any, drainer: Drainer) -> None:
    """Stripe took the event during a 5xx (the outbox retries it) and rejects it meanwhile:
    the report is kept and applied once the retry records the event as sent."""
    map_tenant(engine, "ghost", "cus_ghost")
    eid = enqueue(engine, "bad:5xx", tenant="ghost")
    fake.fail_next("500", apply=True)
    drainer.drain_once()
    assert row(engine, eid).status == "retrying"
    fake.flush_reports()
    summary = poll(engine, settings)
    assert (summary.rejected, row(engine, eid).status) == (0, "retrying")
    import time

    time.sleep(0.2)                                      # the test settings' backoff
    drain_all(drainer)
    assert row(engine, eid).status == "sent"             # the duplicate-identifier 400
    assert poll(engine, settings).rejected == 1
    assert row(engine, eid).status == "rejected"


def test_a_rejected_event_that_was_folded_leaves_the_rollup(
        engine: Engine, fake: FakeStripe, settings: Any, drainer: Drainer) -> None:
    map_tenant(engine, "ghost", "cus_ghost")
    map_tenant(engine, "known", "cus_known")
    enqueue(engine, "good:1", tenant="known", quantity=5)
    bad = enqueue(engine, "bad:1", tenant="ghost", quantity=7)
    drain_all(drainer)
    later = datetime.fromtimestamp(utcnow().timestamp() + 3600, tz=utcnow().tzinfo)
    assert rollups.fold(engine, now=later, margin=rollups.fold_margin(30))
    with reading(engine) as conn:
        assert rollups.read_mark(conn, rollups.SENT_USAGE).events == 2
    fake.flush_reports()
    poll(engine, settings)
    assert row(engine, bad).status == "rejected"
    with reading(engine) as conn:
        mark = rollups.read_mark(conn, rollups.SENT_USAGE)
    assert (mark.events, mark.quantity, sent_count(engine)) == (1, 5, 1)


def test_a_requeued_rejected_event_goes_out_under_a_new_identifier_once(
        engine: Engine, fake: FakeStripe, settings: Any, drainer: Drainer) -> None:
    map_tenant(engine, "acme", "cus_wrong")
    eid = enqueue(engine, "usage:42", tenant="acme")
    drain_all(drainer)
    fake.flush_reports()
    poll(engine, settings)
    assert row(engine, eid).status == "rejected"
    map_tenant(engine, "acme", "cus_known")              # the fix: the right customer
    operations.requeue(engine, [eid], actor="test", now=utcnow(), window_seconds=23 * 3600)
    r = row(engine, eid)
    assert (r.status, r.stripe_identifier, r.stripe_customer_id) == ("pending", "usage:42~r1",
                                                                     None)
    drain_all(drainer)
    drain_all(drainer)
    r = row(engine, eid)
    assert (r.status, r.stripe_customer_id) == ("sent", "cus_known")
    accepted = fake.accepted()
    assert accepted["usage:42~r1"].customer == "cus_known" and accepted["usage:42~r1"].valid
    assert [e["identifier"] for e in fake.request_log()].count("usage:42~r1") == 1
    fake.flush_reports()
    assert poll(engine, settings).rejected == 0


def test_a_meter_on_the_second_page_is_found_and_its_keys_used(
        engine: Engine, fake: FakeStripe, settings: Any, drainer: Drainer) -> None:
    fake.page_cap = 2
    fake.add_meter("meter_b")
    fake.add_meter("storage_gb", customer_key="customer", value_key="gigabytes")
    map_tenant(engine, "known", "cus_known")
    eid = enqueue(engine, "gb:1", meter="storage_gb", quantity=9)
    drain_all(drainer)
    assert row(engine, eid).status == "sent"
    ev = fake.accepted()["gb:1"]
    assert ev.payload == {"customer": "cus_known", "gigabytes": "9"} and ev.valid
    with reading(engine) as conn:
        assert set(active_meters(conn)) == {"api_requests", "meter_b", "storage_gb"}


def test_a_missing_meters_events_wait_and_go_out_once_it_exists(
        engine: Engine, fake: FakeStripe, settings: Any, drainer: Drainer) -> None:
    map_tenant(engine, "known", "cus_known")
    eid = enqueue(engine, "late:1", meter="not_yet")
    drain_all(drainer)
    assert (row(engine, eid).status, fake.calls()) == ("pending", 0)     # never sent
    from webapp.read.stripe_side import waiting_for_meters

    with reading(engine) as conn:
        assert [(w.meter, w.status, w.events) for w in waiting_for_meters(conn)] == [
            ("not_yet", "missing", 1)]
    fake.add_meter("not_yet")
    gateway = gateway_from(settings)
    assert gateway is not None
    MeterRefresher(engine, gateway).run_once()
    assert drainer.meters is not None
    drainer.meters.invalidate()
    drain_all(drainer)
    assert row(engine, eid).status == "sent" and fake.accept_count() == 1


def test_a_meter_stripe_says_is_missing_holds_its_events_untouched(
        engine: Engine, fake: FakeStripe, settings: Any, drainer: Drainer) -> None:
    """The meters said active; then the meter was deactivated. Stripe's 400 on send holds
    the event back (no attempt spent) instead of killing it."""
    map_tenant(engine, "known", "cus_known")
    drainer.meters.active()  # type: ignore[union-attr]
    fake.set_meter_status("api_requests", "inactive")
    eid = enqueue(engine, "off:1")
    drainer.drain_once()
    r = row(engine, eid)
    assert (r.status, r.attempt_count, r.last_outcome) == ("pending", 0, None)
    with reading(engine) as conn:
        assert "api_requests" not in active_meters(conn)
    drainer.drain_once()
    assert fake.calls() == 1


# -- the webhook ------------------------------------------------------------------------------

@pytest.fixture
def web(engine: Engine, settings: Any) -> Flask:
    return create_app({"TESTING": True}, settings=settings, engine=engine, start_drainer=False)


def test_a_signed_push_rejects_an_event(engine: Engine, fake: FakeStripe, web: Flask,
                                        drainer: Drainer) -> None:
    map_tenant(engine, "ghost", "cus_ghost")
    eid = enqueue(engine, "bad:push", tenant="ghost")
    drain_all(drainer)
    [event_id] = fake.flush_reports()
    body, signature = fake.signed_push(event_id, SECRET)
    client = web.test_client()
    resp = client.post("/stripe/webhook", data=body, headers={"Stripe-Signature": signature,
                                                              "Content-Type": "application/json"})
    assert resp.status_code == 200 and resp.get_json()["status"] == "stored"
    assert row(engine, eid).status == "rejected"
    again = client.post("/stripe/webhook", data=body, headers={"Stripe-Signature": signature})
    assert again.status_code == 200 and again.get_json()["status"] == "duplicate"


@pytest.mark.parametrize("signature", [None, "t=1,v1=00", "forged"])
def test_a_push_with_a_bad_signature_stores_nothing(engine: Engine, fake: FakeStripe,
                                                    web: Flask, drainer: Drainer,
                                                    signature: str | None) -> None:
    map_tenant(engine, "ghost", "cus_ghost")
    eid = enqueue(engine, "bad:forged", tenant="ghost")
    drain_all(drainer)
    [event_id] = fake.flush_reports()
    body, good = fake.signed_push(event_id, SECRET)
    if signature == "forged":
        signature = fake.signed_push(event_id, "whsec_not_the_secret_000")[1]
    headers = {} if signature is None else {"Stripe-Signature": signature}
    resp = web.test_client().post("/stripe/webhook", data=body, headers=headers)
    assert resp.status_code == 400
    assert row(engine, eid).status == "sent"
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(StripeEvent.__table__)).scalar() == 0


def test_without_a_secret_the_webhook_is_not_there(engine: Engine, db_url: str,
                                                   fake: FakeStripe) -> None:
    app = create_app({"TESTING": True}, engine=engine, start_drainer=False,
                     settings=make_settings(db_url, stripe_api_base=fake.base_url))
    assert app.test_client().post("/stripe/webhook", data=b"{}").status_code == 404
