"""What Stripe last said of each customer (``stripe_customer_checks``): whether it exists.

Two things ask: a mapping (a tenant is mapped only to a customer Stripe has), and an error report
that says a customer was not found (the events sent to a customer Stripe does not have were all
refused, whether or not the report sampled them). Each answer is kept with when it was given, so
that every process asks Stripe about one customer at most once per
``STRIPE_METERS_REFRESH_SECONDS`` (:mod:`webapp.worker.customers` does the asking).

Stripe's answers (``GET /v1/customers/{id}``, docs.stripe.com/api/customers/retrieve): the
customer; for a deleted one a stub ``{"id", "object": "customer", "deleted": true}``; for an id
it does not have, a 404 with code ``resource_missing``. The stub carries no deletion time: that
is the ``created`` of Stripe's v1 event ``customer.deleted`` (``GET /v1/events``, kept 30
days), read when an error report needs it (:attr:`CustomerCheck.deleted_at`) and never kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
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
    #: For a ``deleted`` customer, when Stripe deleted it (its ``customer.deleted`` event's
    #: ``created``), when that could be had; None otherwise. Not kept with the answer.
    deleted_at: datetime | None = None

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


#: What to do about a customer Stripe does not have, said after the refusal.
NOT_IN_STRIPE_ADVICE = "check the id in Stripe's dashboard, or create the customer first"
#: What to do when Stripe could not be asked.
UNASKED_ADVICE = "try again in a moment"
#: How a mapping made without a key says its customer was not checked.
NOT_CHECKED = "not checked with Stripe (no STRIPE_API_KEY)"


@dataclass(frozen=True)
class CustomerVerdicts:
    """Whether tenants may be mapped to some customers, decided just before a mapping is
    applied (``webapp.worker.check_customers`` asks Stripe; the sync from Stripe's own listing
    makes them with :meth:`listed`).

    With a key set, a customer maps only when Stripe answered that it has it: deleted, missing
    and a customer Stripe could not be asked about (absent from ``answers``) are refused, each
    with one line naming it. Without a key (``checked`` false) nothing was asked: every
    customer maps, and what is written says it was not checked.
    """

    checked: bool
    answers: Mapping[str, CustomerCheck] = field(default_factory=dict)
    #: How the customers were checked, for audit entries and messages.
    how: str = "checked with Stripe"

    @classmethod
    def unchecked(cls) -> CustomerVerdicts:
        """No key: nothing asked, every customer maps, saying it was not checked."""
        return cls(checked=False, how=NOT_CHECKED)

    @classmethod
    def listed(cls, checks: Iterable[CustomerCheck]) -> CustomerVerdicts:
        """Customers Stripe itself listed (deleted ones left out): it has them."""
        return cls(checked=True, answers={c.customer_id: c for c in checks},
                   how="listed by Stripe")

    def refusal(self, customer_id: str) -> str | None:
        """Why a tenant cannot be mapped to ``customer_id``, in one line naming it (what
        Stripe said, or that it could not be asked); None when it can."""
        if not self.checked:
            return None
        answer = self.answers.get(customer_id)
        if answer is None:
            return f"Stripe could not be asked about customer {customer_id}"
        # Refusals are fresh answers: a customer Stripe lacked is asked about again.
        return answer.refusal()

    def unasked(self, customer_id: str) -> bool:
        """Whether ``customer_id`` is refused only because Stripe could not be asked."""
        return self.checked and customer_id not in self.answers

    def advice(self, customer_id: str) -> str:
        """What to do about a refused customer: check it in Stripe, or try again later."""
        return UNASKED_ADVICE if self.unasked(customer_id) else NOT_IN_STRIPE_ADVICE

    def explained(self, customer_id: str) -> str | None:
        """:meth:`refusal` and what to do about it, in one line; None when it maps."""
        line = self.refusal(customer_id)
        return None if line is None else f"{line}; {self.advice(customer_id)}"


def checks_since(conn: Connection, customer_ids: Iterable[str],
                 since: datetime) -> dict[str, CustomerCheck]:
    """The kept answers about these customers given at or after ``since``, by id (without
    a deletion time: it is not kept)."""
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
