"""The fake Stripe's subscription and invoice lifecycle, through the real SDK: the lines' exact
quantities, the invoices' billing reasons, trials (the $0 first invoice, no invoice of the
trial's usage), the first invoice of a subscription, pause and resume, cancellation with and
without a final invoice, marking uncollectible, voiding, a failed finalization, a deleted draft,
the aggregation lag, two subscriptions of one customer on one meter, the events of each
(listed and pushed) and the control routes another process drives them with; each as Stripe
documents it (API 2026-10-28), since they decide whether metered usage lands on an invoice."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from http.server import ThreadingHTTPServer
from typing import Any

import pytest
import requests
import stripe

from support.fake_stripe import FakeStripe, signature_header
from support.test_fake_stripe import API_KEY, NOW, Clock, make_client
from support.test_fake_stripe_billing import summaries
from support.test_fake_stripe_invoices import _Receiver, at, month_after, usage

DAY = 86400
HOUR = 3600
GRACE = 3600
#: Every subscription here starts at the fake's clock (08:00 UTC).
T0 = int(NOW)
#: The UTC midnight before T0: daily summaries over two days cover a daily period from T0.
MIDNIGHT = T0 // DAY * DAY
SECRET = "whsec_fake_lifecycle"


@pytest.fixture
def clock() -> Clock:
    return Clock(NOW)


@pytest.fixture
def fake(clock: Clock) -> Iterator[FakeStripe]:
    with FakeStripe(meters=("api_requests", "tokens"), clock=clock) as f:
        yield f


@pytest.fixture
def client(fake: FakeStripe) -> Iterator[Any]:
    c = make_client(fake.base_url, API_KEY)
    yield c
    c._requestor._client.close()


def invoices_of(client: Any, subscription: str) -> list[Any]:
    """The subscription's invoices through the SDK, newest first."""
    return list(client.v1.invoices.list(
        params={"subscription": subscription, "limit": 100}).auto_paging_iter())


def lines_by_meter(client: Any, invoice: Any) -> dict[str | None, Any]:
    """Event name's meter id (None: the licensed item) -> the invoice's line of that item."""
    sub = client.v1.subscriptions.retrieve(invoice.parent.subscription_details.subscription)
    meter_of = {item.id: item.price.recurring.meter for item in sub["items"].data}
    return {meter_of[line.parent.subscription_item_details.subscription_item]: line
            for line in invoice.lines.data}


def events(client: Any, *types: str) -> list[Any]:
    """The thin events of ``types``, as listed (oldest first)."""
    return list(client.v2.core.events.list(params={"types": list(types)}).auto_paging_iter())


def related(client: Any, *types: str) -> list[tuple[str, str, int]]:
    """(type, related object's id, created) of the events of ``types``."""
    return [(e.type, e.related_object.id, at(e.created)) for e in events(client, *types)]


def test_lines_carry_the_exact_quantity_and_invoices_their_reason_and_currency(
        fake: FakeStripe, client: Any, clock: Clock) -> None:
    sub = fake.create_subscription("cus_A", ("api_requests", "tokens"), period_start=T0,
                                   period_seconds=DAY)
    usage(client, "a1", value=1234, timestamp=T0 + 10)
    fake.add_usage("cus_A", "tokens", T0 + 20, 12.5)
    fake.add_usage("cus_A", "tokens", T0 + 30, 0.25)
    clock.now = T0 + DAY
    [inv] = invoices_of(client, sub)
    assert (inv.billing_reason, inv.currency, inv.status) == (
        "subscription_cycle", "usd", "draft")
    assert inv.status_transitions.marked_uncollectible_at is None
    lines = lines_by_meter(client, inv)
    whole, fraction = lines[fake.meter_id("api_requests")], lines[fake.meter_id("tokens")]
    # The SDK hydrates the decimal string into a Decimal.
    assert (whole.quantity_decimal, whole.quantity, whole.amount) == (Decimal("1234"), 1234, 1234)
    assert isinstance(fraction.quantity_decimal, Decimal)
    assert (fraction.quantity_decimal, fraction.quantity) == (Decimal("12.75"), 12)  # truncated
    assert fraction.amount == 13                      # 12.75 × 1 cent, to the cent, half up
    assert inv.total == 1234 + 13
    raw = {line["quantity_decimal"] for line in fake.invoice(inv.id)["lines"]["data"]}
    assert raw == {"1234", "12.75"}                   # strings on the wire
    assert fake.line_units(inv.id) == {"api_requests": 1234, "tokens": 12}
    clock.now = T0 + DAY + GRACE                      # finalization freezes the exact quantity
    frozen = lines_by_meter(client, client.v1.invoices.retrieve(inv.id))
    assert frozen[fake.meter_id("tokens")].quantity_decimal == Decimal("12.75")


