"""Whose usage went to a Stripe customer: one answer for the events list's customer filter,
search, and every link that names a customer. A tenant's events go to the customer fixed on
each at its first attempt, so a tenant remapped since still sent its earlier usage to the old
customer: it is found by what its events went to, not by its mapping alone."""

from __future__ import annotations

from sqlalchemy import ColumnElement, Connection, select, union

from ..outbox.rollups import SENT_USAGE, live_sent, read_mark
from ..outbox.sql import IDLE_UNSENT, IN_FLIGHT_WHERE, SENT_YEARLY, TENANTS, T


def tenants_billed_to(conn: Connection, customer: str) -> list[str]:
    """The tenants whose events went, or will go, to ``customer``: mapped to it now, with
    sent usage folded under it (``ix_usage_sent_yearly_customer``), or with events under it
    that the rollups do not hold (unsent: ``ix_outbox_unsent``, which carries the customer;
    in flight; sent past the rollup's mark). Sorted."""
    mark = read_mark(conn, SENT_USAGE)
    mine = T.c.stripe_customer_id == customer
    found = union(
        select(TENANTS.c.tenant_id).where(TENANTS.c.stripe_customer_id == customer),
        select(SENT_YEARLY.c.tenant_id).where(SENT_YEARLY.c.stripe_customer_id == customer),
        select(T.c.tenant_id).where(IDLE_UNSENT, mine),
        select(T.c.tenant_id).where(IN_FLIGHT_WHERE, mine),
        select(T.c.tenant_id).where(live_sent(mark), mine),
    ).subquery()
    return sorted(str(t) for t in conn.execute(select(found.c.tenant_id)).scalars())


def billed_to(customer: str, mapped_now: ColumnElement[bool]) -> ColumnElement[bool]:
    """An event went to ``customer`` (fixed on it), or will (not attempted yet, its tenant
    mapped to it now: ``mapped_now``, the tenants mapped to it)."""
    return (T.c.stripe_customer_id == customer) | (
        T.c.stripe_customer_id.is_(None) & mapped_now)
