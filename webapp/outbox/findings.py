"""What reconciliation found of a customer's meter on one UTC day: the latest run that
compared it, and whether Stripe holds none of what the outbox sent for it, part, or as much or
more. :mod:`.resend` acts on it. Reads only, in the caller's transaction."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection, select

from .guards import REQUEUE_AGE_LIMIT
from .operations import OperationError
from .sql import RECON_MISMATCHES, RECON_RUNS, T, as_utc
from .states import Status

DAY = timedelta(days=1)
#: Figures closer than this are equal (Stripe's values are floats).
EPSILON = 1e-6


class Held(StrEnum):
    """What Stripe holds of a whole day the outbox sent, as reconciliation found it."""

    NONE = "none"    # nothing: the day's events may be sent again, all of them
    PART = "part"    # less than ours: a person chooses which events to send again
    MORE = "more"    # as much as ours or more: nothing to send again


def held(local_units: float, stripe_units: float) -> Held:
    """What Stripe holds of a day whose figures differ: ``local_units`` ours, ``stripe_units``
    Stripe's (units for a summed meter, events for a counted one)."""
    if abs(stripe_units) <= EPSILON and local_units > 0:
        return Held.NONE
    if stripe_units < local_units - EPSILON:
        return Held.PART
    return Held.MORE


def whole_day(start: datetime, end: datetime) -> date | None:
    """The UTC day a compared bucket is, or None for an hour at the window's ragged end
    (those are never sent again: a day is compared whole or not at all)."""
    begins = as_utc(start)
    if begins is None or as_utc(end) != begins + DAY or begins != datetime(
            begins.year, begins.month, begins.day, tzinfo=UTC):
        return None
    return begins.date()


def offer(start: datetime, end: datetime, local_units: float, stripe_units: float
          ) -> Held | None:
    """What a mismatch offers a person: a whole day Stripe holds none or part of; None for
    anything else (Stripe has more, or an hour bucket)."""
    if whole_day(start, end) is None:
        return None
    found = held(local_units, stripe_units)
    return None if found is Held.MORE else found


@dataclass(frozen=True)
class Bucket:
    """A customer's meter on one UTC day, as reconciliation compares it. ``tenant_id``
    narrows it to one tenant's events; None takes every tenant billed to the customer, as a
    reconciliation of every tenant compares it."""

    stripe_customer_id: str
    meter: str
    day: date
    tenant_id: str | None = None

    @property
    def start(self) -> datetime:
        return datetime(self.day.year, self.day.month, self.day.day, tzinfo=UTC)

    @property
    def end(self) -> datetime:
        return self.start + DAY

    def words(self) -> str:
        """``api_requests for cus_1 on 2026-01-31`` (and the tenant, when narrowed)."""
        who = f" (tenant {self.tenant_id})" if self.tenant_id is not None else ""
        return f"{self.meter} for {self.stripe_customer_id}{who} on {self.day.isoformat()}"

    def conditions(self) -> list[Any]:
        """The bucket's events, whatever their status."""
        where = [T.c.stripe_customer_id == self.stripe_customer_id, T.c.meter == self.meter,
                 T.c.occurred_at >= self.start, T.c.occurred_at < self.end]
        if self.tenant_id is not None:
            where.append(T.c.tenant_id == self.tenant_id)
        return where


@dataclass(frozen=True)
class Finding:
    """The latest reconciliation that compared a bucket's day, and what it found of it."""

    run_id: int
    run_tenant_id: str | None
    #: When the run started: the events sent before it are the ones it compared.
    compared_at: datetime
    run_ok: bool
    mismatch_id: int | None = None
    formula: str = "sum"
    local_units: float = 0.0
    stripe_units: float = 0.0

    @property
    def held(self) -> Held | None:
        """None: the run found no difference for the bucket (it matched, was pending, or was
        not compared)."""
        return None if self.mismatch_id is None else held(self.local_units, self.stripe_units)

    @property
    def lacking(self) -> float:
        """What Stripe lacks of ours, in the meter's measure (units, or events)."""
        return self.local_units - self.stripe_units