def test_a_trial_has_a_paid_zero_first_invoice_and_its_usage_is_on_no_invoice(
        fake: FakeStripe, client: Any, clock: Clock) -> None:
    trial_end = T0 + 6 * HOUR
    sub = fake.create_subscription("cus_A", period_start=T0, period_seconds=DAY,
                                   trial_seconds=6 * HOUR)
    got = client.v1.subscriptions.retrieve(sub)
    assert (got.status, got.trial_start, got.trial_end, got.start_date,
            got.billing_cycle_anchor) == ("trialing", T0, trial_end, T0, trial_end)
    [item] = got["items"].data
    assert (item.current_period_start, item.current_period_end) == (T0, trial_end)
    [first] = invoices_of(client, sub)
    assert (first.billing_reason, first.status, first.created,
            first.status_transitions.finalized_at, first.status_transitions.paid_at,
            first.automatically_finalizes_at, first.total, first.number is not None) == (
        "subscription_create", "paid", T0, T0, T0, None, 0, True)
    [line] = first.lines.data
    assert (line.period.start, line.period.end, line.quantity, line.quantity_decimal,
            line.amount) == (T0, trial_end, 0, Decimal(0), 0)
    assert fake.invoice(first.id)["lines"]["data"][0]["quantity_decimal"] == "0"

    usage(client, "in-trial", value=7, timestamp=T0 + 60)
    clock.now = T0 + HOUR
    usage(client, "in-trial-2", value=5, timestamp=T0 + HOUR - 10)
    assert fake.line_units(first.id) == {"api_requests": 0}       # frozen at 0
    clock.now = trial_end + 60
    usage(client, "after-trial", value=3, timestamp=trial_end + 30)
    got = client.v1.subscriptions.retrieve(sub)
    assert (got.status, got.trial_start, got.trial_end) == ("active", T0, trial_end)
    [item] = got["items"].data
    assert (item.current_period_start, item.current_period_end) == (trial_end, trial_end + DAY)
    assert [i.id for i in invoices_of(client, sub)] == [first.id]  # none for the trial
    [updated] = events(client, "v1.customer.subscription.updated")
    assert (updated.related_object.id, updated.related_object.type,
            updated.related_object.url, at(updated.created)) == (
        sub, "subscription", f"/v1/subscriptions/{sub}", trial_end)

    clock.now = trial_end + DAY
    cycle, again = invoices_of(client, sub)
    assert again.id == first.id and fake.line_units(first.id) == {"api_requests": 0}
    assert (cycle.billing_reason, cycle.period_start, cycle.period_end) == (
        "subscription_cycle", trial_end, trial_end + DAY)
    assert fake.line_units(cycle.id) == {"api_requests": 3}        # not the trial's 12
    # The summaries count the trial's usage all the same.
    assert sum(v for _, v in summaries(client, fake, "cus_A", MIDNIGHT, MIDNIGHT + 2 * DAY,
                                       "day")) == 15.0
    assert [(t, i) for t, i, _ in related(client, "v1.invoice.created",
                                          "v1.invoice.paid")] == [
        ("v1.invoice.created", first.id), ("v1.invoice.paid", first.id),
        ("v1.invoice.created", cycle.id)]


