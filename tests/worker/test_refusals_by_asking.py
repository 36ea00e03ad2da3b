"""Refusals found by asking, soundly: a report that counts more ``meter_event_customer_not_found``
errors than it samples has the rest found by asking Stripe about the customers, and only what
the answers prove is marked ``rejected``. A customer Stripe never had (404) refused every event
sent to it; a deleted one only those that reached Stripe after its deletion (the time of its v1
``customer.deleted`` event, ``GET /v1/events``); without that time, none. What was kept of the
customers from before Stripe validated the report's events is asked again.

Through the real SDK against the fake, on SQLite and PostgreSQL, on one clock the test moves
(the fake's and ours): Stripe's deletion time is whole seconds, and the outbox leaves the
seconds around it alone.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import stripe
from conftest import TEST_API_KEY, make_settings
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session
from support.fake_stripe import AsyncError, FakeStripe

from webapp.config import Settings
from webapp.models import OutboxEvent, StripeCustomerCheck, utcnow
from webapp.outbox import enqueue_usage, operations, refused
from webapp.read.stripe_side import stripe_page
from webapp.stripe_gateway import SdkGateway, StripeCallFailed
from webapp.worker import Drainer, MeterRefresher, customer_directory, event_poller, gateway_from
from webapp.worker.stripe_events import PollSummary

T = OutboxEvent.__table__
CHECKS = StripeCustomerCheck.__table__
NOT_FOUND = "meter_event_customer_not_found"


class Clock:
    """Real time plus an offset the test moves forward; shared by the fake and our side."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> datetime:
        return utcnow() + timedelta(seconds=self.offset)

    def seconds(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def fake(clock: Clock) -> Iterator[FakeStripe]:
    with FakeStripe(clock=clock.seconds) as f:
        for customer in ("cus_keep", "cus_late", "cus_new"):
            f.create_customer(customer, name=customer)
        yield f


@pytest.fixture
def settings(db_url: str, fake: FakeStripe) -> Settings:
    return make_settings(db_url, stripe_api_base=fake.base_url)


@pytest.fixture
def drainer(engine: Engine, settings: Settings, clock: Clock) -> Iterator[Drainer]:
    # A retry waits at least 30 s (on the test's clock): one after an unknown outcome goes
    # out only once the test moved the clock past it.
    slow = settings.with_overrides(initial_backoff_seconds=30.0, max_backoff_seconds=60.0)
    d = Drainer(engine, slow, gateway_from(settings), clock=clock)
    yield d
    d.close()


def map_tenants(engine: Engine, clock: Clock, **tenants: str) -> None:
    for tenant, customer in tenants.items():
        operations.set_tenant(engine, tenant, stripe_customer_id=customer, name=None,
                              now=clock())


def enqueue(engine: Engine, clock: Clock, tenant: str, n: int, prefix: str) -> list[int]:
    with Session(engine) as db, db.begin():
        return [int(enqueue_usage(db, tenant_id=tenant, quantity=2, idempotency_key=f"{prefix}-{i}",
                                  now=clock()).id) for i in range(n)]


def drain_all(drainer: Drainer) -> None:
    while drainer.drain_once().claimed:
        pass


def poll(engine: Engine, settings: Settings, clock: Clock) -> PollSummary:
    """One poll of Stripe's error reports as the worker makes it, on the test's clock."""
    gateway = gateway_from(settings)
    assert gateway is not None
    try:
        meters = MeterRefresher(engine, gateway)
        return event_poller(engine, gateway, settings, clock=clock,
                            on_meter_codes=meters.run_once).run_once()
    finally:
        gateway.close()


def statuses(engine: Engine, ids: list[int]) -> dict[str, int]:
    """``status`` or ``status:found_by`` → how many of ``ids``."""
    with engine.connect() as conn:
        out: dict[str, int] = {}
        for status, how in conn.execute(select(T.c.status, T.c.reject_found_by)
                                        .where(T.c.id.in_(ids))):
            key = status if how is None else f"{status}:{how}"
            out[key] = out.get(key, 0) + 1
        return out


def unfound(engine: Engine) -> dict[str, int]:
    """What each stored report counted that nothing here accounts for, by report id."""
    return {r["id"]: r["unfound"] for r in stripe_page(engine).reports}


# -- a customer deleted after some of its events were accepted --------------------------------

def test_only_the_events_sent_after_a_deletion_are_found_refused(
        engine: Engine, fake: FakeStripe, settings: Settings, drainer: Drainer,
        clock: Clock) -> None:
    """Stripe billed what reached it before the customer was deleted: those stay ``sent``,
    even one whose first call timed out before the deletion and was confirmed ("already
    exists") only after it, and even though all of them are in the report's window. Only
    what reached Stripe after the deletion is found refused."""
    map_tenants(engine, clock, late="cus_late", keep="cus_keep")
    [unsure] = enqueue(engine, clock, "late", 1, "unsure")
    fake.fail_next("500", apply=True)              # Stripe took it; we cannot know
    drainer.drain_once()
    early = enqueue(engine, clock, "late", 4, "early")
    drain_all(drainer)
    assert statuses(engine, early) == {"sent": 4}
    assert statuses(engine, [unsure]) == {"retrying": 1}
    clock.advance(60)
    event_id = fake.delete_customer("cus_late")
    clock.advance(60)
    drain_all(drainer)                             # the retry: "already exists", after it
    assert statuses(engine, [unsure]) == {"sent": 1}
    after = enqueue(engine, clock, "late", 20, "after")
    keep = enqueue(engine, clock, "keep", 5, "keep")
    drain_all(drainer)
    assert statuses(engine, after + keep) == {"sent": 25}        # Stripe answered 200
    [report_id] = fake.flush_reports()
    [report] = [e for e in fake.events() if e["id"] == report_id]
    assert report["data"]["reason"]["error_count"] == 20          # those after the deletion

    summary = poll(engine, settings, clock)
    assert summary.rejected == 20
    assert statuses(engine, after) == {"rejected:sample": 3, "rejected:customer": 17}
    assert statuses(engine, early + [unsure]) == {"sent": 5}
    assert statuses(engine, keep) == {"sent": 5}
    assert unfound(engine) == {report_id: 0}
    assert [e["id"] for e in fake.deleted_customer_events()] == [event_id]
    assert fake.v1_event_list_calls == 1


def test_an_event_accepted_in_the_second_of_the_deletion_stays_sent(
        engine: Engine, fake: FakeStripe, settings: Settings, drainer: Drainer,
        clock: Clock) -> None:
    """Stripe's ``created`` is whole seconds: an event accepted a moment before the deletion,
    in the same second, began after that ``created``; it stays ``sent``
    (:data:`webapp.outbox.refused.AFTER_DELETION`)."""
    map_tenants(engine, clock, late="cus_late")
    clock.advance(math.ceil(clock.seconds()) + 0.05 - clock.seconds())     # at X.05
    [edge] = enqueue(engine, clock, "late", 1, "edge")
    drain_all(drainer)
    deleted = clock.seconds() + 0.5
    assert int(deleted) == int(fake.accepted()["edge-0"].received_at) < deleted
    fake.delete_customer("cus_late", at=deleted)                     # later in that second
    clock.advance(60)
    after = enqueue(engine, clock, "late", 10, "after")
    drain_all(drainer)
    fake.flush_reports()
    assert poll(engine, settings, clock).rejected == 10
    assert statuses(engine, after) == {"rejected:sample": 3, "rejected:customer": 7}
    assert statuses(engine, [edge]) == {"sent": 1}
    assert refused.AFTER_DELETION.total_seconds() >= 1


# -- the new user's case: a kept "active" answer, then the deletion ---------------------------

def test_an_answer_kept_before_stripe_validated_is_asked_again(
        engine: Engine, fake: FakeStripe, settings: Settings, drainer: Drainer,
        clock: Clock) -> None:
    """The customer was checked (kept ``active`` for the refresh), deleted a minute later,
    and 30 events went to it after: a report counting 30 with 3 samples has all 30 found,
    the kept answer being older than the report's ``validation_start``."""
    gateway = gateway_from(settings)
    assert gateway is not None
    directory = customer_directory(engine, gateway, settings, clock=clock)
    assert directory.checks(["cus_new"])["cus_new"].state == "active"
    map_tenants(engine, clock, new="cus_new")
    clock.advance(60)
    fake.delete_customer("cus_new")
    clock.advance(60)                      # well within STRIPE_METERS_REFRESH_SECONDS (300)
    ids = enqueue(engine, clock, "new", 30, "new")
    drain_all(drainer)
    [report_id] = fake.flush_reports()

    assert poll(engine, settings, clock).rejected == 30
    assert statuses(engine, ids) == {"rejected:sample": 3, "rejected:customer": 27}
    assert fake.customer_lookups == {"cus_new": 2}               # asked again
    with engine.connect() as conn:
        assert conn.execute(select(CHECKS.c.state).where(
            CHECKS.c.customer_id == "cus_new")).scalar() == "deleted"
    assert unfound(engine) == {report_id: 0}


# -- no deletion time: nothing marked by asking -----------------------------------------------

@pytest.mark.parametrize("why", ["events-failing", "not-listed"])
def test_without_the_deletion_time_none_is_marked_by_asking(
        engine: Engine, fake: FakeStripe, settings: Settings, drainer: Drainer,
        clock: Clock, why: str, caplog: pytest.LogCaptureFixture) -> None:
    """``GET /v1/events`` fails, or lists no deletion of the customer (deleted longer ago
    than Stripe keeps events): none of its events is marked by asking, and the report keeps
    saying how many refusals nothing here accounts for (reconciliation's to find)."""
    map_tenants(engine, clock, late="cus_late")
    if why == "not-listed":
        fake.create_customer("cus_late", deleted=True)          # a stub, and no event
    else:
        fake.delete_customer("cus_late")
        fake.v1_events_failing = 500
    clock.advance(60)
    ids = enqueue(engine, clock, "late", 30, "late")
    drain_all(drainer)
    [report_id] = fake.flush_reports()

    assert poll(engine, settings, clock).rejected == 3
    assert statuses(engine, ids) == {"rejected:sample": 3, "sent": 27}
    assert unfound(engine) == {report_id: 27}
    assert fake.v1_event_list_calls == 1
    assert "none of their events is marked by asking" in caplog.text


# -- a customer Stripe never had ----------------------------------------------------------------

def test_a_customer_stripe_never_had_has_every_event_found_never_more_than_counted(
        engine: Engine, fake: FakeStripe, settings: Settings, drainer: Drainer,
        clock: Clock) -> None:
    """A 404 customer refused every event sent to it: those of the report's window are
    marked, even beside a deleted customer whose events in the window were all accepted
    before its deletion (they stay ``sent``). Never more than Stripe counted: a report
    counting fewer than the window holds has none marked by asking."""
    map_tenants(engine, clock, ghost="cus_never", late="cus_late")
    billed = enqueue(engine, clock, "late", 5, "billed")
    drain_all(drainer)
    clock.advance(30)
    fake.delete_customer("cus_late")
    clock.advance(30)
    ghost = enqueue(engine, clock, "ghost", 12, "ghost")
    drain_all(drainer)
    [first] = fake.flush_reports()

    assert poll(engine, settings, clock).rejected == 12
    assert statuses(engine, ghost) == {"rejected:sample": 3, "rejected:customer": 9}
    assert statuses(engine, billed) == {"sent": 5}

    # Ten minutes on: 12 more to it, and a report that counts only 6 of them (samples 3).
    clock.advance(600)
    more = enqueue(engine, clock, "ghost", 12, "more")
    drain_all(drainer)
    second = fake.report_errors([AsyncError("api_requests", NOT_FOUND, "No such customer",
                                            f"more-{i}", clock.seconds() - 5)
                                 for i in range(3)], error_count=6)
    assert poll(engine, settings, clock).rejected == 3
    assert statuses(engine, more) == {"rejected:sample": 3, "sent": 9}
    assert unfound(engine) == {first: 0, second: 3}


# -- the read, and the fake ---------------------------------------------------------------------

def test_deletion_times_are_read_page_after_page_and_stop_once_all_are_found(
        fake: FakeStripe, clock: Clock) -> None:
    """``GET /v1/events?type=customer.deleted`` lists newest first, ``limit`` a page, with
    ``has_more`` and ``starting_after``; each deletion at its event's ``created``."""
    fake.page_cap = 2
    start = int(clock.seconds()) - 3600
    for i in range(5):
        fake.create_customer(f"cus_d{i}")
        fake.delete_customer(f"cus_d{i}", at=start + 60 * i)
    gateway = SdkGateway(TEST_API_KEY, api_base=fake.base_url, timeout_seconds=5.0)
    try:
        everything = gateway.list_customer_deletions(created_gte=None)
        assert everything == {f"cus_d{i}": datetime.fromtimestamp(start + 60 * i, UTC)
                              for i in range(5)}
        assert fake.v1_event_list_calls == 3
        newest = gateway.list_customer_deletions(created_gte=None,
                                                 customer_ids=["cus_d4", "cus_d3"])
        assert set(newest) == {"cus_d4", "cus_d3"} and fake.v1_event_list_calls == 4
        since = gateway.list_customer_deletions(
            created_gte=datetime.fromtimestamp(start + 120, UTC))
        assert set(since) == {"cus_d2", "cus_d3", "cus_d4"}
        fake.v1_events_failing = 503
        with pytest.raises(StripeCallFailed):
            gateway.list_customer_deletions(created_gte=None)
    finally:
        gateway.close()


def test_the_fake_lists_v1_events_and_judges_events_as_the_customer_was_when_received(
        fake: FakeStripe, clock: Clock) -> None:
    client = stripe.StripeClient(TEST_API_KEY, base_addresses={"api": fake.base_url},
                                 max_network_retries=0)
    params: Any = {"event_name": "api_requests", "timestamp": int(clock.seconds()),
                   "payload": {"stripe_customer_id": "cus_late", "value": "1"}}
    client.v1.billing.meter_events.create(params={**params, "identifier": "before"})
    received = clock.seconds()
    client.v1.billing.meter_events.create(params={**params, "identifier": "after"})
    # Deleted in between the two (a time already past): the later one is refused now.
    event_id = fake.delete_customer("cus_late", at=received)
    assert not fake.accepted()["after"].valid and fake.accepted()["before"].valid
    fake.flush_reports()
    [report] = fake.events()
    [kind] = report["data"]["reason"]["error_types"]
    assert (kind["code"], kind["error_count"]) == (NOT_FOUND, 1)
    assert kind["sample_errors"][0]["request"]["identifier"] == "after"
    listed = client.v1.events.list(params={"type": "customer.deleted", "limit": 1})
    [ev] = listed.data
    assert (ev.id, ev.type, ev.created, ev.object, ev.data.object["id"]) == (
        event_id, "customer.deleted", int(received), "event", "cus_late")
    assert listed.has_more is False
    assert client.v1.events.list(params={"type": "customer.*"}).data[0].id == event_id
    assert client.v1.events.list(params={"types": ["invoice.created"]}).data == []
    assert client.v1.events.list(params={"created": {"gt": int(received) + 5}}).data == []
    assert client.v1.customers.retrieve("cus_late").to_dict() == {
        "id": "cus_late", "object": "customer", "deleted": True}
    with pytest.raises(stripe.InvalidRequestError):
        client.v1.events.list(params={"limit": 101})
