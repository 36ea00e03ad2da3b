"""The fake Stripe after its 200, through the real SDK: meters and their pages, customers
reported later, error reports and the v2 event API, summaries, adjustments and the dedupe
window — each as Stripe documents it (docs/stripe.md), since the product's tests rest on them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import stripe

from support.fake_stripe import AsyncError, FakeStripe
from support.test_fake_stripe import API_KEY, NOW, Clock, make_client, params, send

DAY = 86400
#: 00:00 UTC three days before the fake's clock.
MIDNIGHT = int(NOW) // DAY * DAY - 3 * DAY


@pytest.fixture
def clock() -> Clock:
    return Clock(NOW)


@pytest.fixture
def fake(clock: Clock) -> Iterator[FakeStripe]:
    with FakeStripe(meters=("api_requests", "tokens"), clock=clock,
                    customers=("cus_A", "cus_B"), dedupe_seconds=DAY) as f:
        yield f


@pytest.fixture
def client(fake: FakeStripe) -> Iterator[Any]:
    c = make_client(fake.base_url, API_KEY)
    yield c
    c._requestor._client.close()


def summaries(client: Any, fake: FakeStripe, customer: str, start: int, end: int,
              grouping: str, meter: str = "api_requests") -> list[tuple[int, float]]:
    page = client.v1.billing.meters.event_summaries.list(
        fake.meter_id(meter), params={"customer": customer, "start_time": start,
                                      "end_time": end, "value_grouping_window": grouping})
    return [(int(s.start_time), float(s.aggregated_value)) for s in page.auto_paging_iter()]


def test_meters_are_listed_page_by_page_with_their_keys(fake: FakeStripe, client: Any) -> None:
    fake.page_cap = 1
    fake.add_meter("seats", customer_key="cust", value_key="n", formula="count",
                   status="inactive")
    meters = list(client.v1.billing.meters.list(params={"limit": 100}).auto_paging_iter())
    names = [m.event_name for m in meters]
    assert sorted(names[:2]) == ["api_requests", "tokens"] and names[2] == "seats"
    seats = meters[-1]
    assert (seats.status, seats.customer_mapping.event_payload_key,
            seats.value_settings.event_payload_key, seats.default_aggregation.formula) == (
        "inactive", "cust", "n", "count")


def test_a_pre_aggregated_meter_is_listed_with_its_window_until_replaced(
        fake: FakeStripe, client: Any) -> None:
    """``event_time_window`` is ``day`` or ``hour`` on a pre-aggregated meter, null on an
    ordinary one. Stripe cannot change a meter's window: the event name gets a new meter."""
    import requests

    first = fake.add_meter("seats", event_time_window="day")
    assert requests.post(f"{fake.base_url}/_fake/meters", timeout=5,
                         json={"event_name": "calls", "event_time_window": "hour"}).ok

    def windows() -> dict[str, tuple[str, str | None]]:
        page = client.v1.billing.meters.list(params={"limit": 100})
        return {m.event_name: (m.id, m.event_time_window) for m in page.auto_paging_iter()}

    listed = windows()
    assert (listed["seats"], listed["calls"][1], listed["api_requests"][1]) == (
        (first, "day"), "hour", None)
    # Stripe takes events for it, as for any active meter.
    send(client, params("pre-1", customer="cus_A", event_name="seats"), "k-pre-1")
    assert fake.accept_count() == 1
    second = fake.add_meter("seats")
    assert second != first and windows()["seats"] == (second, None)