def test_a_monthly_trial_rolls_months_from_its_end_and_bills_licensed_items_alone(
        fake: FakeStripe, client: Any, clock: Clock) -> None:
    trial_end = T0 + 3 * DAY
    sub = fake.create_subscription("cus_B", period_start=T0, trial_seconds=3 * DAY,
                                   licensed=True)                  # calendar months
    [first] = invoices_of(client, sub)
    lines = lines_by_meter(client, first)
    metered, licensed = lines[fake.meter_id("api_requests")], lines[None]
    assert (metered.period.start, metered.period.end, metered.quantity, metered.amount) == (
        T0, trial_end, 0, 0)
    assert (licensed.period.start, licensed.period.end, licensed.quantity,
            licensed.amount) == (T0, trial_end, 1, 0)                # free in the trial
    assert (first.status, first.total) == ("paid", 0)
    usage(client, "in-trial", value=9, timestamp=T0 + 60)
    clock.now = trial_end
    cycle, _ = invoices_of(client, sub)
    assert (cycle.billing_reason, cycle.status, cycle.created, cycle.period_start,
            cycle.period_end, cycle.automatically_finalizes_at) == (
        "subscription_cycle", "draft", trial_end, T0, trial_end, trial_end + GRACE)
    [only] = cycle.lines.data                         # the licensed line alone, in advance
    assert (only.quantity, only.period.start, only.period.end) == (
        1, trial_end, month_after(trial_end))
    assert fake.line_units(cycle.id) == {}
    got = client.v1.subscriptions.retrieve(sub)
    assert got.status == "active"
    for item in got["items"].data:
        assert (item.current_period_start, item.current_period_end) == (
            trial_end, month_after(trial_end))


def test_the_first_invoice_of_a_subscription_is_made_on_request_and_bills_nothing(
        fake: FakeStripe, client: Any, clock: Clock) -> None:
    plain = fake.create_subscription("cus_A", period_start=T0, period_seconds=DAY)
    sub = fake.create_subscription("cus_B", period_start=T0, period_seconds=DAY,
                                   first_invoice=True)
    assert invoices_of(client, plain) == []                          # the default: none
    [first] = invoices_of(client, sub)
    assert (first.billing_reason, first.status, first.created, first.period_start,
            first.period_end, first.status_transitions.finalized_at, first.total) == (
        "subscription_create", "paid", T0, T0, T0, T0, 0)
    [line] = first.lines.data
    assert (line.period.start, line.period.end, line.quantity, line.quantity_decimal) == (
        T0, T0 + DAY, 0, Decimal(0))
    usage(client, "b1", customer="cus_B", value=4, timestamp=T0 + 10)
    assert fake.line_units(first.id) == {"api_requests": 0}
    clock.now = T0 + DAY
    cycle, again = invoices_of(client, sub)
    assert again.id == first.id and fake.line_units(first.id) == {"api_requests": 0}
    assert (cycle.billing_reason, cycle.period_start, cycle.period_end) == (
        "subscription_cycle", T0, T0 + DAY)
    assert fake.line_units(cycle.id) == {"api_requests": 4}        # the period's own draft
    mine = {first.id, cycle.id}
    assert [e for e in related(client, "v1.invoice.created", "v1.invoice.finalized",
                               "v1.invoice.paid") if e[1] in mine] == [
        ("v1.invoice.created", first.id, T0), ("v1.invoice.finalized", first.id, T0),
        ("v1.invoice.paid", first.id, T0), ("v1.invoice.created", cycle.id, T0 + DAY)]


