"""The two billing figures every page may show, worked out by the maintenance services and
kept in ``billing_watch`` so that a page view reads one row each:

- ``invoice_risk``: usage not yet accepted by Stripe (waiting, dead or rejected) in the
  periods of draft invoices that finalize within ``INVOICE_RISK_SECONDS`` — customers,
  events, units and when the soonest of those drafts finalizes. Worked out with the
  invoice-first mark, every few seconds.
- ``late``: late usage not handled yet (:mod:`.late`) — worked out after each read of
  Stripe's invoices and after each late-usage action.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, Engine, and_, distinct, func, select, union_all

from .invoices import draft_windows
from .late import find_late, late_events, unsent_parts
from .sql import BILLING_WATCH, TENANTS, T, as_utc, insert_for, int_sum

INVOICE_RISK, LATE = "invoice_risk", "late"


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


def keep_late(engine: Engine, *, now: datetime) -> Watch:
    """Record the late sent events found since the last scan (:func:`.late.find_late`), then
    work out ``late`` and keep it."""
    find_late(engine, now=now)
    with engine.begin() as conn:
        found = late_events(conn)
        watch = Watch(LATE, now, len({e.stripe_customer_id for e in found}), len(found),
                      sum(e.quantity for e in found))
        _keep(conn, watch)
    return watch


def watched(conn: Connection) -> dict[str, Watch]:
    """The figures as last kept, by name."""
    return {str(r.name): Watch(str(r.name), as_utc(r.computed_at) or r.computed_at,
                               int(r.customers), int(r.events), int(r.units),
                               as_utc(r.soonest_at))
            for r in conn.execute(select(BILLING_WATCH))}
