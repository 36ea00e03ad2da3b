"""Stripe's error reports about events sent through meter event streams, through the real SDK
against the fake, on SQLite and PostgreSQL: every stream request carries an ``Idempotency-Key``
of the project's own, kept with its events; a sample naming it is traced to exactly the events
Stripe refused (asking Stripe about the customers where the code is about one), and a sample
that singles none out is shown for a person, never guessed."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from conftest import make_settings
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session
from support.fake_stripe import AsyncError, FakeStripe
from support.loop import drain_all, poll_reports

from webapp.config import Settings
from webapp.models import OutboxEvent, StreamRequest, StripeErrorSample, utcnow
from webapp.outbox import enqueue_usage, operations
from webapp.outbox.tracing import parse_carried
from webapp.worker import Drainer, gateway_from

T = OutboxEvent.__table__
METER = "api_requests"


@pytest.fixture
def fake() -> Iterator[FakeStripe]:
    with FakeStripe(separate_streams=True) as f:
        f.create_customer("cus_a", name="A")
        f.create_customer("cus_b", name="B")
        yield f


@pytest.fixture
def settings(db_url: str, fake: FakeStripe) -> Settings:
    return make_settings(db_url, stripe_api_base=fake.base_url,
                         stripe_meter_events_base=fake.meter_events_url,
                         meter_event_api="v2_stream")


@pytest.fixture
def drainer(engine: Engine, settings: Settings) -> Iterator[Drainer]:
    d = Drainer(engine, settings, gateway_from(settings))
    yield d
    d.close()


def enqueue(engine: Engine, key: str, tenant: str, *, meter: str = METER,
            occurred_at: datetime | None = None) -> int:
    with Session(engine) as db, db.begin():
        return int(enqueue_usage(db, tenant_id=tenant, quantity=3, idempotency_key=key,
                                 meter=meter, occurred_at=occurred_at).id)


def rows(engine: Engine) -> dict[int, Any]:
    with engine.connect() as conn:
        return {r.id: r for r in conn.execute(select(T))}






def samples(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return conn.execute(select(StripeErrorSample.__table__)
                            .order_by(StripeErrorSample.__table__.c.id)).all()


def map_tenants(engine: Engine) -> None:
    for tenant, customer in (("a", "cus_a"), ("b", "cus_b"), ("ghost", "cus_ghost")):
        operations.set_tenant(engine, tenant, stripe_customer_id=customer, name=None,
                              now=utcnow())


@pytest.mark.parametrize("names_customer", [True, False],
                         ids=["message-names-customer", "customer-asked"])
def test_a_sample_naming_a_request_rejects_exactly_the_unknown_customers_events(
        engine: Engine, fake: FakeStripe, settings: Settings, drainer: Drainer,
        names_customer: bool, client_as: Any) -> None:
    """One request carries three customers' events; Stripe has two of them. The report
    samples the three errors, each naming the request's key: every event of the unknown
    customer, and none of the others, becomes rejected. When the message does not name the
    customer, Stripe is asked about each customer of the request, once."""
    map_tenants(engine)
    fake.customer_error_names_customer = names_customer
    ids = {tenant: [enqueue(engine, f"{tenant}-{i}", tenant) for i in range(3)]
           for tenant in ("a", "b", "ghost")}
    drain_all(drainer)
    assert {r.status for r in rows(engine).values()} == {"sent"}
    log = fake.stream_log()
    assert len(log) == 1 and len(log[0]["identifiers"]) == 9    # one request, three lanes
    key = log[0]["idempotency_key"]
    assert key.startswith("bo-stream-")
    with engine.connect() as conn:
        kept = conn.execute(select(StreamRequest.__table__)).one()
    assert kept.idempotency_key == key and kept.events == 9
    assert {c.event_id for c in parse_carried(kept.event_ids)} == {
        i for group in ids.values() for i in group}

    fake.flush_reports()
    report = fake.events()[-1]["data"]["reason"]
    assert report["error_count"] == 3
    assert [s["request"]["identifier"] for t in report["error_types"]
            for s in t["sample_errors"]] == [key] * 3    # each sample names the request
    summary = poll_reports(engine, settings)
    assert summary.rejected == 3
    now = rows(engine)
    for i in ids["ghost"]:
        assert now[i].status == "rejected"
        assert now[i].reject_code == "meter_event_customer_not_found"
        assert now[i].reject_found_by == ("request" if names_customer else "customer")
    assert {now[i].status for i in ids["a"] + ids["b"]} == {"sent"}
    # The first sample rejected the three; the other two found them already rejected.
    assert sorted((s.outcome, s.event_id) for s in samples(engine)) == sorted(
        [("rejected", i) for i in ids["ghost"]] + [("already", i) for i in ids["ghost"]] * 2)
    if names_customer:
        assert fake.customer_lookups == {}
    else:
        assert fake.customer_lookups == {"cus_a": 1, "cus_b": 1, "cus_ghost": 1}
    # The event page says how the refusal was traced, and leads to the request's events.
    page = client_as("viewer").get(f"/events/{ids['ghost'][0]}").get_data(as_text=True)
    assert 'data-k="found-by"' in page
    assert ("asked, Stripe said it has no such customer" in page) is not names_customer
    assert f"/events?request={key}" in page


def test_customers_are_asked_once_per_refresh_across_reports(
        engine: Engine, fake: FakeStripe, settings: Settings, drainer: Drainer) -> None:
    map_tenants(engine)
    fake.customer_error_names_customer = False
    for round_ in range(2):
        for tenant in ("a", "ghost"):
            enqueue(engine, f"{tenant}-r{round_}", tenant)
        drain_all(drainer)
        fake.flush_reports()
        assert poll_reports(engine, settings).rejected == 1
    assert fake.customer_lookups == {"cus_a": 1, "cus_ghost": 1}   # the second used the kept


def test_a_sample_that_singles_none_out_is_shown_not_guessed(
        engine: Engine, fake: FakeStripe, settings: Settings, drainer: Drainer,
        client_as: Any) -> None:
    """A code that says nothing of which event (an invalid value) about a request of four
    events: none is rejected; the Stripe page says one of the four was refused and links to
    them."""
    map_tenants(engine)
    ids = [enqueue(engine, f"v-{i}", tenant) for i, tenant in enumerate(("a", "a", "b", "b"))]
    drain_all(drainer)
    key = fake.stream_log()[-1]["idempotency_key"]
    fake.report_errors([AsyncError(METER, "meter_event_invalid_value",
                                   "The value is not valid.", key)])
    summary = poll_reports(engine, settings)
    assert summary.rejected == 0 and summary.unmatched == 0
    assert {rows(engine)[i].status for i in ids} == {"sent"}
    [sample] = samples(engine)
    assert (sample.outcome, sample.event_id, sample.identifier) == ("ambiguous", None, key)
    page = client_as("viewer").get("/stripe").get_data(as_text=True)
    assert "One of the" in page and "4 events" in page and f"request={key}" in page
    listed = client_as("viewer").get(f"/events?request={key}").get_data(as_text=True)
    for i in ids:
        assert f"/events/{i}" in listed
    assert "carried by stream request" in listed


def test_a_too_old_event_is_singled_out_by_its_timestamp(
        engine: Engine, fake: FakeStripe, settings: Settings, drainer: Drainer) -> None:
    """The code says which: of a request's events, the one stamped more than 35 days before
    the request. (Enqueued 34 days back, sent as if two days later: the fake's clock.)"""
    map_tenants(engine)
    fresh = enqueue(engine, "fresh", "a")
    old = enqueue(engine, "old", "a", occurred_at=utcnow() - timedelta(days=34, hours=23))
    drain_all(drainer)
    key = fake.stream_log()[-1]["idempotency_key"]
    with engine.begin() as conn:   # the request reached Stripe two days later than recorded
        conn.execute(StreamRequest.__table__.update().values(
            sent_at=datetime.now(UTC) + timedelta(days=2)))
    fake.report_errors([AsyncError(METER, "timestamp_too_far_in_past",
                                   "The timestamp must be within the past 35 days.", key)])
    assert poll_reports(engine, settings).rejected == 1
    now = rows(engine)
    assert (now[old].status, now[fresh].status) == ("rejected", "sent")


def test_a_requeued_event_is_not_the_one_an_old_request_carried(
        engine: Engine, fake: FakeStripe, settings: Settings, drainer: Drainer) -> None:
    """A report about the request that carried an event before it was rejected and requeued
    (now sent under a new identifier) does not reject it again."""
    map_tenants(engine)
    ev = enqueue(engine, "once", "ghost")
    drain_all(drainer)
    first_key = fake.stream_log()[-1]["idempotency_key"]
    fake.flush_reports()
    assert poll_reports(engine, settings).rejected == 1
    fake.create_customer("cus_ghost")                  # the customer now exists
    operations.requeue(engine, [ev], actor="ops@example.com", now=utcnow(),
                       window_seconds=settings.dedupe_window_seconds)
    drain_all(drainer)
    assert rows(engine)[ev].status == "sent"
    fake.report_errors([AsyncError(METER, "meter_event_customer_not_found",
                                   "No such customer: 'cus_ghost'.", first_key)])
    poll_reports(engine, settings)
    assert rows(engine)[ev].status == "sent"
    assert (samples(engine)[-1].outcome, samples(engine)[-1].event_id) == ("stale", ev)
