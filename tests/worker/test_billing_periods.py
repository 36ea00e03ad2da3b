"""Issue 30, the money of billing periods, against the fake Stripe through the real SDK, on
SQLite and PostgreSQL: the fake drafts an invoice at the end of each period and finalizes it
after the grace period, freezing the metered line at the units it had accepted by then.

One clock drives the fake and our services (real time plus an offset the test moves by
minutes and hours), so a grace period passes without waiting for it. What is billed is read
back from the fake's invoices; what the outbox decided, from the tables.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from conftest import make_settings, wait_for
from sqlalchemy import Engine, func, select, text
from sqlalchemy.orm import Session
from support.fake_stripe import FakeStripe

from webapp.config import Settings
from webapp.models import OutboxEvent, StripeInvoice, utcnow
from webapp.models.outbox import INVOICE_FIRST_SQL
from webapp.outbox import enqueue_usage, late, operations
from webapp.read.periods import periods_summary
from webapp.worker import Drainer, gateway_from
from webapp.worker.invoices import BillingRefresher, billing_refresher, receive_invoice
from webapp.worker.reconciler import reconcile
from webapp.worker.stripe_events import EventPoller

T = OutboxEvent.__table__
INV = StripeInvoice.__table__
METER = "api_requests"
CUSTOMER = "cus_acme"
PERIOD = 3600
GRACE = 1800


class Clock:
    """Real time plus an offset the test moves forward; shared by the fake and our side."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> datetime:
        return utcnow() + timedelta(seconds=self.offset)

    def seconds(self) -> float:
        return time.time() + self.offset

    def move_to(self, at: datetime) -> None:
        """Move the clock so that it reads ``at`` now (forward only)."""
        self.offset += max(0.0, (at - self()).total_seconds())


class World:
    """The fake, a drainer and the billing refresher on one clock, and the period the
    customer's subscription is in: it started 50 minutes ago and ends in 10."""

    def __init__(self, engine: Engine, fake: FakeStripe, settings: Settings,
                 clock: Clock) -> None:
        self.engine, self.fake, self.clock, self.settings = engine, fake, clock, settings
        self.gateway = gateway_from(settings)
        self.drainer = Drainer(engine, settings, gateway_from(settings), clock=clock)
        if self.drainer.meters is not None:
            self.drainer.meters.active()
        self.refresher: BillingRefresher = billing_refresher(engine, self.gateway, settings,
                                                             clock=clock)
        start = int(clock.seconds()) - 3000
        self.period_start = datetime.fromtimestamp(start, UTC)
        self.subscription = fake.create_subscription(CUSTOMER, [METER], period_start=start,
                                                     period_seconds=PERIOD,
                                                     grace_seconds=GRACE)

    def end(self, n: int = 1) -> datetime:
        """The end of the ``n``-th period (1: the current one)."""
        return self.period_start + timedelta(seconds=PERIOD * n)

    def enqueue(self, key: str, quantity: int, occurred_at: datetime) -> int:
        with Session(self.engine) as db, db.begin():
            return int(enqueue_usage(db, tenant_id="acme", quantity=quantity,
                                     idempotency_key=key, meter=METER,
                                     occurred_at=occurred_at, now=self.clock()).id)

    def status(self, ids: list[int]) -> dict[int, str]:
        with self.engine.connect() as conn:
            return {r.id: r.status for r in conn.execute(
                select(T.c.id, T.c.status).where(T.c.id.in_(ids)))}

    def drain(self, ids: list[int], timeout: float = 30.0) -> None:
        def sent() -> bool:
            self.drainer.drain_once()
            return set(self.status(ids).values()) == {"sent"}

        wait_for(sent, timeout, interval=0.02, message=f"events {ids} to be sent")

    def invoices(self) -> list[dict[str, Any]]:
        """The fake's invoices of the customer, oldest first."""
        return sorted(self.fake.invoices(CUSTOMER), key=lambda i: i["created"])

    def billed(self, invoice: dict[str, Any]) -> int:
        return self.fake.line_units(str(invoice["id"])).get(METER, 0)

    def stored_status(self, invoice_id: str) -> str | None:
        with self.engine.connect() as conn:
            return conn.execute(select(INV.c.status).where(INV.c.id == invoice_id)).scalar()

    def accepted_count(self) -> int:
        return len(self.fake.accepted())


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def world(engine: Engine, db_url: str, clock: Clock) -> Iterator[World]:
    fake = FakeStripe(separate_streams=True, clock=clock.seconds).start()
    try:
        settings = make_settings(db_url, stripe_api_base=fake.base_url,
                                 stripe_meter_events_base=fake.meter_events_url)
        operations.set_tenant(engine, "acme", stripe_customer_id=CUSTOMER, name=None,
                              now=clock())
        made = World(engine, fake, settings, clock)
        try:
            yield made
        finally:
            made.drainer.close()
    finally:
        fake.stop()


