"""The fake Stripe's subscriptions and invoices, through the real SDK: metered items with their
periods, the draft Stripe makes at a period's end and finalizes after the grace period, what a
line counts before and after that, the invoice list and its filters, lines past the embedded
ten, the ``v1.invoice.*`` events (listed and pushed), reset, and a bulk listing; each as Stripe
documents it (API 2025-03-31 and later), since the product's invoice-first reads rest on them."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests
import stripe

from support.fake_stripe import FakeStripe, signature_header
from support.test_fake_stripe import API_KEY, NOW, Clock, make_client, params, send
from support.test_fake_stripe_billing import summaries

DAY = 86400
#: A daily period that started 23h50 before the fake's clock: it ends 10 minutes after it.
START = int(NOW) - DAY + 600
END = START + DAY
GRACE = 3600
SECRET = "whsec_fake_invoices"


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


def usage(client: Any, key: str, *, customer: str = "cus_A", value: int = 1,
          timestamp: int | None = None, event_name: str = "api_requests") -> Any:
    """One meter event through the SDK (``client.v1.billing.meter_events.create``)."""
    return send(client, params(key, customer=customer, value=str(value),
                               timestamp=timestamp, event_name=event_name), key)


def at(rfc3339: str) -> int:
    return int(datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp())


def month_after(ts: int) -> int:
    when = datetime.fromtimestamp(ts, UTC)
    month = when.month % 12 + 1
    return int(when.replace(year=when.year + (when.month == 12), month=month).timestamp())


def test_subscriptions_are_listed_page_by_page_with_their_items_and_periods(
        fake: FakeStripe, client: Any, clock: Clock) -> None:
    a = fake.create_subscription("cus_A", ("api_requests", "tokens"), period_start=START,
                                 period_seconds=DAY)
    clock.now += 1
    b = fake.create_subscription("cus_B", period_start=START, licensed=True)  # months
    clock.now += 1
    gone = fake.create_subscription("cus_C", period_start=START, status="canceled")
    clock.now += 1
    d = fake.create_subscription("cus_A", ("tokens",), period_start=START, period_seconds=DAY)
    fake.cancel_subscription(d)

    listed = list(client.v1.subscriptions.list(
        params={"status": "all", "limit": 2}).auto_paging_iter())
    assert [s.id for s in listed] == [d, gone, b, a]                 # newest first
    assert fake.subscription_list_calls == 2
    first = listed[-1]
    assert (first.object, first.customer, first.status) == ("subscription", "cus_A", "active")
    assert "current_period_start" not in first.to_dict()              # on the items since 2025
    items = first["items"]
    assert (items.total_count, items.has_more, items.url) == (
        2, False, f"/v1/subscription_items?subscription={a}")
    for item, name in zip(items.data, ("api_requests", "tokens"), strict=True):
        assert (item.object, item.subscription) == ("subscription_item", a)
        assert (item.current_period_start, item.current_period_end) == (START, END)
        assert item.price.recurring.meter == fake.meter_id(name)
        assert (item.price.recurring.usage_type, item.price.recurring.interval) == (
            "metered", "day")
        assert item.price.id.startswith("price_") and item.price.product.startswith("prod_")
    metered, licensed = listed[2]["items"].data
    assert (metered.current_period_start, metered.current_period_end) == (
        START, month_after(START))
    assert metered.price.recurring.interval == "month"
    assert (licensed.price.recurring.usage_type, licensed.price.recurring.meter,
            licensed.quantity) == ("licensed", None, 1)

    default = client.v1.subscriptions.list(params={"limit": 100})
    assert [s.id for s in default.data] == [b, a] and not default.has_more   # no canceled
    mine = client.v1.subscriptions.list(params={"customer": "cus_A", "status": "all"})
    assert [s.id for s in mine.data] == [d, a]
    assert client.v1.subscriptions.list(params={"status": "canceled"}).data[0].id == d
    assert client.v1.subscriptions.retrieve(d).status == "canceled"
    with pytest.raises(stripe.InvalidRequestError) as bad:
        client.v1.subscriptions.list(params={"limit": 101})
    assert bad.value.http_status == 400 and bad.value.param == "limit"
    with pytest.raises(stripe.InvalidRequestError) as unknown:
        client.v1.subscriptions.list(params={"starting_after": "sub_nope"})
    assert unknown.value.code == "resource_missing"
    with pytest.raises(stripe.InvalidRequestError) as missing:
        client.v1.subscriptions.retrieve("sub_nope")
    assert missing.value.http_status == 404


def test_a_period_end_drafts_one_invoice_per_subscription_and_moves_the_period(
        fake: FakeStripe, client: Any, clock: Clock) -> None:
    a = fake.create_subscription("cus_A", ("api_requests", "tokens"), period_start=START,
                                 period_seconds=DAY)
    b = fake.create_subscription("cus_B", period_start=START, period_seconds=DAY)
    usage(client, "a1", value=3)
    usage(client, "a2", value=5, event_name="tokens")
    usage(client, "b0", customer="cus_B", value=100, timestamp=START - 10)   # before the period
    usage(client, "b1", customer="cus_B", value=4)
    assert fake.invoices() == []
    clock.now = END
    assert fake.tick() == {"drafted": 2, "finalized": 0}

    invoices = list(client.v1.invoices.list().auto_paging_iter())
    by_sub = {i.parent.subscription_details.subscription: i for i in invoices}
    assert set(by_sub) == {a, b}
    inv = by_sub[a]
    assert (inv.object, inv.status, inv.customer, inv.created, inv.period_start,
            inv.period_end, inv.automatically_finalizes_at) == (
        "invoice", "draft", "cus_A", END, START, END, END + GRACE)
    assert inv.parent.type == "subscription_details"
    assert inv.status_transitions.finalized_at is None
    [sub] = [s for s in client.v1.subscriptions.list().data if s.id == a]
    item_of = {item.price.recurring.meter: item.id for item in sub["items"].data}
    quantities = {}
    for line in inv.lines.data:
        assert (line.object, line.invoice, line.period.start, line.period.end) == (
            "line_item", inv.id, START, END)
        details = line.parent.subscription_item_details
        assert (line.parent.type, details.subscription, details.proration) == (
            "subscription_item_details", a, False)
        assert line.pricing.price_details.price.startswith("price_")
        assert line.amount == line.quantity                            # unit amount 1
        quantities[details.subscription_item] = line.quantity
    assert quantities == {item_of[fake.meter_id("api_requests")]: 3,
                          item_of[fake.meter_id("tokens")]: 5}
    assert (inv.total, inv.amount_due) == (8, 8)
    assert [line.quantity for line in by_sub[b].lines.data] == [4]
    # The items' period moved to the next one.
    for item in sub["items"].data:
        assert (item.current_period_start, item.current_period_end) == (END, END + DAY)

    # Two more periods pass before anyone looks: one invoice each.
    clock.now = END + 2 * DAY
    assert fake.tick() == {"drafted": 4, "finalized": 4}
    assert [(i["period_start"], i["period_end"], i["status"])
            for i in fake.invoices("cus_B")] == [
        (END + DAY, END + 2 * DAY, "draft"), (END, END + DAY, "open"), (START, END, "open")]


def test_usage_in_the_grace_period_counts_and_finalization_freezes_the_line(
        fake: FakeStripe, client: Any, clock: Clock) -> None:
    fake.create_subscription("cus_A", period_start=START, period_seconds=DAY)
    usage(client, "in-period", value=3)
    clock.now = END + 60                                      # the grace period
    usage(client, "in-grace", value=4, timestamp=END - 10)
    fake.add_usage("cus_A", "api_requests", END - 20, 2)
    usage(client, "next-period", value=6, timestamp=END + 10)
    [draft] = fake.invoices()
    assert draft["status"] == "draft" and fake.line_units(draft["id"]) == {"api_requests": 9}
    assert client.v1.invoices.retrieve(draft["id"]).lines.data[0].quantity == 9

    clock.now = END + GRACE + 5          # past automatically_finalizes_at; nobody ticked
    fake.add_usage("cus_A", "api_requests", END - 40, 7)     # received after the moment
    late = usage(client, "late", value=5, timestamp=END - 30)   # accepted: 35 days allowed
    assert late.identifier == "late"
    final = client.v1.invoices.retrieve(draft["id"])
    assert (final.status, final.status_transitions.finalized_at,
            final.automatically_finalizes_at) == ("open", END + GRACE, None)
    assert (final.lines.data[0].quantity, final.total) == (9, 9)
    # The summaries count the late units; no invoice does.
    day = END // DAY * DAY
    assert summaries(client, fake, "cus_A", day, day + DAY, "day") == [(day, 27.0)]
    clock.now = END + DAY
    newest, first = fake.invoices()
    assert first["id"] == draft["id"] and (newest["period_start"], newest["period_end"]) == (
        END, END + DAY)
    assert fake.line_units(newest["id"]) == {"api_requests": 6}
    assert fake.line_units(first["id"]) == {"api_requests": 9}


def test_an_invoice_finalized_early_stops_counting_then(
        fake: FakeStripe, client: Any, clock: Clock) -> None:
    fake.create_subscription("cus_A", period_start=START, period_seconds=DAY)
    fake.create_subscription("cus_B", period_start=START, period_seconds=DAY)
    usage(client, "a1", value=3)
    clock.now = END + 60
    [inv_a] = [i["id"] for i in fake.invoices("cus_A")]
    [inv_b] = [i["id"] for i in fake.invoices("cus_B")]
    done = fake.finalize_invoice(inv_a)
    assert (done["status"], done["status_transitions"]["finalized_at"],
            done["automatically_finalizes_at"], done["number"] is not None) == (
        "open", END + 60, None, True)
    clock.now += 1
    usage(client, "a2", value=4, timestamp=END - 10)       # in its period, after finalizing
    assert fake.line_units(inv_a) == {"api_requests": 3}
    with pytest.raises(ValueError, match="already finalized"):
        fake.finalize_invoice(inv_a)
    # From another process.
    base = f"{fake.base_url}/_fake/finalize_invoice"
    answer = requests.post(base, json={"id": inv_b}, timeout=5)
    assert answer.status_code == 200 and answer.json()["invoice"]["status"] == "open"
    assert requests.post(base, json={"id": "in_nope"}, timeout=5).status_code == 400
    clock.now = END + 2 * GRACE
    assert fake.tick() == {"drafted": 0, "finalized": 0}           # nothing left to finalize
    finalized = client.v2.core.events.list(params={"types": ["v1.invoice.finalized"]})
    assert sorted(e.related_object.id for e in finalized.data) == sorted([inv_a, inv_b])
    paid = fake.pay_invoice(inv_a)
    assert (paid["status"], paid["status_transitions"]["paid_at"], paid["amount_paid"],
            paid["amount_remaining"]) == ("paid", END + 2 * GRACE, 3, 0)
    voided = fake.void_invoice(inv_b)
    assert (voided["status"], voided["status_transitions"]["voided_at"]) == (
        "void", END + 2 * GRACE)
    assert [i.id for i in client.v1.invoices.list(params={"status": "paid"}).data] == [inv_a]
    with pytest.raises(ValueError, match="not open"):
        fake.void_invoice(inv_a)


def test_invoices_are_listed_newest_first_filtered_and_paged(
        fake: FakeStripe, client: Any, clock: Clock) -> None:
    a = fake.create_subscription("cus_A", period_start=START, period_seconds=DAY)
    b = fake.create_subscription("cus_B", period_start=START + 3600, period_seconds=DAY)
    c = fake.create_subscription("cus_B", ("tokens",), period_start=START, period_seconds=DAY)
    clock.now = END + 3600                 # a's and c's finalized; b's just drafted

    def listed(**p: Any) -> list[str]:
        found = client.v1.invoices.list(params={"limit": 2, **p}).auto_paging_iter()
        return [i.parent.subscription_details.subscription for i in found]

    every = list(client.v1.invoices.list(params={"limit": 2}).auto_paging_iter())
    assert [i.parent.subscription_details.subscription for i in every] == [b, c, a]
    assert fake.invoice_list_calls == 2
    assert [i.created for i in every] == [END + 3600, END, END]
    assert every[1].id > every[2].id                          # a tie: the later id first
    assert listed(status="draft") == [b] and listed(status="open") == [c, a]
    assert listed(customer="cus_B") == [b, c] and listed(subscription=c) == [c]
    assert listed(customer="cus_B", status="open") == [c]
    assert listed(created={"gte": END + 1}) == [b]
    assert listed(created={"lt": END + 3600}) == [c, a] == listed(created={"lte": END})
    assert listed(created={"gt": END, "lte": END + 3600}) == [b]
    assert listed(created={"gte": END + 3601}) == []
    page = client.v1.invoices.list(params={"limit": 1, "starting_after": every[0].id})
    assert [i.id for i in page.data] == [every[1].id] and page.has_more
    with pytest.raises(stripe.InvalidRequestError) as missing:
        client.v1.invoices.retrieve("in_nope")
    assert (missing.value.http_status, missing.value.code) == (404, "resource_missing")
    assert "No such invoice: 'in_nope'" in str(missing.value)
    assert fake.invoice_retrieve_calls == 1
    for bad in ({"status": "finished"}, {"limit": 0}, {"starting_after": "in_nope"}):
        with pytest.raises(stripe.InvalidRequestError) as refused:
            client.v1.invoices.list(params=bad)
        assert refused.value.http_status == 400


def test_an_invoice_of_twelve_metered_items_pages_its_lines(
        fake: FakeStripe, client: Any, clock: Clock) -> None:
    names = [f"m{i:02d}" for i in range(12)]
    for name in names:
        fake.add_meter(name)
    sub = fake.create_subscription("cus_A", names, period_start=START, period_seconds=DAY)
    for i, name in enumerate(names):
        usage(client, f"e{i}", value=i + 1, event_name=name)
    clock.now = END
    [inv] = client.v1.invoices.list(params={"customer": "cus_A"}).data
    assert (len(inv.lines.data), inv.lines.has_more, inv.lines.total_count, inv.lines.url) == (
        10, True, 12, f"/v1/invoices/{inv.id}/lines")
    assert inv.total == sum(range(1, 13))                       # every line, not the ten
    lines = list(client.v1.invoices.line_items.list(
        inv.id, params={"limit": 5}).auto_paging_iter())
    assert len({line.id for line in lines}) == 12 and fake.invoice_line_calls == 3
    [listed_sub] = client.v1.subscriptions.list().data
    assert listed_sub.id == sub
    assert {line.parent.subscription_item_details.subscription_item for line in lines} == {
        item.id for item in listed_sub["items"].data}
    assert fake.line_units(inv.id) == {name: i + 1 for i, name in enumerate(names)}
    rest = client.v1.invoices.line_items.list(
        inv.id, params={"starting_after": inv.lines.data[-1].id})
    assert [line.id for line in rest.data] == [line.id for line in lines[10:]]
    assert not rest.has_more
    with pytest.raises(stripe.InvalidRequestError) as missing:
        client.v1.invoices.line_items.list("in_nope")
    assert missing.value.http_status == 404


class _Receiver(BaseHTTPRequestHandler):
    """An event destination: keeps each push's body and ``Stripe-Signature``."""

    got: list[tuple[bytes, str]]

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.got.append((body, self.headers.get("Stripe-Signature", "")))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Quiet."""


def test_invoice_events_are_listed_at_their_moment_and_pushed(
        fake: FakeStripe, client: Any, clock: Clock) -> None:
    got: list[tuple[bytes, str]] = []
    handler = type("Receiver", (_Receiver,), {"got": got})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        fake.set_webhook(f"http://127.0.0.1:{server.server_address[1]}/stripe/webhook", SECRET)
        fake.create_subscription("cus_A", period_start=START, period_seconds=DAY)
        clock.now = END + GRACE + 120            # both moments passed before anyone looked

        def events(*types: str) -> list[Any]:
            return list(client.v2.core.events.list(
                params={"types": list(types)}).auto_paging_iter())

        [created] = events("v1.invoice.created")       # the listing's request did the tick
        [inv] = fake.invoices()
        assert (created.related_object.id, created.related_object.type,
                created.related_object.url) == (inv["id"], "invoice", f"/v1/invoices/{inv['id']}")
        assert at(created.created) == END                       # the draft's moment
        [finalized] = events("v1.invoice.finalized")
        assert finalized.related_object.id == inv["id"]
        assert at(finalized.created) == END + GRACE             # the finalization's moment
        assert len(events("v1.invoice.created", "v1.invoice.finalized")) == 2
        assert events("v1.billing.meter.error_report_triggered") == []

        deadline = time.monotonic() + 5
        while len(got) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        pushed = [json.loads(body) for body, _ in got]
        assert [(e["type"], e["related_object"]["id"]) for e in pushed] == [
            ("v1.invoice.created", inv["id"]), ("v1.invoice.finalized", inv["id"])]
        assert all("data" not in e for e in pushed)                         # thin
        for body, header in got:
            stamp = int(header.split(",")[0].removeprefix("t="))
            assert header == signature_header(body, SECRET, stamp)
    finally:
        server.shutdown()
        server.server_close()


def test_reset_clears_subscriptions_invoices_and_their_settings(
        fake: FakeStripe, client: Any, clock: Clock) -> None:
    fake.grace_seconds = 7200
    fake.set_list_latency(0.3)
    fake.create_subscription("cus_A", period_start=START, period_seconds=DAY)
    clock.now = END
    [inv] = client.v1.invoices.list().data
    assert inv.automatically_finalizes_at == END + 7200
    client.v1.invoices.retrieve(inv.id)
    client.v1.subscriptions.list()
    assert (fake.invoice_list_calls, fake.invoice_retrieve_calls,
            fake.subscription_list_calls) == (1, 1, 1)
    fake.reset()
    assert fake.subscriptions() == [] and fake.invoices() == [] and fake.events() == []
    assert (fake.invoice_list_calls, fake.invoice_retrieve_calls, fake.subscription_list_calls,
            fake.grace_seconds) == (0, 0, 0, 3600)
    assert (fake.state()["subscriptions"], fake.state()["invoices"]) == (0, 0)
    clock.now = END + 10 * DAY
    assert fake.tick() == {"drafted": 0, "finalized": 0}            # the schedule went too
    started = time.monotonic()
    assert client.v1.subscriptions.list(params={"status": "all"}).data == []
    assert time.monotonic() - started < 0.3                         # no list latency
    fake.create_subscription("cus_A", period_start=int(clock.now) - 60, period_seconds=DAY)
    clock.now += DAY
    [again] = fake.invoices()
    assert again["automatically_finalizes_at"] == again["created"] + 3600


def test_another_process_drives_subscriptions_and_invoices(
        fake: FakeStripe, client: Any, clock: Clock) -> None:
    base = f"{fake.base_url}/_fake/"
    one = requests.post(base + "subscriptions", timeout=5, json={
        "customer": "cus_A", "meters": ["api_requests", "tokens"], "period_start": START,
        "period_seconds": DAY, "grace_seconds": 7200}).json()["id"]
    many = requests.post(base + "subscriptions", timeout=5, json={
        "customers": ["cus_B", "cus_C"], "period_start": START,
        "period_seconds": DAY}).json()["ids"]
    assert len(set(many)) == 2 and one not in many
    assert requests.post(base + "subscriptions", timeout=5, json={
        "customer": "cus_D", "meters": ["nope"], "period_start": START}).status_code == 400
    clock.now = END
    assert requests.post(base + "tick", timeout=5).status_code == 200
    invoices = requests.get(base + "invoices", timeout=5).json()["invoices"]
    finalizes = {i["parent"]["subscription_details"]["subscription"]:
                 i["automatically_finalizes_at"] for i in invoices}
    assert finalizes == {one: END + 7200, many[0]: END + GRACE, many[1]: END + GRACE}
    assert requests.post(base + "cancel_subscription", timeout=5,
                         json={"id": many[0]}).status_code == 200
    subs = requests.get(base + "subscriptions", timeout=5).json()["subscriptions"]
    assert {s["id"]: s["status"] for s in subs} == {
        one: "active", many[0]: "canceled", many[1]: "active"}
    assert requests.post(base + "list_latency", timeout=5, json={"seconds": 0.3}).ok
    started = time.monotonic()
    assert len(client.v1.subscriptions.list().data) == 2
    assert time.monotonic() - started >= 0.3
    assert fake.state()["subscription_list_calls"] == 1


def test_two_thousand_subscriptions_are_listed_in_twenty_pages(
        fake: FakeStripe, client: Any, clock: Clock) -> None:
    customers = [f"cus_bulk{i:05d}" for i in range(2000)]
    ids = fake.create_subscriptions(customers, ("api_requests",), period_start=START,
                                    period_seconds=DAY)
    assert len(set(ids)) == 2000
    listed = list(client.v1.subscriptions.list(
        params={"status": "all", "limit": 100}).auto_paging_iter())
    assert [s.id for s in listed] == list(reversed(ids))
    assert fake.subscription_list_calls == 20
    assert {s.customer for s in listed} == set(customers)
    clock.now = END
    assert fake.tick() == {"drafted": 2000, "finalized": 0}
    assert fake.tick() == {"drafted": 0, "finalized": 0}
