"""Issue 44, the invoice line as the judge, against the fake Stripe through the real SDK, on
SQLite and PostgreSQL: each case Stripe documents where the time of a send says nothing about
the invoice — an answer lost before the finalization and retried after it, aggregation that
misses an event accepted just before, a trial's $0 first invoice, a paused subscription, one
cancelled without a final invoice, a customer with no metered item, a voided and an
uncollectible invoice, two items on one meter.

One clock drives the fake and our services (real time plus an offset the test moves), so a
grace period passes without waiting for it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, timedelta
from typing import Any

import pytest
from conftest import make_settings
from sqlalchemy import Engine
from support.billing_world import GRACE, METER, PERIOD, Clock, World
from support.fake_stripe import FakeStripe

from webapp.outbox import late, late_lines, operations


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def world(engine: Engine, db_url: str, clock: Clock) -> Iterator[World]:
    fake = FakeStripe(separate_streams=True, clock=clock.seconds).start()
    try:
        settings = make_settings(db_url, stripe_api_base=fake.base_url,
                                 stripe_meter_events_base=fake.meter_events_url)
        made = World(engine, fake, settings, clock)
        try:
            yield made
        finally:
            made.drainer.close()
    finally:
        fake.stop()


def test_an_answer_lost_before_the_finalization_is_not_late(world: World) -> None:
    """Stripe took the event during the grace period; its answer was lost; the retry after
    the finalization is answered with the first answer again. Recorded as sent after the
    finalization, it is on the invoice: billing it next would bill it twice."""
    world.tenant("acme", "cus_A")
    world.subscribe("cus_A")
    on_time = world.enqueue("acme", "a0", 5, world.end() - timedelta(minutes=30))
    world.drain([on_time])
    crossing = world.enqueue("acme", "a1", 7, world.end() - timedelta(minutes=20))
    world.clock.move_to(world.end() + timedelta(seconds=GRACE - 60))
    world.fake.fail_next("drop")                      # taken, then the answer is lost
    world.drainer.drain_once()
    assert world.rows([crossing])[crossing].status == "retrying"
    world.clock.move_to(world.end() + timedelta(seconds=GRACE + 60))
    world.drain([crossing])
    world.refresher.run_once()
    row = world.rows([crossing])[crossing]
    [line] = world.lines("cus_A")
    assert row.sent_at.replace(tzinfo=UTC) > line.finalized_at.replace(tzinfo=UTC)
    assert (line.quantity_decimal, line.verdict, line.ours, line.late) == ("12", "matches", 12, 0)
    assert world.late_ids() == []
    # Never billed or written off alone.
    with pytest.raises(operations.OperationError, match="is billed on invoice .*not late"):
        late.bill_next(world.engine, [crossing], actor="ops", note="x", now=world.clock())


def test_late_and_short_lines(world: World) -> None:
    """An outage across the finalization leaves two events late; an event accepted a minute
    before the finalization misses the line (Stripe aggregates late): the line is short by
    its units, one amount of late usage, never sent again as an event."""
    world.tenant("acme", "cus_A")
    world.subscribe("cus_A")
    world.fake.set_aggregation_lag(120)
    first = world.enqueue("acme", "b0", 5, world.end() - timedelta(minutes=30))
    world.drain([first])
    missed = world.enqueue("acme", "b1", 3, world.end() - timedelta(minutes=25))
    world.clock.move_to(world.end() + timedelta(seconds=GRACE - 60))
    world.drain([missed])
    world.fake.set_outage(True)
    stuck = [world.enqueue("acme", f"b{i}", 10 * i, world.end() - timedelta(minutes=10))
             for i in (2, 3)]
    world.drainer.drain_once()
    world.clock.move_to(world.end() + timedelta(seconds=GRACE + 60))
    world.fake.set_outage(False)
    world.drain(stuck)
    world.refresher.run_once()
    [line] = world.lines("cus_A")
    assert line.quantity_decimal == "5"                 # the fake missed the event of 3
    assert (line.verdict, line.ours, line.late, line.difference) == ("short", 8, 50, "-3")
    assert world.late_ids() == stuck
    with world.engine.connect() as conn:
        [short] = late_lines.short_lines(conn)
        payload = [e.as_dict() for e in late.late_events(conn)]
    assert (short.invoice_id, short.units) == (line.invoice_id, 3)
    assert short.as_dict()["why"] == "short_line" and short.as_dict()["id"] is None
    assert {p["why"] for p in payload} == {"after_finalization"}


def test_usage_on_no_invoice_is_found_with_its_reason(world: World) -> None:
    """A trial (its first invoice finalized at once at $0), a paused subscription, one
    cancelled without a final invoice, and a customer with no subscription."""
    for tenant, customer in (("trial", "cus_T"), ("paused", "cus_P"), ("ended", "cus_E"),
                             ("bare", "cus_N"), ("final", "cus_F")):
        world.tenant(tenant, customer)
    world.subscribe("cus_T", trial_seconds=PERIOD)
    paused = world.subscribe("cus_P")
    ended = world.subscribe("cus_E")
    final = world.subscribe("cus_F")
    at = world.end() - timedelta(minutes=40)
    world.refresher.run_once()
    ids = {t: world.enqueue(t, f"u-{t}", 4, at) for t in
           ("trial", "ended", "bare", "final")}
    world.drain(list(ids.values()))
    world.fake.pause_subscription(paused)
    world.clock.move_to(world.clock() + timedelta(minutes=1))
    ids["paused"] = world.enqueue("paused", "u-paused", 4, world.clock() - timedelta(seconds=5))
    world.drain([ids["paused"]])
    world.fake.cancel_subscription(ended)
    world.fake.cancel_subscription(final, invoice_now=True)
    world.clock.move_to(world.clock() + timedelta(minutes=1))
    world.refresher.run_once()
    assert world.unbilled() == {ids["trial"]: "trial", ids["paused"]: "paused",
                                ids["ended"]: "ended", ids["bare"]: "no_item"}
    [trial_line] = world.lines("cus_T")
    assert trial_line.verdict == "free"
    [final_line] = world.lines("cus_F")
    assert (final_line.verdict, final_line.ours) == ("matches", 4)
    assert world.late_ids() == []


def test_void_and_uncollectible_invoices_are_not_billed(world: World) -> None:
    world.tenant("acme", "cus_A")
    world.tenant("beta", "cus_B")
    world.subscribe("cus_A")
    world.subscribe("cus_B")
    ids = [world.enqueue(t, f"v-{t}", 6, world.end() - timedelta(minutes=30))
           for t in ("acme", "beta")]
    world.drain(ids)
    world.clock.move_to(world.end() + timedelta(seconds=GRACE + 60))
    world.refresher.run_once()
    [a] = world.lines("cus_A")
    [b] = world.lines("cus_B")
    assert (a.verdict, b.verdict) == ("matches", "matches")
    world.fake.void_invoice(a.invoice_id)
    world.fake.mark_uncollectible(b.invoice_id)
    world.refresher.run_once()                           # the scheduled pass reads them again
    [a] = world.lines("cus_A")
    [b] = world.lines("cus_B")
    assert (a.verdict, b.verdict) == ("void", "uncollectible")
    assert (a.ours, b.ours) == (6, 6)                    # the figures stay


def test_two_items_on_one_meter_bill_the_same_events_twice(world: World) -> None:
    world.tenant("acme", "cus_A")
    world.subscribe("cus_A")
    world.subscribe("cus_A")
    event = world.enqueue("acme", "d0", 9, world.end() - timedelta(minutes=30))
    world.drain([event])
    world.refresher.run_once()
    from webapp.read.periods import overlaps

    with world.engine.connect() as conn:
        [found] = overlaps(conn)
    assert (found.stripe_customer_id, found.meter, len(found.subscription_items)) == (
        "cus_A", METER, 2)
    world.clock.move_to(world.end() + timedelta(seconds=GRACE + 60))
    world.refresher.run_once()
    lines = world.lines("cus_A")
    assert [(ln.verdict, ln.ours) for ln in lines] == [("matches", 9), ("matches", 9)]


def _poll(world: World) -> None:
    from webapp.worker import EventPoller, gateway_from

    gateway = gateway_from(world.settings)
    assert gateway is not None
    try:
        EventPoller(world.engine, gateway, clock=world.clock,
                    on_invoice_events=world.refresher.on_invoice_events).run_once()
    finally:
        gateway.close()


def _subscription(world: World, sub_id: str) -> Any:
    from sqlalchemy import select

    from webapp.models import StripeSubscription

    s = StripeSubscription.__table__
    with world.engine.connect() as conn:
        return conn.execute(select(s).where(s.c.id == sub_id)).first()


def test_invoice_and_subscription_events_read_what_changed(world: World) -> None:
    """Polled: a pause reads that subscription (since when it is paused, before any listing),
    a void reads that invoice, a deleted draft is kept as deleted — one call each, no list."""
    world.tenant("acme", "cus_A")
    world.tenant("beta", "cus_B")
    paused = world.subscribe("cus_A")
    world.subscribe("cus_B")
    world.drain([world.enqueue("beta", "e0", 6, world.end() - timedelta(minutes=30))])
    world.clock.move_to(world.end() + timedelta(seconds=GRACE + 60))
    world.refresher.run_once()
    [b] = world.lines("cus_B")
    assert b.verdict == "matches"
    lists = world.fake.state()["invoice_list_calls"]
    world.fake.pause_subscription(paused)
    world.fake.void_invoice(b.invoice_id)
    world.clock.move_to(world.clock() + timedelta(minutes=1))
    _poll(world)
    assert world.fake.state()["invoice_list_calls"] == lists     # read one by one
    assert _subscription(world, paused).status == "paused"
    assert _subscription(world, paused).paused_at is not None
    [b] = world.lines("cus_B")
    assert b.verdict == "void"
    # A draft deleted in Stripe's dashboard: kept as deleted.
    world.clock.move_to(world.end(2) + timedelta(minutes=1))
    world.refresher.run_once()
    drafts = [i for i in world.fake.invoices("cus_B") if i["status"] == "draft"]
    [draft] = drafts
    world.fake.delete_draft(draft["id"])
    world.clock.move_to(world.clock() + timedelta(minutes=1))
    _poll(world)
    from sqlalchemy import select

    from webapp.models import StripeInvoice

    with world.engine.connect() as conn:
        status = conn.execute(select(StripeInvoice.__table__.c.status).where(
            StripeInvoice.__table__.c.id == draft["id"])).scalar()
    assert status == "deleted"


def test_a_pushed_subscription_event_reads_that_subscription(world: World, engine: Engine,
                                                             db_url: str) -> None:
    from webapp import create_app

    secret = "whsec_invoice_truth"
    settings = make_settings(db_url, stripe_api_base=world.fake.base_url,
                             stripe_meter_events_base=world.fake.meter_events_url,
                             stripe_webhook_secret=secret)
    client = create_app({"TESTING": True}, settings=settings, engine=engine,
                        start_drainer=False).test_client()
    world.tenant("acme", "cus_A")
    sub = world.subscribe("cus_A")
    world.fake.pause_subscription(sub)
    [event] = [e for e in world.fake.events() if e["type"] == "v1.customer.subscription.paused"]
    body, signature = world.fake.signed_push(str(event["id"]), secret, timestamp=int(time.time()))
    got = client.post("/stripe/webhook", data=body, headers={
        "Stripe-Signature": signature, "Content-Type": "application/json"})
    assert got.status_code == 200 and got.get_json()["status"] == "stored"
    assert _subscription(world, sub).status == "paused"