def test_an_unknown_customer_gets_a_200_then_a_report_with_samples(
        fake: FakeStripe, client: Any) -> None:
    fake.sample_limit = 2
    for i in range(3):
        send(client, params(f"ghost-{i}", customer="cus_ghost"), f"k{i}")
    send(client, params("fine", customer="cus_A"), "k-fine")
    assert fake.accept_count() == 4                       # every call answered 200
    [event_id] = fake.flush_reports()
    full = client.v2.core.events.retrieve(event_id).to_dict()
    reason = full["data"]["reason"]
    assert reason["error_count"] == 3
    [group] = reason["error_types"]
    assert group["code"] == "meter_event_customer_not_found"
    assert group["error_count"] == 3 and len(group["sample_errors"]) == 2   # samples only
    assert {s["request"]["identifier"] for s in group["sample_errors"]} <= {
        "ghost-0", "ghost-1", "ghost-2"}
    assert full["related_object"]["type"] == "billing.meter"
    # The invalid events never count; the valid one does.
    day = int(NOW) // DAY * DAY
    assert summaries(client, fake, "cus_A", day - DAY, day + DAY, "day") == [(day, 3.0)]
    assert summaries(client, fake, "cus_ghost", day - DAY, day + DAY, "day") == []


def test_events_are_listed_page_by_page_filtered_and_in_either_order(
        fake: FakeStripe, client: Any) -> None:
    fake.page_cap = 2
    ids = [fake.report_errors([AsyncError("api_requests", "meter_event_no_customer_defined",
                                          "missing", f"e{i}")], created_ago=100 - i * 10)
           for i in range(5)]
    old = fake.report_errors([AsyncError("api_requests", "x", "old", "e-old")],
                             created_ago=3600)

    def listed(**extra: Any) -> list[str]:
        p = {"types": ["v1.billing.meter.error_report_triggered"], **extra}
        return [e.id for e in client.v2.core.events.list(params=p).auto_paging_iter()]

    assert listed() == [old, *ids]
    since = "2027-01-15T07:58:40Z"          # NOW - 80 s, RFC 3339
    assert listed(created={"gte": since}) == ids[2:]
    fake.events_newest_first = True
    assert listed(created={"gte": since}) == list(reversed(ids[2:]))
    with pytest.raises(stripe.InvalidRequestError):
        client.v2.core.events.retrieve("evt_nope")


def test_summaries_by_day_and_hour_align_count_and_paginate(
        fake: FakeStripe, client: Any, clock: Clock) -> None:
    for i, (offset, value) in enumerate([(3600, 2), (3600 + 60, 5), (DAY + 7200, 4)]):
        send(client, params(f"s{i}", value=str(value), timestamp=MIDNIGHT + offset), f"ks{i}")
    fake.add_usage("cus_A", "api_requests", MIDNIGHT + 2 * DAY + 60, 10)   # another system
    fake.page_cap = 2
    by_day = summaries(client, fake, "cus_A", MIDNIGHT, MIDNIGHT + 3 * DAY, "day")
    assert by_day == [(MIDNIGHT, 7.0), (MIDNIGHT + DAY, 4.0), (MIDNIGHT + 2 * DAY, 10.0)]
    by_hour = summaries(client, fake, "cus_A", MIDNIGHT, MIDNIGHT + 3 * 3600, "hour")
    assert by_hour == [(MIDNIGHT + 3600, 7.0)]
    assert summaries(client, fake, "cus_B", MIDNIGHT, MIDNIGHT + DAY, "day") == []
    # Day windows must start at 00:00 UTC; hour windows on the hour; minutes at least.
    for start, grouping in ((MIDNIGHT + 3600, "day"), (MIDNIGHT + 60, "hour")):
        with pytest.raises(stripe.InvalidRequestError):
            summaries(client, fake, "cus_A", start, start + DAY, grouping)
    # A count meter counts events, not units.
    fake.add_meter("seats", formula="count")
    send(client, {**params("c1", timestamp=MIDNIGHT + 60), "event_name": "seats"}, "kc1")
    send(client, {**params("c2", timestamp=MIDNIGHT + 120), "event_name": "seats"}, "kc2")
    assert summaries(client, fake, "cus_A", MIDNIGHT, MIDNIGHT + DAY, "day", "seats") == [
        (MIDNIGHT, 2.0)]
    # Eventually consistent: with a delay, what was just received is not counted yet.
    clock.now += 60
    fake.summary_delay = 30
    send(client, params("late", value="100", timestamp=MIDNIGHT + 600), "k-late")
    assert summaries(client, fake, "cus_A", MIDNIGHT, MIDNIGHT + DAY, "day") == [
        (MIDNIGHT, 7.0)]
    clock.now += 31
    assert summaries(client, fake, "cus_A", MIDNIGHT, MIDNIGHT + DAY, "day") == [
        (MIDNIGHT, 107.0)]