def test_a_paused_subscription_invoices_nothing_and_resumes_with_a_new_period(
        fake: FakeStripe, client: Any, clock: Clock) -> None:
    sub = fake.create_subscription("cus_A", period_start=T0, period_seconds=DAY)
    usage(client, "before-pause", value=5, timestamp=T0 + 10)
    clock.now = T0 + HOUR
    paused = fake.pause_subscription(sub)
    assert paused["status"] == "paused"
    usage(client, "while-paused", value=6, timestamp=T0 + HOUR + 10)
    clock.now = T0 + 3 * DAY
    assert fake.tick() == {"drafted": 0, "finalized": 0}
    assert invoices_of(client, sub) == []                # the cut period is never invoiced
    got = client.v1.subscriptions.retrieve(sub)
    assert (got.status, got.status_details.paused.transitioned_at,
            got.status_details.paused.type) == ("paused", T0 + HOUR, "subscription")
    [item] = got["items"].data
    assert (item.current_period_start, item.current_period_end) == (T0, T0 + DAY)
    with pytest.raises(ValueError, match="paused"):
        fake.pause_subscription(sub)

    resumed_at = T0 + 3 * DAY
    fake.resume_subscription(sub)
    got = client.v1.subscriptions.retrieve(sub)
    assert (got.status, got.billing_cycle_anchor, got.start_date, got.status_details) == (
        "active", resumed_at, T0, None)
    [item] = got["items"].data
    assert (item.current_period_start, item.current_period_end) == (
        resumed_at, resumed_at + DAY)
    with pytest.raises(ValueError, match="not paused"):
        fake.resume_subscription(sub)
    usage(client, "after-resume", value=2, timestamp=resumed_at + 10)
    clock.now = resumed_at + DAY
    [inv] = invoices_of(client, sub)
    assert (inv.period_start, inv.period_end) == (resumed_at, resumed_at + DAY)
    assert fake.line_units(inv.id) == {"api_requests": 2}
    assert related(client, "v1.customer.subscription.paused",
                   "v1.customer.subscription.resumed", "v1.customer.subscription.updated") == [
        ("v1.customer.subscription.paused", sub, T0 + HOUR),
        ("v1.customer.subscription.updated", sub, T0 + HOUR),
        ("v1.customer.subscription.resumed", sub, resumed_at),
        ("v1.customer.subscription.updated", sub, resumed_at)]


def test_a_cancellation_invoices_the_running_period_only_when_asked(
        fake: FakeStripe, client: Any, clock: Clock) -> None:
    quiet = fake.create_subscription("cus_A", period_start=T0, period_seconds=DAY)
    billed = fake.create_subscription("cus_B", period_start=T0, period_seconds=DAY)
    usage(client, "a1", value=3, timestamp=T0 + 10)
    usage(client, "b1", customer="cus_B", value=4, timestamp=T0 + 10)
    clock.now = T0 + HOUR
    assert fake.cancel_subscription(quiet) is None
    final = fake.cancel_subscription(billed, invoice_now=True)
    assert final is not None
    assert (final["status"], final["billing_reason"], final["created"], final["period_start"],
            final["period_end"], final["status_transitions"]["finalized_at"],
            final["automatically_finalizes_at"]) == (
        "open", "subscription_cycle", T0 + HOUR, T0, T0 + HOUR, T0 + HOUR, None)
    [line] = final["lines"]["data"]
    assert (line["period"], line["quantity"]) == ({"start": T0, "end": T0 + HOUR}, 4)
    clock.now += 5
    usage(client, "b2", customer="cus_B", value=9, timestamp=T0 + 100)   # in it, too late
    clock.now = T0 + 2 * DAY
    assert invoices_of(client, quiet) == []              # its usage is on no invoice
    [only] = invoices_of(client, billed)
    assert only.id == final["id"] and fake.line_units(only.id) == {"api_requests": 4}
    for sub_id in (quiet, billed):
        got = client.v1.subscriptions.retrieve(sub_id)
        assert (got.status, got.canceled_at, got.ended_at) == ("canceled", T0 + HOUR, T0 + HOUR)
    assert related(client, "v1.customer.subscription.deleted") == [
        ("v1.customer.subscription.deleted", quiet, T0 + HOUR),
        ("v1.customer.subscription.deleted", billed, T0 + HOUR)]
    assert [(t, i) for t, i, _ in related(client, "v1.invoice.created",
                                          "v1.invoice.finalized")] == [
        ("v1.invoice.created", final["id"]), ("v1.invoice.finalized", final["id"])]
    assert fake.cancel_subscription(billed, invoice_now=True) is None   # already canceled
    # A paused subscription invoices nothing, even cancelled with invoice_now.
    clock.now = T0 + 2 * DAY
    rested = fake.create_subscription("cus_C", period_start=int(clock.now),
                                      period_seconds=DAY)
    usage(client, "c1", customer="cus_C", value=2, timestamp=int(clock.now) + 10)
    fake.pause_subscription(rested)
    assert fake.cancel_subscription(rested, invoice_now=True) is None


