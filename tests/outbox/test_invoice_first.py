"""What a draft invoice still needs is claimed first: the billing periods kept
(``webapp.outbox.invoices``) mark the waiting events of a draft's periods with when it
finalizes, and the claim takes those before any other due event, soonest to finalize first,
on both databases; once the invoice is final the mark goes."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import Engine, select, update

from webapp.outbox import invoices
from webapp.outbox.invoices import InvoiceInfo, LinePeriod, MeteredItem
from webapp.outbox.meters import MeterInfo, store_meters

from .helpers import T0, T, add, at, claim, map_tenant

START = T0 - timedelta(days=30)
END = T0 - timedelta(minutes=30)


def _meters(engine: Engine) -> None:
    store_meters(engine, [MeterInfo("api_requests", "mtr_api", "active"),
                          MeterInfo("tokens", "mtr_tok", "active")], now=T0)


def _item(customer: str, item: str, meter_id: str = "mtr_api") -> MeteredItem:
    return MeteredItem(id=item, subscription_id=f"sub_{customer}", stripe_customer_id=customer,
                       subscription_status="active", meter_id=meter_id, price_id="price_1",
                       period_start=END, period_end=END + timedelta(days=30))


def _draft(customer: str, item: str, *, finalizes_at: datetime, status: str = "draft",
           invoice: str | None = None) -> InvoiceInfo:
    return InvoiceInfo(id=invoice or f"in_{customer}", stripe_customer_id=customer,
                       subscription_id=f"sub_{customer}", status=status, created=END,
                       finalizes_at=finalizes_at if status == "draft" else None,
                       finalized_at=finalizes_at if status != "draft" else None,
                       lines=(LinePeriod(item, START, END, None),))


def _occurred(engine: Engine, ids: list[int], when: datetime) -> None:
    with engine.begin() as conn:
        conn.execute(update(T).where(T.c.id.in_(ids)).values(occurred_at=when))


def _marks(engine: Engine) -> dict[int, datetime | None]:
    with engine.connect() as conn:
        return {r.id: r.invoice_finalizes_at
                for r in conn.execute(select(T.c.id, T.c.invoice_finalizes_at))}


def test_draft_periods_mark_their_waiting_events(engine: Engine) -> None:
    _meters(engine)
    for tenant, customer in (("acme", "cus_A"), ("beta", "cus_B"), ("gamma", "cus_C")):
        map_tenant(engine, tenant, customer)
    in_period = add(engine, 3, tenant="acme", prefix="a")
    after = add(engine, 2, tenant="acme", prefix="a2")      # the next period: not on it
    other_meter = add(engine, 2, tenant="acme", meter="tokens", prefix="at")
    second = add(engine, 2, tenant="beta", prefix="b")
    no_draft = add(engine, 2, tenant="gamma", prefix="c")
    _occurred(engine, in_period + other_meter + second + no_draft, END - timedelta(hours=1))
    _occurred(engine, after, END + timedelta(minutes=5))
    invoices.store_items(engine, [_item("cus_A", "si_A"), _item("cus_B", "si_B"),
                                  _item("cus_C", "si_C")], now=T0)
    soon, later = T0 + timedelta(minutes=20), T0 + timedelta(hours=2)
    invoices.store_invoices(engine, [_draft("cus_A", "si_A", finalizes_at=later),
                                     _draft("cus_B", "si_B", finalizes_at=soon),
                                     _draft("cus_C", "si_C", finalizes_at=soon,
                                            status="open")], now=T0)

    assert invoices.mark_invoice_first(engine) == (5, 0)
    marks = _marks(engine)
    assert {i: marks[i] for i in in_period} == {i: later for i in in_period}
    assert {i: marks[i] for i in second} == {i: soon for i in second}
    assert all(marks[i] is None for i in after + other_meter + no_draft)
    assert invoices.mark_invoice_first(engine) == (0, 0)      # nothing changed: no writes

    # The claim takes the soonest draft's events first, then the other draft's, then the rest.
    first = claim(engine, at(1), limit=2)
    assert sorted(e.id for e in first.events) == sorted(second)
    then = claim(engine, at(1), limit=4, worker="w2")
    ids = [e.id for e in then.events]
    assert set(in_period) < set(ids) and len(ids) == 4

    # Finalized: the mark goes from every event still waiting.
    invoices.store_invoices(engine, [_draft("cus_A", "si_A", finalizes_at=later,
                                            status="open"),
                                     _draft("cus_B", "si_B", finalizes_at=soon,
                                            status="open")], now=T0 + timedelta(seconds=1))
    with engine.begin() as conn:     # give the claimed ones back, marks and all
        conn.execute(update(T).where(T.c.status == "processing")
                     .values(status="pending", claim_token=None))
    marked, unmarked = invoices.mark_invoice_first(engine)
    assert (marked, unmarked) == (0, 5)
    assert all(v is None for v in _marks(engine).values())


def test_the_claim_takes_marked_events_before_older_due_ones(engine: Engine) -> None:
    """Ten events long overdue, then three of a finalizing invoice that became due last:
    a batch of three holds exactly those three, soonest to finalize first."""
    map_tenant(engine, "acme", "cus_A")
    old = add(engine, 10, prefix="old", now=T0 - timedelta(hours=1))
    urgent = add(engine, 3, prefix="urgent", now=T0)
    dues = [T0 + timedelta(minutes=30), T0 + timedelta(minutes=10), T0 + timedelta(minutes=20)]
    with engine.begin() as conn:
        for event_id, due in zip(urgent, dues, strict=True):
            conn.execute(update(T).where(T.c.id == event_id)
                         .values(invoice_finalizes_at=due))
    c = claim(engine, at(1), limit=3)
    assert sorted(e.id for e in c.events) == sorted(urgent)
    c2 = claim(engine, at(1), limit=4, worker="w2")
    assert [e.id for e in c2.events] == old[:4]
    assert not set(e.id for e in c2.events) & set(urgent)


def test_a_partly_full_first_part_is_topped_up_without_doubles(engine: Engine) -> None:
    map_tenant(engine, "acme", "cus_A")
    old = add(engine, 5, prefix="old", now=T0 - timedelta(hours=1))
    urgent = add(engine, 2, prefix="urgent", now=T0)
    with engine.begin() as conn:
        conn.execute(update(T).where(T.c.id.in_(urgent))
                     .values(invoice_finalizes_at=T0 + timedelta(minutes=5)))
    c = claim(engine, at(1), limit=5)
    ids = [e.id for e in c.events]
    assert len(ids) == len(set(ids)) == 5
    assert set(ids) == set(urgent) | set(old[:3])