def test_a_forgotten_day_counts_nothing_or_part_and_keeps_its_identifiers(
        fake: FakeStripe, client: Any) -> None:
    """``forget`` makes Stripe lose a customer's day of a meter (also from another process):
    its summaries count none of it, or the first ``keep`` events received; the identifiers
    stay taken; what is accepted later counts; other days and customers are untouched."""
    import requests

    for i, value in enumerate((5, 3, 2)):
        send(client, params(f"f{i}", value=str(value), timestamp=MIDNIGHT + 60 + i), f"kf{i}")
    send(client, params("next-day", value="7", timestamp=MIDNIGHT + DAY + 60), "kf-next")
    send(client, params("other", customer="cus_B", value="4", timestamp=MIDNIGHT + 60), "kf-b")
    day = time.strftime("%Y-%m-%d", time.gmtime(MIDNIGHT))
    assert fake.forget("cus_A", "api_requests", day, keep=1) == 2

    def by_day(customer: str = "cus_A") -> list[tuple[int, float]]:
        return summaries(client, fake, customer, MIDNIGHT, MIDNIGHT + 2 * DAY, "day")

    assert by_day() == [(MIDNIGHT, 5.0), (MIDNIGHT + DAY, 7.0)]        # the first one kept
    done = requests.post(f"{fake.base_url}/_fake/forget", timeout=5, json={
        "customer": "cus_A", "event_name": "api_requests", "day": day})
    assert done.status_code == 200 and done.json() == {"forgotten": 1}
    assert by_day() == [(MIDNIGHT + DAY, 7.0)]                          # none of that day
    assert by_day("cus_B") == [(MIDNIGHT, 4.0)]
    with pytest.raises(stripe.InvalidRequestError, match="already exists"):
        send(client, params("f0", value="5", timestamp=MIDNIGHT + 60), "kf0-again")
    send(client, params("f0~r1", value="5", timestamp=MIDNIGHT + 60), "kf0-new")
    assert by_day() == [(MIDNIGHT, 5.0), (MIDNIGHT + DAY, 7.0)]


def test_adjustments_cancel_within_24_hours_only(fake: FakeStripe, client: Any,
                                                 clock: Clock) -> None:
    send(client, params("a1", value="5", timestamp=MIDNIGHT + 60), "ka1")
    send(client, params("a2", value="3", timestamp=MIDNIGHT + 120), "ka2")

    def cancel(identifier: str) -> Any:
        return client.v1.billing.meter_event_adjustments.create(params={
            "event_name": "api_requests", "type": "cancel", "cancel": {"identifier": identifier}})

    adjustment = cancel("a1")
    assert (adjustment.status, adjustment.cancel.identifier) == ("pending", "a1")
    assert adjustment.object == "billing.meter_event_adjustment"
    assert "id" not in adjustment.to_dict()               # the v1 object documents none
    assert fake.adjustments() == [{"identifier": "a1", "event_name": "api_requests",
                                   "status": "pending", "id": None,
                                   "request_id": adjustment.last_response.request_id}]
    assert summaries(client, fake, "cus_A", MIDNIGHT, MIDNIGHT + DAY, "day") == [
        (MIDNIGHT, 3.0)]
    clock.now += DAY + 1
    with pytest.raises(stripe.InvalidRequestError, match="24 hours"):
        cancel("a2")
    with pytest.raises(stripe.InvalidRequestError) as exc:
        cancel("never-sent")
    assert exc.value.code == "resource_missing"
    assert summaries(client, fake, "cus_A", MIDNIGHT, MIDNIGHT + DAY, "day") == [
        (MIDNIGHT, 3.0)]                                # a2 still counts