def test_invoices_are_marked_uncollectible_voided_paid_fail_to_finalize_and_are_deleted(
        fake: FakeStripe, client: Any, clock: Clock) -> None:
    subs = fake.create_subscriptions(["cus_A", "cus_B", "cus_C", "cus_D"], period_start=T0,
                                     period_seconds=DAY)
    clock.now = T0 + DAY
    a, b, c, d = (invoices_of(client, s)[0].id for s in subs)
    failed = fake.fail_finalization(c)
    assert (failed["status"], failed["automatically_finalizes_at"]) == (
        "draft", T0 + DAY + GRACE + 3600)
    assert client.v1.invoices.retrieve(c).last_finalization_error.type == "invalid_request_error"
    assert fake.delete_draft(d) == {"id": d, "object": "invoice", "deleted": True}
    with pytest.raises(stripe.InvalidRequestError) as gone:
        client.v1.invoices.retrieve(d)
    assert (gone.value.http_status, gone.value.code) == (404, "resource_missing")
    with pytest.raises(stripe.InvalidRequestError):
        client.v1.invoices.line_items.list(d)
    assert d not in [i.id for i in client.v1.invoices.list(params={"limit": 100}).data]
    assert invoices_of(client, subs[3]) == [] and fake.invoices("cus_D") == []

    clock.now = T0 + DAY + GRACE                       # a's and b's finalize; c's retries
    assert client.v1.invoices.retrieve(c).status == "draft"
    marked = fake.mark_uncollectible(a)
    assert (marked["status"], marked["status_transitions"]["marked_uncollectible_at"],
            marked["amount_paid"]) == ("uncollectible", T0 + DAY + GRACE, 0)
    assert [i.id for i in client.v1.invoices.list(params={"status": "uncollectible"}).data] == [a]
    voided = fake.void_invoice(b)
    assert (voided["status"], voided["status_transitions"]["voided_at"]) == (
        "void", T0 + DAY + GRACE)
    with pytest.raises(ValueError, match="not open"):
        fake.mark_uncollectible(c)                     # a draft
    with pytest.raises(ValueError, match="not draft"):
        fake.delete_draft(a)
    with pytest.raises(ValueError, match="not draft"):
        fake.fail_finalization(b)
    clock.now += 60
    assert fake.pay_invoice(a)["status"] == "paid"     # Stripe pays an uncollectible invoice

    clock.now = T0 + DAY + GRACE + 3600                # the retry succeeds
    retried = client.v1.invoices.retrieve(c)
    assert (retried.status, retried.status_transitions.finalized_at) == (
        "open", T0 + DAY + GRACE + 3600)
    assert related(client, "v1.invoice.finalization_failed", "v1.invoice.deleted",
                   "v1.invoice.marked_uncollectible", "v1.invoice.voided") == [
        ("v1.invoice.finalization_failed", c, T0 + DAY),
        ("v1.invoice.deleted", d, T0 + DAY),
        ("v1.invoice.marked_uncollectible", a, T0 + DAY + GRACE),
        ("v1.invoice.voided", b, T0 + DAY + GRACE)]
    [deleted] = events(client, "v1.invoice.deleted")
    assert (deleted.related_object.type, deleted.related_object.url) == (
        "invoice", f"/v1/invoices/{d}")
    # One v1.invoice.updated per status change: finalized, uncollectible, paid; finalized,
    # void; finalized (once the retry succeeded); none for the deleted draft.
    updates = Counter(i for _, i, _ in related(client, "v1.invoice.updated"))
    assert updates == {a: 3, b: 2, c: 1}


