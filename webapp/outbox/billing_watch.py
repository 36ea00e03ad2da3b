"""The two billing figures every page may show, worked out by the maintenance services and
kept in ``billing_watch`` so that a page view reads one row each:

- ``invoice_risk``: usage not yet accepted by Stripe (waiting, dead or rejected) in the
  periods of draft invoices that finalize within ``INVOICE_RISK_SECONDS`` — customers,
  events, units and when the soonest of those drafts finalizes. Worked out with the
  invoice-first mark, every few seconds.
- ``overlaps``: customers with two billing metered items on one meter (``customers``;
  Stripe bills the same events on each), worked out after each read of the subscriptions.
- ``unbilled``: usage Stripe took that no invoice will carry (:mod:`.unbilled`), worked
  out after each read of Stripe's subscriptions and invoices.
- ``late``: late usage not handled yet (:mod:`.late`): late events, and the units short
  lines lack — worked out after each read of Stripe's invoices and after each late-usage
  action.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, Engine, and_, distinct, func, select, union_all

from ..status import SENT
from .invoices import draft_windows
from .late import BILLING_STATUSES, find_late, late_events, unsent_parts
from .late_lines import short_lines
from .sql import (
    BILLING_WATCH,
    SUBSCRIPTION_ITEMS,
    TENANTS,
    T,
    as_utc,
    insert_for,
    int_sum,
    status_is,
)
from .sql import UNBILLED as UNBILLED_TABLE
from .unbilled import find_unbilled

INVOICE_RISK, LATE, UNBILLED, OVERLAPS = "invoice_risk", "late", "unbilled", "overlaps"


@dataclass(frozen=True)
class Watch:
    """One figure as last worked out."""

    name: str
    computed_at: datetime
    customers: int
    events: int
    units: int
    soonest_at: datetime | None = None


def _keep(conn: Connection, watch: Watch) -> None:
    values = dict(computed_at=watch.computed_at, customers=watch.customers,
                  events=watch.events, units=watch.units, soonest_at=watch.soonest_at)
    ins = insert_for(conn, BILLING_WATCH).values(name=watch.name, **values)
    conn.execute(ins.on_conflict_do_update(index_elements=[BILLING_WATCH.c.name],
                                           set_=values))


def invoice_risk(conn: Connection, *, now: datetime, within: timedelta) -> Watch:
    """Usage not at Stripe in the periods of drafts finalizing within ``within``."""
    w = draft_windows()
    customer = func.coalesce(T.c.stripe_customer_id, TENANTS.c.stripe_customer_id)
    # The unsent events by their two indexes (idle, in flight), then counted together.
    parts = [select(w.c.customer, T.c.quantity, w.c.finalizes_at)
             .select_from(T)
             .outerjoin(TENANTS, TENANTS.c.tenant_id == T.c.tenant_id)
             .join(w, and_(w.c.customer == customer, w.c.meter == T.c.meter,
                           w.c.start <= T.c.occurred_at, T.c.occurred_at < w.c.end))
             .where(*where, w.c.finalizes_at <= now + within) for where in unsent_parts()]
    u = union_all(*parts).subquery("u")
    row = conn.execute(select(func.count(distinct(u.c.customer)), func.count(),
                              int_sum(u.c.quantity), func.min(u.c.finalizes_at))).one()
    return Watch(INVOICE_RISK, now, int(row[0] or 0), int(row[1] or 0), int(row[2] or 0),
                 as_utc(row[3]))


def keep_invoice_risk(engine: Engine, *, now: datetime, within: timedelta) -> Watch:
    """Work out ``invoice_risk`` and keep it."""
    with engine.begin() as conn:
        watch = invoice_risk(conn, now=now, within=within)
        _keep(conn, watch)
    return watch


def keep_late(engine: Engine, *, now: datetime, revisit: bool = False) -> Watch:
    """Judge what changed since the last look (:func:`.late.find_late`; ``revisit``: the lines
    still open to question too), then work out ``late`` and keep it."""
    find_late(engine, now=now, revisit=revisit)
    with engine.begin() as conn:
        found = late_events(conn)
        short = short_lines(conn)
        customers = {e.stripe_customer_id for e in found} | {s.stripe_customer_id for s in short}
        watch = Watch(LATE, now, len(customers), len(found),
                      sum(e.quantity for e in found) + int(sum(s.units for s in short)))
        _keep(conn, watch)
    return watch


def keep_overlaps(engine: Engine, *, now: datetime) -> Watch:
    """Count the customers with more than one billing metered item on one meter, and keep
    it (``customers``: how many; ``events``: how many customer and meter pairs)."""
    i = SUBSCRIPTION_ITEMS
    pairs = (select(i.c.stripe_customer_id).where(
        i.c.subscription_status.in_(BILLING_STATUSES), i.c.meter.is_not(None))
        .group_by(i.c.stripe_customer_id, i.c.meter).having(func.count() > 1).subquery())
    with engine.begin() as conn:
        row = conn.execute(select(func.count(distinct(pairs.c.stripe_customer_id)),
                                  func.count())).one()
        watch = Watch(OVERLAPS, now, int(row[0] or 0), int(row[1] or 0), 0)
        _keep(conn, watch)
    return watch


def keep_unbilled(engine: Engine, *, now: datetime) -> Watch:
    """Look again for usage on no invoice (:func:`.unbilled.find_unbilled`), then work out
    ``unbilled`` and keep it."""
    find_unbilled(engine, now=now)
    with engine.begin() as conn:
        row = conn.execute(select(func.count(distinct(UNBILLED_TABLE.c.stripe_customer_id)),
                                  func.count(), int_sum(T.c.quantity))
                           .select_from(UNBILLED_TABLE)
                           .join(T, T.c.id == UNBILLED_TABLE.c.event_id)
                           .where(status_is(SENT))).one()
        watch = Watch(UNBILLED, now, int(row[0] or 0), int(row[1] or 0), int(row[2] or 0))
        _keep(conn, watch)
    return watch


def watched(conn: Connection) -> dict[str, Watch]:
    """The figures as last kept, by name."""
    return {str(r.name): Watch(str(r.name), as_utc(r.computed_at) or r.computed_at,
                               int(r.customers), int(r.events), int(r.units),
                               as_utc(r.soonest_at))
            for r in conn.execute(select(BILLING_WATCH))}