def test_a_backlog_sent_during_the_grace_period_lands_on_its_invoice(world: World) -> None:
    during = world.end() - timedelta(minutes=5)
    ids = [world.enqueue(f"grace{i}", q, during) for i, q in enumerate((5, 7, 11))]
    world.refresher.run_once()
    world.clock.move_to(world.end() + timedelta(minutes=1))    # the period ended: a draft
    summary = world.refresher.run_once()
    assert (summary.items, summary.drafts, summary.marked) == (1, 1, 3)
    [draft] = world.invoices()
    assert draft["status"] == "draft" and world.stored_status(draft["id"]) == "draft"
    with world.engine.connect() as conn:
        marks = conn.execute(select(T.c.invoice_finalizes_at).where(T.c.id.in_(ids))).all()
    assert all(m[0] is not None for m in marks)
    with world.engine.connect() as conn:
        closing, *ending = periods_summary(conn, now=world.clock()).closing
    # The next period, an hour long, ends within the hour too: listed after, nothing unsent.
    assert [(p.invoice_id, p.unsent_events) for p in ending] == [(None, 0)]
    assert (closing.invoice_id, closing.unsent_events, closing.unsent_units) == (
        draft["id"], 3, 23)
    assert closing.waits == {"retry": 3}

    world.drain(ids)                                  # during the grace period
    world.clock.move_to(world.end() + timedelta(seconds=GRACE + 60))
    world.refresher.run_once()
    [invoice] = world.invoices()
    assert invoice["status"] == "open" and world.stored_status(invoice["id"]) == "open"
    assert world.billed(invoice) == 23                # the fake's frozen line: every unit
    with world.engine.connect() as conn:
        assert late.late_events(conn) == []
        # Sent, they are out of the claim's first part (its index holds waiting rows only).
        assert conn.execute(select(func.count()).select_from(T).where(
            text(INVOICE_FIRST_SQL))).scalar() == 0


def test_an_outage_across_the_period_end_is_billed_next_or_written_off_once(
        world: World) -> None:
    before = world.end() - timedelta(minutes=20)
    on_time = [world.enqueue(f"on{i}", q, before) for i, q in enumerate((2, 3))]
    world.drain(on_time)
    world.refresher.run_once()

    world.fake.set_outage(True)                        # Stripe unreachable from here on
    stuck = [world.enqueue(f"stuck{i}", q, before) for i, q in enumerate((10, 20, 40))]
    world.drainer.drain_once()
    world.clock.move_to(world.end() + timedelta(seconds=GRACE + 60))   # finalized meanwhile
    world.fake.set_outage(False)
    world.drain(stuck)                                 # accepted, but on no invoice
    world.refresher.run_once()
    [first] = world.invoices()
    assert first["status"] == "open" and world.billed(first) == 5
    with world.engine.connect() as conn:
        assert [e.id for e in late.late_events(conn)] == stuck

    now = world.clock()
    billed = late.bill_next(world.engine, stuck[:2], actor="ops@example.com",
                            note="outage on the 1st", now=now)
    written = late.write_off(world.engine, stuck[2:], actor="ops@example.com",
                             reason="written_off", note="agreed with the customer", now=now)
    assert sorted(billed.new_events) == stuck[:2] and written.handled == stuck[2:]
    copies = list(billed.new_events.values())
    # A second run of either does nothing.
    assert late.bill_next(world.engine, stuck[:2], actor="ops", note="again",
                          now=now).new_events == {}
    assert late.write_off(world.engine, stuck[2:], actor="ops", reason="written_off",
                          note="again", now=now).handled == []
    world.drain(copies)
    sent_to_stripe = world.accepted_count()
    world.drainer.drain_once()
    assert world.accepted_count() == sent_to_stripe   # nothing sent twice

    # Usage of the period after (still open at the end) and the second invoice's close.
    world.clock.move_to(world.end(2) + timedelta(seconds=GRACE + 60))
    later = [world.enqueue("open0", 4, world.end(2) + timedelta(minutes=5))]
    world.drain(later)
    world.refresher.run_once()
    first, second = world.invoices()
    assert second["status"] == "open" and world.billed(second) == 30    # billed next, once
    with world.engine.connect() as conn:
        assert late.late_events(conn) == []
        units = {r.id: r.quantity for r in conn.execute(select(T.c.id, T.c.quantity))}

    # Every unit enqueued is on exactly one invoice, written off, or in an open period.
    originals = on_time + stuck + later
    invoiced = sum(world.billed(i) for i in world.invoices() if i["status"] != "draft")
    written_off = sum(units[i] for i in stuck[2:])
    open_period = sum(units[i] for i in later)
    assert sum(units[i] for i in originals) == invoiced + written_off + open_period
    assert invoiced == sum(units[i] for i in on_time + copies)

    # Reconciliation stays exact: the originals and their copies each count at Stripe in the
    # hour they are stamped with, as here. Asked two days later: every day they fall on has
    # ended and settled, whatever the time of day the test runs at (a day's bucket ends at
    # the midnight after it, up to a day after the last event).
    run = reconcile(world.engine, world.gateway, world.settings, trigger="cli",
                    now=world.clock() + timedelta(days=2))
    assert run.errors == [] and run.comparison.mismatches == []
    assert run.comparison.checked >= 1 and run.comparison.pending == 0