def finding(conn: Connection, bucket: Bucket) -> Finding | None:
    """The latest reconciliation that compared the bucket's day for its tenants (a run of
    every tenant, or of one of them) and its mismatch for the bucket; None if none did."""
    R, X = RECON_RUNS.c, RECON_MISMATCHES.c  # noqa: N806 - table columns
    if bucket.tenant_id is not None:
        tenants = [bucket.tenant_id]
    else:
        tenants = list(conn.execute(select(T.c.tenant_id).distinct()
                                    .where(*bucket.conditions())).scalars())
    scope = R.tenant_id.is_(None) | R.tenant_id.in_(tenants) if tenants else R.tenant_id.is_(None)
    run = conn.execute(select(R.id, R.tenant_id, R.started_at, R.ok)
                       .where(R.since <= bucket.start, R.until >= bucket.end, scope)
                       .order_by(R.started_at.desc(), R.id.desc()).limit(1)).first()
    if run is None:
        return None
    compared_at = as_utc(run.started_at)
    assert compared_at is not None
    found = Finding(int(run.id), run.tenant_id, compared_at, bool(run.ok))
    m = conn.execute(select(X.id, X.formula, X.local_units, X.stripe_units).where(
        X.run_id == run.id, X.stripe_customer_id == bucket.stripe_customer_id,
        X.meter == bucket.meter, X.start == bucket.start, X.end == bucket.end)).first()
    if m is None:
        return found
    return Finding(found.run_id, found.run_tenant_id, compared_at, found.run_ok, int(m.id),
                   str(m.formula), float(m.local_units), float(m.stripe_units))


#: Why a day past Stripe's 35-day limit is not sent again (``day``: YYYY-MM-DD).
TOO_OLD = ("{day} is more than 35 days ago: Stripe refuses new events that old, so this usage "
           "cannot be sent again. Bill it by hand (on the invoice).")


def require_finding(conn: Connection, bucket: Bucket, *, now: datetime) -> Finding:
    """:func:`finding`, where Stripe holds none or part of the bucket; otherwise the refusal
    (:class:`~.operations.OperationError`), also for a day past Stripe's 35-day limit."""
    if bucket.end <= now - REQUEUE_AGE_LIMIT:
        raise OperationError(TOO_OLD.format(day=bucket.day.isoformat()))
    found = finding(conn, bucket)
    day = bucket.day.isoformat()
    if found is None:
        raise OperationError(
            f"No reconciliation has compared {day} for {_whose(bucket)} yet: reconcile first "
            "(billing-outbox reconcile, or the Reconciliation page's button); what it finds "
            "missing can then be sent again.")
    if bucket.tenant_id is None and found.run_tenant_id is not None:
        raise OperationError(
            f"Reconciliation run {found.run_id}, of tenant {found.run_tenant_id} only, compared "
            f"{day} after the last run of every tenant: send again per tenant "
            f"(billing-outbox reconcile resend --tenant {found.run_tenant_id} …), or reconcile "
            "every tenant again.")
    if found.held is None:
        why = ("it matched, was still pending, or was not compared" if found.run_ok else
               "the run could not ask Stripe about everything: reconcile again")
        raise OperationError(
            f"Reconciliation run {found.run_id}, the latest to compare {day}, found no "
            f"difference for {bucket.words()} ({why}). Nothing is sent again.")
    if found.held is Held.MORE:
        raise OperationError(
            f"Reconciliation run {found.run_id} found Stripe holding {number(found.stripe_units)} "
            f"of our {number(found.local_units)} for {bucket.words()}: Stripe lacks nothing, so "
            "nothing is sent again.")
    return found


def _whose(bucket: Bucket) -> str:
    who = f"tenant {bucket.tenant_id}" if bucket.tenant_id is not None else "every tenant"
    return f"{who}, {bucket.meter}, {bucket.stripe_customer_id}"


def number(value: float) -> str:
    """A figure as people read it: ``1,234``, or ``2.5`` when not whole."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,g}"


def bucket_for(conn: Connection, tenant_id: str, meter: str, day: date,
               customer: str | None = None) -> Bucket:
    """A tenant's bucket of a meter on a UTC day: with the Stripe customer its events went
    to, unless ``customer`` names it. Refused when they went to none, or to several and
    ``customer`` does not say which."""
    if customer is not None:
        return Bucket(customer, meter, day, tenant_id)
    customers = customers_of(conn, tenant_id, meter, day)
    if not customers:
        raise OperationError(f"No event of tenant {tenant_id} for {meter} on {day} was sent "
                             "to Stripe: nothing to send again.")
    if len(customers) > 1:
        raise OperationError(f"Tenant {tenant_id}'s events for {meter} on {day} went to "
                             f"{len(customers)} Stripe customers ({', '.join(customers)}): "
                             "name one with --customer.")
    return Bucket(customers[0], meter, day, tenant_id)


def customers_of(conn: Connection, tenant_id: str, meter: str, day: date) -> list[str]:
    """The Stripe customers a tenant's events of a meter on a UTC day were sent (or are
    being sent again) to."""
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    return sorted(str(c) for c in conn.execute(
        select(T.c.stripe_customer_id).distinct().where(
            T.c.tenant_id == tenant_id, T.c.meter == meter, T.c.occurred_at >= start,
            T.c.occurred_at < start + DAY, T.c.stripe_customer_id.is_not(None),
            T.c.status.in_([Status.SENT.value, Status.PENDING.value, Status.PROCESSING.value,
                            Status.RETRYING.value]))).scalars())
