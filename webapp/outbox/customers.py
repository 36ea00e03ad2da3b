"""What Stripe last said of each customer (``stripe_customer_checks``): whether it exists.

Two things ask: a mapping (a tenant is mapped only to a customer Stripe has), and an error report
that says a customer was not found (the events sent to a customer Stripe does not have were all
refused, whether or not the report sampled them). Each answer is kept with when it was given, so
that every process asks Stripe about one customer at most once per
``STRIPE_METERS_REFRESH_SECONDS`` (:mod:`webapp.worker.customers` does the asking).

Stripe's answers (``GET /v1/customers/{id}``, docs.stripe.com/api/customers/retrieve): the
customer; for a deleted one a stub ``{"id", "object": "customer", "deleted": true}``; for an id
it does not have, a 404 with code ``resource_missing``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, Engine, select

from ..models import fit
from .sql import CUSTOMER_CHECKS, as_utc, insert_for

#: Stripe has the customer.
ACTIVE = "active"
#: Stripe has it, deleted: its meter events are refused, like those of an unknown one.
DELETED = "deleted"
#: Stripe has no customer of that id.
MISSING = "missing"
STATES = (ACTIVE, DELETED, MISSING)

C = CUSTOMER_CHECKS.c


@dataclass(frozen=True)
class CustomerCheck:
    """One answer of Stripe's about a customer."""

    customer_id: str
    state: str
    name: str | None = None
    request_id: str | None = None
    checked_at: datetime | None = None

    @property
    def exists(self) -> bool:
        """Whether Stripe bills usage sent to it (it has it, not deleted)."""
        return self.state == ACTIVE

    def refusal(self) -> str | None:
        """Why a tenant cannot be mapped to it, in one line naming it; None when it can."""
        if self.state == DELETED:
            return f"Stripe customer {self.customer_id} is deleted in Stripe"
        if self.state == MISSING:
            return f"Stripe has no customer {self.customer_id}"
        return None


def checks_since(conn: Connection, customer_ids: Iterable[str],
                 since: datetime) -> dict[str, CustomerCheck]:
    """The kept answers about these customers given at or after ``since``, by id."""
    wanted = sorted(set(customer_ids))
    out: dict[str, CustomerCheck] = {}
    for i in range(0, len(wanted), 500):
        for r in conn.execute(select(C.customer_id, C.state, C.name, C.request_id, C.checked_at)
                              .where(C.customer_id.in_(wanted[i:i + 500]),
                                     C.checked_at >= since)):
            out[r.customer_id] = CustomerCheck(r.customer_id, r.state, r.name, r.request_id,
                                               as_utc(r.checked_at))
    return out


def record_checks(engine: Engine, checks: Sequence[CustomerCheck], *, now: datetime) -> None:
    """Keep Stripe's answers (the newest replaces the one before), in one transaction."""
    if not checks:
        return
    with engine.begin() as conn:
        for c in checks:
            values = dict(state=c.state, name=fit(C.name, c.name),
                          request_id=fit(C.request_id, c.request_id), checked_at=now)
            conn.execute(insert_for(conn, CUSTOMER_CHECKS)
                         .values(customer_id=c.customer_id, **values)
                         .on_conflict_do_update(index_elements=[C.customer_id], set_=values))