def test_the_aggregation_lag_leaves_late_units_off_the_line_but_not_the_summaries(
        fake: FakeStripe, client: Any, clock: Clock) -> None:
    fake.set_aggregation_lag(30)
    sub = fake.create_subscription("cus_A", period_start=T0, period_seconds=DAY)
    finalizes = T0 + DAY + GRACE
    usage(client, "on-time", value=3, timestamp=T0 + 10)
    clock.now = finalizes - 40
    usage(client, "just-in", value=4, timestamp=T0 + DAY - 100)   # 40 s before: counted
    clock.now = finalizes - 10
    usage(client, "too-late", value=5, timestamp=T0 + DAY - 90)   # 10 s before: missed
    [draft] = invoices_of(client, sub)
    assert draft.status == "draft" and fake.line_units(draft.id) == {"api_requests": 7}
    clock.now = finalizes + 1
    final = client.v1.invoices.retrieve(draft.id)
    assert (final.status, final.status_transitions.finalized_at) == ("open", finalizes)
    assert (final.lines.data[0].quantity, final.total) == (7, 7)
    clock.now = finalizes + 3600                       # the line stays frozen
    assert fake.line_units(draft.id) == {"api_requests": 7}
    assert sum(v for _, v in summaries(client, fake, "cus_A", MIDNIGHT, MIDNIGHT + 2 * DAY,
                                       "day")) == 12.0

    fake.reset()                                       # the lag is back to 0
    start = int(clock.now)
    again = fake.create_subscription("cus_A", period_start=start, period_seconds=DAY)
    clock.now = start + DAY + GRACE - 1
    usage(client, "last-second", value=6, timestamp=start + DAY - 10)
    clock.now = start + DAY + GRACE
    [inv] = invoices_of(client, again)
    assert inv.status == "open" and fake.line_units(inv.id) == {"api_requests": 6}


def test_two_subscriptions_of_one_customer_on_one_meter_each_bill_the_same_events(
        fake: FakeStripe, client: Any, clock: Clock) -> None:
    one = fake.create_subscription("cus_A", ("api_requests",), period_start=T0,
                                   period_seconds=DAY)
    two = fake.create_subscription("cus_A", ("api_requests", "tokens"), period_start=T0,
                                   period_seconds=DAY)
    usage(client, "e1", value=8, timestamp=T0 + 10)
    usage(client, "e2", value=2, timestamp=T0 + 20)
    usage(client, "t1", value=1, timestamp=T0 + 30, event_name="tokens")
    listed = client.v1.subscriptions.list(params={"customer": "cus_A"}).data
    assert sorted(s.id for s in listed) == sorted([one, two])
    clock.now = T0 + DAY + GRACE
    first, second = invoices_of(client, one), invoices_of(client, two)
    assert len(first) == len(second) == 1 and first[0].id != second[0].id
    meter = fake.meter_id("api_requests")
    assert lines_by_meter(client, first[0])[meter].quantity == 10
    assert lines_by_meter(client, second[0])[meter].quantity == 10
    assert fake.line_units(first[0].id) == {"api_requests": 10}
    assert fake.line_units(second[0].id) == {"api_requests": 10, "tokens": 1}
    assert {i.id for i in client.v1.invoices.list(params={"customer": "cus_A"}).data} == {
        first[0].id, second[0].id}


def test_lifecycle_events_are_listed_and_pushed_as_the_destination_is_enabled_for(
        fake: FakeStripe, client: Any, clock: Clock) -> None:
    got: list[tuple[bytes, str]] = []
    handler = type("Receiver", (_Receiver,), {"got": got})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def pushed(count: int) -> list[tuple[str, str]]:
        deadline = time.monotonic() + 5
        while len(got) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.1)                                # nothing more than expected arrives
        return [(e["type"], e["related_object"]["id"])
                for e in (json.loads(body) for body, _ in got)]

    try:
        fake.set_webhook(f"http://127.0.0.1:{server.server_address[1]}/stripe/webhook", SECRET)
        sub = fake.create_subscription("cus_A", period_start=T0, period_seconds=DAY,
                                       trial_seconds=HOUR)
        [first] = invoices_of(client, sub)
        clock.now = T0 + HOUR                          # the trial ends
        fake.tick()
        clock.now += 60
        fake.pause_subscription(sub)
        clock.now += 60
        fake.resume_subscription(sub)
        clock.now += 60
        final = fake.cancel_subscription(sub, invoice_now=True)
        assert final is not None
        listed = [(e.type, e.related_object.id) for e in client.v2.core.events.list(
            params={"limit": 100}).data]
        assert listed == [
            ("v1.invoice.created", first.id), ("v1.invoice.finalized", first.id),
            ("v1.invoice.paid", first.id), ("v1.invoice.updated", first.id),
            ("v1.customer.subscription.updated", sub),
            ("v1.customer.subscription.paused", sub), ("v1.customer.subscription.updated", sub),
            ("v1.customer.subscription.resumed", sub), ("v1.customer.subscription.updated", sub),
            ("v1.invoice.created", final["id"]), ("v1.invoice.finalized", final["id"]),
            ("v1.invoice.updated", final["id"]), ("v1.customer.subscription.deleted", sub)]
        # The destination is enabled for every type but v1.invoice.updated, unless told.
        expected = [e for e in listed if e[0] != "v1.invoice.updated"]
        assert sorted(pushed(len(expected))) == sorted(expected)
        for body, header in got:
            stamp = int(header.split(",")[0].removeprefix("t="))
            assert header == signature_header(body, SECRET, stamp)
            assert "data" not in json.loads(body)                           # thin
        got.clear()
        fake.set_pushed_types(None)
        fake.void_invoice(final["id"])
        assert sorted(pushed(2)) == [("v1.invoice.updated", final["id"]),
                                     ("v1.invoice.voided", final["id"])]
        got.clear()
        fake.set_pushed_types(["v1.invoice.paid"])
        fake.create_subscription("cus_B", period_start=int(clock.now), period_seconds=DAY,
                                 first_invoice=True)
        assert [t for t, _ in pushed(1)] == ["v1.invoice.paid"]
    finally:
        server.shutdown()
        server.server_close()