def test_an_identifier_is_deduplicated_only_for_the_window(
        fake: FakeStripe, client: Any, clock: Clock) -> None:
    send(client, params("d1", timestamp=int(NOW) - 60), "kd1")
    with pytest.raises(stripe.InvalidRequestError):
        send(client, params("d1", timestamp=int(NOW) - 60), "kd1-again")
    assert fake.duplicate_identifier_rejections() == 1
    clock.now += DAY                                     # the dedupe window has passed
    send(client, params("d1", timestamp=int(NOW) - 60), "kd1-later")
    assert [e.identifier for e in fake.also_accepted()] == ["d1"]   # Stripe counts it twice
    day = int(NOW) // DAY * DAY
    assert summaries(client, fake, "cus_A", day - DAY, day + DAY, "day") == [(day, 6.0)]


def test_adjustments_answer_as_a_test_asks(fake: FakeStripe, client: Any) -> None:
    for n in range(3):
        send(client, params(f"b{n}", timestamp=MIDNIGHT + 60 + n), f"kb{n}")

    def cancel(identifier: str) -> Any:
        return client.v1.billing.meter_event_adjustments.create(params={
            "event_name": "api_requests", "type": "cancel", "cancel": {"identifier": identifier}})

    fake.answer_adjustments(status="complete", ids=True)
    first, second = cancel("b0"), cancel("b1")
    assert (first.status, second.status) == ("complete", "complete")
    assert first.id.startswith("mea_") and second.id.startswith("mea_") and first.id != second.id
    fake.answer_adjustments(ids="mea_" + "x" * 300)
    third = cancel("b2")
    assert (third.status, third.id) == ("pending", "mea_" + "x" * 300)
    assert [(a["identifier"], a["status"], a["id"]) for a in fake.adjustments()] == [
        ("b0", "complete", first.id), ("b1", "complete", second.id),
        ("b2", "pending", third.id)]
    fake.reset()                                          # back to Stripe's own answer
    assert fake.adjustments() == []
    send(client, params("b3", timestamp=MIDNIGHT + 63), "kb3-again")
    fourth = cancel("b3")
    assert fourth.status == "pending" and "id" not in fourth.to_dict()


def test_a_customer_is_found_deleted_or_missing_as_stripe_answers(fake: FakeStripe,
                                                                   client: Any) -> None:
    """``GET /v1/customers/{id}``: the customer; a deleted one's stub; a 404
    ``resource_missing`` for an unknown id. Deleting one later (also from another process)
    makes its later events refused after the 200."""
    assert client.v1.customers.retrieve("cus_A").id == "cus_A"
    with pytest.raises(stripe.InvalidRequestError) as info:
        client.v1.customers.retrieve("cus_nobody")
    assert info.value.http_status == 404 and info.value.code == "resource_missing"
    import requests

    assert requests.post(f"{fake.base_url}/_fake/delete_customer", json={"id": "cus_A"},
                         timeout=5).status_code == 200
    assert client.v1.customers.retrieve("cus_A").to_dict()["deleted"] is True
    assert fake.customer_lookups == {"cus_A": 2, "cus_nobody": 1}
    send(client, params("after-delete", customer="cus_A"), "after-delete")
    fake.flush_reports()
    codes = [t["code"] for e in fake.events() for t in e["data"]["reason"]["error_types"]]
    assert codes == ["meter_event_customer_not_found"]


def test_a_report_can_be_asked_for_from_another_process(fake: FakeStripe) -> None:
    import requests

    made = requests.post(f"{fake.base_url}/_fake/report", timeout=5, json={
        "event_name": "api_requests", "code": "meter_event_invalid_value",
        "message": "bad", "identifier": "bo-stream-x"}).json()["event"]
    [event] = fake.events()
    assert event["id"] == made
    [kind] = event["data"]["reason"]["error_types"]
    assert kind["sample_errors"][0]["request"]["identifier"] == "bo-stream-x"
