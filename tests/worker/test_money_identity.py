"""Issue 44's done-when: one scenario with every case Stripe documents where the time of a send
says nothing about the invoice, through the real SDK against the fake, on SQLite and
PostgreSQL, ending with the money identity: every unit enqueued is on exactly one finalized
line, in usage on no invoice with its reason, refused by Stripe, written off, or in an open
period — and not one event listed late that Stripe billed.

Customers (one tenant each, one metered item each unless said):

- ``cus_A``: an answer lost during the grace period and retried after the finalization (the
  invoice holds it); two events Stripe turned away (503) until after it (late: one billed
  next, one written off); usage of the next periods.
- ``cus_B``: an event accepted a minute before the finalization that Stripe's aggregation
  missed (the line is short: written off as one amount).
- ``cus_T`` a trial (its $0 first invoice is free); ``cus_P`` paused; ``cus_E`` cancelled
  without a final invoice; ``cus_N`` no subscription; ``cus_D`` no subscription, deleted in
  Stripe part-way (what went after is refused).
- ``cus_V`` its invoice voided; ``cus_U`` marked uncollectible (billed, unpaid).
- ``cus_W`` two subscriptions on one meter: Stripe bills each event twice, and it is said.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from conftest import make_settings
from sqlalchemy import Engine, select
from support.billing_world import GRACE, METER, PERIOD, Clock, T, World
from support.fake_stripe import FakeStripe

from webapp.outbox import late, late_lines
from webapp.outbox.unbilled import unbilled_events
from webapp.read.periods import overlaps
from webapp.worker import MeterRefresher, event_poller, gateway_from

CUSTOMERS = {"acme": "cus_A", "beta": "cus_B", "trial": "cus_T", "paused": "cus_P",
             "ended": "cus_E", "bare": "cus_N", "gone": "cus_D", "void": "cus_V",
             "unpaid": "cus_U", "twice": "cus_W"}


@pytest.fixture
def world(engine: Engine, db_url: str) -> Iterator[World]:
    clock = Clock()
    fake = FakeStripe(separate_streams=True, clock=clock.seconds).start()
    try:
        for customer in CUSTOMERS.values():
            fake.create_customer(customer, name=customer)
        # A retry waits ten minutes on the test's clock: an event whose answer was lost goes
        # out again only once the test moved the clock past its invoice's finalization.
        settings = make_settings(db_url, stripe_api_base=fake.base_url,
                                 stripe_meter_events_base=fake.meter_events_url,
                                 initial_backoff_seconds=600.0, max_backoff_seconds=900.0)
        made = World(engine, fake, settings, clock)
        try:
            yield made
        finally:
            made.drainer.close()
    finally:
        fake.stop()


def _drain_all(world: World) -> None:
    while world.drainer.drain_once().claimed:
        pass


def _poll_reports(world: World) -> None:
    gateway = gateway_from(world.settings)
    assert gateway is not None
    try:
        event_poller(world.engine, gateway, world.settings, clock=world.clock,
                     on_meter_codes=MeterRefresher(world.engine, gateway).run_once).run_once()
    finally:
        gateway.close()


def _line_units(world: World, invoice: dict[str, Any]) -> int:
    return world.fake.line_units(str(invoice["id"])).get(METER, 0)


def test_every_unit_lands_in_exactly_one_place(world: World) -> None:  # noqa: PLR0915
    fake, clock = world.fake, world.clock
    for tenant, customer in CUSTOMERS.items():
        world.tenant(tenant, customer)
    subs = {c: world.subscribe(c) for c in ("cus_A", "cus_B", "cus_P", "cus_E", "cus_V",
                                            "cus_U", "cus_W")}
    world.subscribe("cus_T", trial_seconds=PERIOD)
    world.subscribe("cus_W")                             # the second item on the meter
    world.refresher.run_once()
    early = world.end() - timedelta(minutes=40)
    ids: dict[str, int] = {}

    def enqueue(name: str, tenant: str, quantity: int, at: Any) -> int:
        ids[name] = world.enqueue(tenant, name, quantity, at)
        return ids[name]

    for name, tenant, quantity in (("a0", "acme", 5), ("b0", "beta", 5), ("t0", "trial", 4),
                                   ("e0", "ended", 6), ("n0", "bare", 2), ("g0", "gone", 3),
                                   ("v0", "void", 8), ("u0", "unpaid", 2), ("w0", "twice", 9)):
        enqueue(name, tenant, quantity, early)
    _drain_all(world)
    fake.pause_subscription(subs["cus_P"])
    clock.move_to(clock() + timedelta(minutes=1))
    enqueue("p0", "paused", 4, clock() - timedelta(seconds=5))
    fake.delete_customer("cus_D")
    clock.move_to(clock() + timedelta(minutes=1))
    enqueue("g1", "gone", 7, clock() - timedelta(seconds=5))
    _drain_all(world)
    fake.cancel_subscription(subs["cus_E"])               # no invoice_now: no final invoice

    # During the grace period: Stripe takes a1 and the answer is lost; Stripe turns a3 and
    # a4 away (503); b1 is accepted a minute before the finalization, and Stripe's totals lag.
    clock.move_to(world.end() + timedelta(seconds=GRACE - 300))
    enqueue("a1", "acme", 7, world.end() - timedelta(minutes=20))
    fake.fail_next("drop")
    _drain_all(world)
    for name, quantity in (("a3", 10), ("a4", 20)):
        fake.fail_next("503")                             # Stripe unavailable for it
        enqueue(name, "acme", quantity, world.end() - timedelta(minutes=15))
        _drain_all(world)
    clock.move_to(world.end() + timedelta(seconds=GRACE - 60))
    fake.set_aggregation_lag(120)
    enqueue("b1", "beta", 3, world.end() - timedelta(minutes=10))
    _drain_all(world)
    assert {n: world.rows([ids[n]])[ids[n]].status for n in ("a1", "a3", "a4")} == {
        "a1": "retrying", "a3": "retrying", "a4": "retrying"}

    # After the finalization: the retries go out, answered 200.
    clock.move_to(world.end() + timedelta(seconds=GRACE + 660))
    _drain_all(world)
    assert {r.status for r in world.rows(list(ids.values())).values()} == {"sent"}
    fake.flush_reports()
    _poll_reports(world)                                  # g1 refused: sent after deletion
    assert world.rows([ids["g1"], ids["g0"]])[ids["g1"]].status == "rejected"
    invoices = {c: [i for i in fake.invoices(c) if i["status"] != "draft"]
                for c in CUSTOMERS.values()}
    fake.void_invoice(invoices["cus_V"][0]["id"])
    fake.mark_uncollectible(invoices["cus_U"][0]["id"])
    world.refresher.run_once()

    # The verdicts, and the late usage: not one event Stripe billed.
    verdicts = {ln.stripe_customer_id: ln.verdict for c in CUSTOMERS.values()
                for ln in world.lines(c)}
    assert verdicts == {"cus_A": "late", "cus_B": "short", "cus_T": "free", "cus_V": "void",
                        "cus_U": "uncollectible", "cus_W": "matches"}
    a1 = world.rows([ids["a1"]])[ids["a1"]]
    [a_line] = world.lines("cus_A")
    assert a1.sent_at.replace(tzinfo=None) > a_line.finalized_at.replace(tzinfo=None)
    assert world.late_ids() == [ids["a3"], ids["a4"]]     # a1 is on its invoice
    assert (a_line.quantity_decimal, a_line.ours, a_line.late) == ("12", 12, 30)
    with world.engine.connect() as conn:
        [short] = late_lines.short_lines(conn)
        [doubled] = overlaps(conn)
    assert (short.stripe_customer_id, short.units) == ("cus_B", 3)
    assert doubled.stripe_customer_id == "cus_W" and len(doubled.subscription_items) == 2
    assert world.unbilled() == {ids["t0"]: "trial", ids["p0"]: "paused", ids["e0"]: "ended",
                                ids["n0"]: "no_item", ids["g0"]: "no_item"}

    # A person handles the late usage: a3 billed next, a4 and the short line written off.
    now = clock()
    billed = late.bill_next(world.engine, [ids["a3"]], actor="finance", note="outage",
                            now=now)
    late.write_off(world.engine, [ids["a4"]], actor="finance", reason="written_off",
                   note="agreed", now=now)
    late_lines.write_off_line(world.engine, short.invoice_id, short.subscription_item_id,
                        actor="finance", reason="written_off", note="Stripe's lag", now=now)
    copy = billed.new_events[ids["a3"]]
    enqueue("a5", "acme", 4, clock())
    _drain_all(world)
    clock.move_to(world.end(2) + timedelta(seconds=GRACE + 60))
    enqueue("a6", "acme", 1, clock())                     # the open period at the end
    _drain_all(world)
    world.refresher.run_once()
    assert world.late_ids() == []
    with world.engine.connect() as conn:
        assert late_lines.short_lines(conn) == []

    # The money identity, from Stripe's side: what its finalized invoices hold.
    final = [i for c in CUSTOMERS.values() for i in world.fake.invoices(c)
             if i["status"] != "draft"]
    on_lines = sum(_line_units(world, i) for i in final if i["status"] != "void")
    voided = sum(_line_units(world, i) for i in final if i["status"] == "void")
    twice = sum(_line_units(world, i) for i in world.fake.invoices("cus_W")
                if i["status"] != "draft")
    assert twice == 2 * 9                                  # Stripe billed w0 on each line
    on_lines -= twice // 2
    with world.engine.connect() as conn:
        units = {r.id: r.quantity for r in conn.execute(select(T.c.id, T.c.quantity))}
        on_no_invoice = sum(e.quantity for e in unbilled_events(conn))
    originals = [i for i in units if i != copy]
    refused = units[ids["g1"]]
    written_off = units[ids["a4"]] + 3
    open_period = units[ids["a6"]]
    assert sum(units[i] for i in originals) == (on_lines + voided + on_no_invoice + refused
                                                + written_off + open_period)
    # The copy billed next stands on the next invoice for a3, once.
    [_, second] = sorted((i for i in world.fake.invoices("cus_A") if i["status"] != "draft"),
                         key=lambda i: i["created"])
    assert _line_units(world, second) == units[copy] + units[ids["a5"]]

