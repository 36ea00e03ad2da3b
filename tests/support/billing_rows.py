"""A customer's finalized billing period, written straight into the tables the billing
refresher keeps, with events around it: two sent in time, two sent after the invoice was
final, one still unsent, one of the next period. For tests of late usage that need no Stripe."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import Engine, update
from sqlalchemy.orm import Session

from webapp.models import OutboxEvent, utcnow
from webapp.outbox import enqueue_usage, invoices, late
from webapp.outbox.invoices import InvoiceInfo, LinePeriod, MeteredItem
from webapp.outbox.meters import MeterInfo, store_meters
from webapp.outbox.operations import set_tenant

T = OutboxEvent.__table__


def finalized_period(engine: Engine, *, now: datetime | None = None,
                     period_open: bool = True) -> dict[str, list[int]]:
    """acme (``cus_A``, meter ``api_requests``): a period that ended 3 hours before ``now``,
    its invoice ``in_A`` final an hour after; the event ids by kind: ``on_time``,
    ``sent_late``, ``unsent``, ``next``. ``period_open``: the subscription still bills."""
    now = now or utcnow().replace(microsecond=0)
    end = now - timedelta(hours=3)
    finalized = end + timedelta(hours=1)
    store_meters(engine, [MeterInfo("api_requests", "mtr_api", "active")], now=now)
    set_tenant(engine, "acme", stripe_customer_id="cus_A", name=None, now=now)
    invoices.store_items(engine, [MeteredItem(
        "si_A", "sub_A", "cus_A", "active" if period_open else "canceled", "mtr_api",
        "price_1", end, end + timedelta(days=30))], now=now)
    invoices.store_invoices(engine, [InvoiceInfo(
        "in_A", "cus_A", "sub_A", "open", end, None, finalized,
        (LinePeriod("si_A", end - timedelta(days=30), end, 10),))], now=now)
    ids: dict[str, list[int]] = {}
    with Session(engine) as db, db.begin():
        for kind, n in (("on_time", 2), ("sent_late", 2), ("unsent", 1), ("next", 1)):
            ids[kind] = [enqueue_usage(db, tenant_id="acme", quantity=i + 1,
                                       idempotency_key=f"{kind}{i}", now=now).id
                         for i in range(n)]
    with engine.begin() as conn:
        conn.execute(update(T).where(T.c.id.in_(ids["on_time"] + ids["sent_late"]
                                                + ids["unsent"]))
                     .values(occurred_at=end - timedelta(hours=2)))
        for kind, sent_at in (("on_time", end + timedelta(minutes=30)),
                              ("sent_late", finalized + timedelta(minutes=5)),
                              ("next", now)):
            conn.execute(update(T).where(T.c.id.in_(ids[kind])).values(
                status="sent", sent_at=sent_at, stripe_customer_id="cus_A"))
    late.find_late(engine, now=now)     # as after a read of Stripe's invoices
    return ids


def closing_draft(engine: Engine, finalizes_in: timedelta, *,
                  now: datetime | None = None) -> list[int]:
    """beta (``cus_B``): the draft ``in_B`` of the period that ended ten minutes before
    ``now``, finalizing in ``finalizes_in``, with three events of that period not at Stripe
    (10, 20 and 30 units; the first dead, the others waiting); the marks and the figures the
    status line shows brought up to date. The event ids."""
    from webapp.outbox import billing_watch

    now = now or utcnow()
    end = now - timedelta(minutes=10)
    store_meters(engine, [MeterInfo("api_requests", "mtr_api", "active")], now=now)
    set_tenant(engine, "beta", stripe_customer_id="cus_B", name=None, now=now)
    invoices.store_items(engine, [MeteredItem("si_B", "sub_B", "cus_B", "active", "mtr_api",
                                              "price_1", end, end + timedelta(days=30))],
                         now=now, complete=False)
    invoices.store_invoices(engine, [InvoiceInfo(
        "in_B", "cus_B", "sub_B", "draft", end, now + finalizes_in, None,
        (LinePeriod("si_B", end - timedelta(days=30), end, None),))], now=now)
    with Session(engine) as db, db.begin():
        ids = [enqueue_usage(db, tenant_id="beta", quantity=10 * (i + 1),
                             idempotency_key=f"beta{i}", occurred_at=end - timedelta(hours=1),
                             now=now).id for i in range(3)]
    with engine.begin() as conn:
        conn.execute(update(T).where(T.c.id == ids[0]).values(status="dead", dead_at=now))
    invoices.mark_invoice_first(engine)
    billing_watch.keep_invoice_risk(engine, now=now, within=timedelta(hours=1))
    billing_watch.keep_late(engine, now=now)
    return ids