def test_the_invoice_events_read_the_invoices_again(world: World, engine: Engine) -> None:
    world.refresher.run_once()
    world.clock.move_to(world.end() + timedelta(minutes=1))
    world.fake.tick()
    [draft] = world.invoices()
    assert world.stored_status(draft["id"]) is None
    poller = EventPoller(engine, world.gateway, clock=world.clock,
                         on_invoice_events=world.refresher.on_invoice_events)
    poller.run_once()
    assert world.stored_status(draft["id"]) == "draft"

    # Pushed: the webhook reads the one invoice it names.
    world.fake.finalize_invoice(draft["id"])
    assert receive_invoice(engine, world.gateway, draft["id"], now=world.clock())
    assert world.stored_status(draft["id"]) == "open"
    # Polled, that event is newer than the last list pass: the invoices are listed once more;
    # after that pass, the same events list nothing again.
    calls = world.fake.state()["invoice_list_calls"]
    world.clock.move_to(world.clock() + timedelta(minutes=5))
    poller.run_once()
    assert world.fake.state()["invoice_list_calls"] == calls + 1
    world.clock.move_to(world.clock() + timedelta(minutes=5))
    poller.run_once()
    assert world.fake.state()["invoice_list_calls"] == calls + 1


def test_a_signed_invoice_push_reads_that_invoice(world: World, engine: Engine,
                                                  db_url: str) -> None:
    from webapp import create_app

    secret = "whsec_billing_periods"
    settings = make_settings(db_url, stripe_api_base=world.fake.base_url,
                             stripe_meter_events_base=world.fake.meter_events_url,
                             stripe_webhook_secret=secret)
    client = create_app({"TESTING": True}, settings=settings, engine=engine,
                        start_drainer=False).test_client()
    world.clock.move_to(world.end() + timedelta(minutes=1))
    world.fake.tick()
    [draft] = world.invoices()

    def push(kind: str) -> Any:
        [event] = [e for e in world.fake.events() if e["type"] == kind]
        body, signature = world.fake.signed_push(str(event["id"]), secret,
                                                 timestamp=int(time.time()))
        return client.post("/stripe/webhook", data=body, headers={
            "Stripe-Signature": signature, "Content-Type": "application/json"})

    created = push("v1.invoice.created")
    assert created.status_code == 200 and created.get_json()["status"] == "stored"
    assert world.stored_status(draft["id"]) == "draft"
    world.fake.finalize_invoice(draft["id"])
    finalized = push("v1.invoice.finalized")
    assert finalized.status_code == 200 and world.stored_status(draft["id"]) == "open"
    with engine.connect() as conn:
        finalized_at = conn.execute(select(INV.c.finalized_at).where(
            INV.c.id == draft["id"])).scalar()
    assert finalized_at is not None
    world.fake.set_outage(True)      # Stripe cannot be read: 503, and Stripe pushes again
    assert push("v1.invoice.finalized").status_code == 503