def test_another_process_drives_the_lifecycle(
        fake: FakeStripe, client: Any, clock: Clock) -> None:
    base = f"{fake.base_url}/_fake/"

    def post(name: str, **body: Any) -> requests.Response:
        return requests.post(base + name, json=body, timeout=5)

    trial = post("subscriptions", customer="cus_A", period_start=T0, period_seconds=DAY,
                 trial_seconds=HOUR).json()["id"]
    b, c = post("subscriptions", customers=["cus_B", "cus_C"], period_start=T0,
                period_seconds=DAY, first_invoice=True).json()["ids"]
    invoices = requests.get(base + "invoices", timeout=5).json()["invoices"]
    assert sorted((i["parent"]["subscription_details"]["subscription"], i["billing_reason"],
                   i["status"]) for i in invoices) == sorted(
        (s, "subscription_create", "paid") for s in (trial, b, c))
    assert client.v1.subscriptions.retrieve(trial).trial_end == T0 + HOUR
    answer = post("pause_subscription", id=trial)
    assert answer.ok and answer.json()["subscription"]["status"] == "paused"
    assert post("pause_subscription", id=trial).status_code == 400        # already paused
    assert post("pause_subscription", id="sub_nope").status_code == 400
    clock.now = T0 + 60
    resumed = post("resume_subscription", id=trial).json()["subscription"]
    assert (resumed["status"], resumed["billing_cycle_anchor"]) == ("active", T0 + 60)
    final = post("cancel_subscription", id=b, invoice_now=True).json()
    assert final["ok"] and final["invoice"]["status"] == "open"
    assert post("cancel_subscription", id=trial).json() == {"ok": True, "invoice": None}
    marked = post("mark_uncollectible", id=final["invoice"]["id"]).json()["invoice"]
    assert marked["status"] == "uncollectible"

    assert post("aggregation_lag", seconds=5).ok
    clock.now = T0 + DAY + 10
    [draft] = [i for i in invoices_of(client, c) if i.status == "draft"]
    usage(client, "c-late", customer="cus_C", value=4, timestamp=T0 + DAY - 5)
    assert fake.line_units(draft.id) == {"api_requests": 0}               # not aggregated yet
    clock.now += 5
    assert fake.line_units(draft.id) == {"api_requests": 4}
    failed = post("fail_finalization", id=draft.id).json()["invoice"]
    assert failed["automatically_finalizes_at"] == T0 + DAY + GRACE + 3600
    assert post("mark_uncollectible", id=draft.id).status_code == 400     # a draft
    assert post("delete_draft", id=draft.id).json() == {
        "id": draft.id, "object": "invoice", "deleted": True}
    assert requests.get(f"{fake.base_url}/v1/invoices/{draft.id}", timeout=5, headers={
        "Authorization": f"Bearer {API_KEY}"}).status_code == 404
    assert post("pushed_types", types=None).ok
    assert post("aggregation_lag", seconds=-1).status_code == 400
