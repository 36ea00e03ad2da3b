"""The status groups, and the one answer to "can this event be sent now?".

An event can be sent now when all of these hold:

=========  ======================================================  ===========================
waiting    its status is ``pending`` or ``retrying``               :data:`WAITING`
due        ``next_attempt_at`` is now or earlier                   :func:`due`
addressed  it has a customer: fixed on the row at its first        :func:`addressed`
           claim, else its tenant's mapping
metered    when Stripe's meters were listed, its meter is active   the claim's ``meters``
           there (a drainer passes the active event names)
=========  ======================================================  ===========================

Each term is written here twice, side by side: in Python (:func:`sendable_now`, for one
event already read) and in SQL (:data:`WAITING_SQL`, :func:`addressed_sql`, and
:data:`PG_SENDABLE_NOW` for the claim written out). The claim on both databases, the deferrer,
the status line and ``stats`` use these, and ``tests/outbox/test_sendable.py`` holds them to
the same rows on a table of edge cases.

``WAITING_SQL`` is literal text, not a bound expression: it is ``ix_outbox_claimable``'s
predicate, and PostgreSQL (in generic plans) and SQLite (always) match a partial index only
by the terms of its predicate.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, exists, or_, text

from ..status import FINAL, IN_FLIGHT, NEEDS_A_PERSON, ON_ITS_WAY, WAITING, sql_in
from .sql import TENANTS, T

#: ``waiting`` in SQL, as ``ix_outbox_claimable``'s predicate reads.
WAITING_SQL = text(sql_in(WAITING, "stripe_usage_outbox.status"))
#: The event's tenant has a Stripe customer (as a correlated EXISTS).
TENANT_MAPPED = exists().where(TENANTS.c.tenant_id == T.c.tenant_id,
                               TENANTS.c.stripe_customer_id.is_not(None))

#: The whole condition inside the PostgreSQL claim written out (``o``: the outbox row,
#: ``t``: its tenant, LEFT JOINed; ``:now`` bound), the same terms as :func:`sendable_now`
#: but the meters, which the claim adds when it has them.
PG_WAITING = sql_in(WAITING, "o.status")
PG_SENDABLE_NOW = PG_WAITING + """
      AND o.next_attempt_at <= :now
      AND (o.stripe_customer_id IS NOT NULL OR t.stripe_customer_id IS NOT NULL)"""


def addressed(customer: str | None, tenant_customer: str | None) -> bool:
    """Whether an event has a customer to be sent to: its own, or its tenant's."""
    return customer is not None or tenant_customer is not None


def sendable_now(*, status: str, next_attempt_at: datetime | None, customer: str | None,
                 tenant_customer: str | None, meter: str, now: datetime,
                 active_meters: Collection[str] | None = None) -> bool:
    """Whether a claim made at ``now`` may take this event (``active_meters``: the event
    names Stripe has an active meter for; None when the meters were never listed)."""
    return (status in WAITING
            and next_attempt_at is not None and next_attempt_at <= now
            and addressed(customer, tenant_customer)
            and (active_meters is None or meter in active_meters))


def due(now: datetime) -> ColumnElement[bool]:
    """``due`` in SQL."""
    return T.c.next_attempt_at <= now


def addressed_sql(tenant_customer: Any = None) -> ColumnElement[bool]:
    """``addressed`` in SQL; ``tenant_customer``: an expression for the tenant's customer
    when the statement already has one (a join or a scalar subquery), else an EXISTS."""
    if tenant_customer is None:
        return or_(T.c.stripe_customer_id.is_not(None), TENANT_MAPPED)
    return or_(T.c.stripe_customer_id.is_not(None), tenant_customer.is_not(None))


#: Waiting, but with no customer to be sent to: the tenant has no mapping yet.
UNADDRESSED_SQL = and_(T.c.stripe_customer_id.is_(None), ~TENANT_MAPPED)


def sendable_now_sql(now: datetime, tenant_customer: Any = None) -> tuple[Any, ...]:
    """The terms of :func:`sendable_now` but the meters, as WHERE conditions."""
    return (WAITING_SQL, due(now), addressed_sql(tenant_customer))


__all__ = ["FINAL", "IN_FLIGHT", "NEEDS_A_PERSON", "ON_ITS_WAY", "PG_SENDABLE_NOW", "PG_WAITING",
           "TENANT_MAPPED", "UNADDRESSED_SQL", "WAITING", "WAITING_SQL", "addressed",
           "addressed_sql", "due", "sendable_now", "sendable_now_sql"]
