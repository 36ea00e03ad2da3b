"""Usage on no invoice: events Stripe took for a customer and meter that, at the event's time,
had no invoice to land on. Stripe counts them on its meter and bills them nowhere
(``docs/stripe.md``, "What an invoice line proves"):

- ``trial``: the usage fell in a subscription's trial (usage in a trial is not billed);
- ``paused``: the subscription was paused (a paused subscription invoices nothing, and its
  period does not advance);
- ``ended``: the subscription was cancelled without a final invoice, in its last period
  (``invoice_now`` defaults to false);
- ``no_item``: the customer had no metered item on the meter at all.

An event in a period an invoice line covers (draft or final) is left to that line
(:mod:`.judge`); an event in a subscription's running period, or in any period of one that
bills, is not unbilled. Only events Stripe took before the subscriptions were last read are
judged, so a subscription made a moment ago is never missed.

:func:`find_unbilled` looks again at the customers that changed since its last look: those
with events sent since, whose subscriptions changed, or whose invoices were read (the first
look: every customer with sent events). Its cost follows what changed, not the table.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, delete, func, or_, select, union

from ..status import SENT
from . import stripe_runs
from .evidence import FREE
from .sql import (
    INVOICE_PERIODS,
    INVOICES,
    SUBSCRIPTION_ITEMS,
    SUBSCRIPTIONS,
    TENANTS,
    UNBILLED,
    T,
    as_utc,
    insert_for,
    status_is,
    text_in,
)

NO_ITEM, PAUSED, ENDED, TRIAL = "no_item", "paused", "ended", "trial"
#: Why usage is on no invoice, the first that applies winning.
REASONS = (TRIAL, PAUSED, ENDED, NO_ITEM)
#: How far before the last look's start the next looks again at sends.
SCAN_OVERLAP = timedelta(minutes=10)
#: Customers looked at per transaction.
CHUNK = 200
#: The statuses of a subscription that has ended: no period of it bills any more.
ENDED_STATUSES = ("canceled", "incomplete_expired")


@dataclass(frozen=True)
class Subscription:
    """What of a subscription with an item on a meter decides whether usage is invoiced."""

    id: str
    status: str
    start: datetime | None
    trial: tuple[datetime, datetime] | None
    paused: tuple[datetime, datetime | None] | None
    ended_at: datetime | None
    #: The item's current period (frozen while paused; the last one once ended).
    period: tuple[datetime, datetime]


@dataclass
class Coverage:
    """A customer's subscriptions on one meter, and the periods invoice lines cover."""

    subscriptions: list[Subscription] = field(default_factory=list)
    lines: list[tuple[datetime, datetime]] = field(default_factory=list)


def reason_for(at: datetime, coverage: Coverage) -> tuple[str, str | None] | None:
    """Why usage at ``at`` lands on no invoice, and the subscription it concerns; None when
    an invoice line covers it or a subscription bills it. Pure."""
    if any(start <= at < end for start, end in coverage.lines):
        return None
    found: list[tuple[str, str]] = []
    for s in coverage.subscriptions:
        if s.trial is not None and s.trial[0] <= at < s.trial[1]:
            found.append((TRIAL, s.id))
        elif s.paused is not None and s.paused[0] <= at and (s.paused[1] is None
                                                              or at < s.paused[1]):
            found.append((PAUSED, s.id))
        elif s.ended_at is not None and at >= s.ended_at:
            continue                    # after its end: not this subscription's
        elif s.ended_at is not None and at >= s.period[0]:
            found.append((ENDED, s.id))
        elif s.start is None or at >= s.start:
            return None                 # a period of a subscription that bills
    if not found:
        return NO_ITEM, None
    return min(found, key=lambda f: REASONS.index(f[0]))


@dataclass
class UnbilledSummary:
    customers: int = 0
    events: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"customers": self.customers, "events": self.events}


def find_unbilled(engine: Engine, *, now: datetime) -> UnbilledSummary:
    """Look again at the customers that changed since the last look (see the module's
    docstring) and keep, for each of their events Stripe took, why it lands on no invoice.
    Nothing is said before Stripe's subscriptions were read once."""
    summary = UnbilledSummary()
    with engine.connect() as conn:
        refreshed = stripe_runs.run_status(conn, stripe_runs.SUBSCRIPTIONS_MARK).ran_at
        if refreshed is None:
            return summary
        mark = stripe_runs.run_status(conn, stripe_runs.UNBILLED_MARK).ran_at
        customers = sorted(_customers(conn, None if mark is None else mark - SCAN_OVERLAP))
    for start in range(0, len(customers), CHUNK):
        with engine.begin() as conn:
            summary.events += _look(conn, customers[start:start + CHUNK], refreshed, now)
    summary.customers = len(customers)
    stripe_runs.record_run(engine, stripe_runs.UNBILLED_MARK, ok=True, now=refreshed,
                           detail=f"{summary.events} events on no invoice, "
                           f"{summary.customers} customers looked at")
    return summary


def _customers(conn: Connection, since: datetime | None) -> set[str]:
    """The customers to look at: every one with sent events the first time; then those with
    events sent since, subscriptions changed since, or invoices read since."""
    if since is None:
        sent = select(T.c.stripe_customer_id).where(status_is(SENT),
                                                    T.c.stripe_customer_id.is_not(None))
        return {str(c) for c in conn.execute(sent.distinct()).scalars()}
    parts = union(
        select(T.c.stripe_customer_id.label("c")).where(status_is(SENT),
                                                        T.c.sent_at > since),
        select(SUBSCRIPTIONS.c.stripe_customer_id).where(SUBSCRIPTIONS.c.changed_at > since),
        select(INVOICES.c.stripe_customer_id).where(INVOICES.c.seen_at > since))
    return {str(c) for c in conn.execute(parts).scalars() if c is not None}


def _look(conn: Connection, customers: Sequence[str], refreshed: datetime,
          now: datetime) -> int:
    """Judge every event Stripe took for these customers before ``refreshed``, and keep what
    lands on no invoice in place of what was kept for them. How many do."""
    coverage = _coverage(conn, customers)
    taken = [status_is(SENT), T.c.sent_at <= refreshed, T.c.occurred_at <= refreshed]
    # Customers whose every meter's events a subscription bills from before the first of
    # them to after the last: nothing of theirs can be unbilled, and no event is read.
    spans = conn.execute(select(T.c.stripe_customer_id, T.c.meter, func.min(T.c.occurred_at),
                                func.max(T.c.occurred_at))
                         .where(*taken, text_in(conn, T.c.stripe_customer_id, customers))
                         .group_by(T.c.stripe_customer_id, T.c.meter)).all()
    doubtful = sorted({str(r[0]) for r in spans if not _billed_throughout(
        coverage.get((str(r[0]), str(r[1])), Coverage()), _utc(r[2]), _utc(r[3]))})
    rows = []
    events: Iterable[Any] = [] if not doubtful else conn.execute(
        select(T.c.id, T.c.stripe_customer_id, T.c.meter, T.c.occurred_at)
        .where(*taken, text_in(conn, T.c.stripe_customer_id, doubtful)))
    for r in events:
        found = reason_for(_utc(r.occurred_at), coverage.get((str(r.stripe_customer_id),
                                                               str(r.meter)), Coverage()))
        if found is not None:
            rows.append(dict(event_id=int(r.id), stripe_customer_id=str(r.stripe_customer_id),
                             meter=str(r.meter), reason=found[0], subscription_id=found[1],
                             found_at=now))
    conn.execute(delete(UNBILLED).where(text_in(conn, UNBILLED.c.stripe_customer_id,
                                                customers)))
    for start in range(0, len(rows), 500):
        conn.execute(insert_for(conn, UNBILLED).on_conflict_do_nothing(
            index_elements=[UNBILLED.c.event_id]), rows[start:start + 500])
    return len(rows)


def _billed_throughout(coverage: Coverage, first: datetime, last: datetime) -> bool:
    """Whether one subscription bills every moment from ``first`` to ``last``: it began
    before, and no trial, pause or end of it falls in between."""
    for s in coverage.subscriptions:
        if s.start is not None and s.start > first:
            continue
        if s.trial is not None and s.trial[1] > first:
            continue
        if s.paused is not None and (s.paused[1] is None or s.paused[1] > first):
            continue
        if s.ended_at is not None:
            continue
        return True
    return False


def _coverage(conn: Connection, customers: Sequence[str]
              ) -> defaultdict[tuple[str, str], Coverage]:
    """Per (customer, meter): the subscriptions with an item on the meter, and the periods
    of the invoice lines (not free) that cover usage."""
    found: defaultdict[tuple[str, str], Coverage] = defaultdict(Coverage)
    s, i = SUBSCRIPTIONS, SUBSCRIPTION_ITEMS
    for r in conn.execute(
            select(i.c.stripe_customer_id, i.c.meter, i.c.current_period_start,
                   i.c.current_period_end, s)
            .join(s, s.c.id == i.c.subscription_id)
            .where(text_in(conn, i.c.stripe_customer_id, customers), i.c.meter.is_not(None))):
        trial = (None if r.trial_start is None or r.trial_end is None
                 else (_utc(r.trial_start), _utc(r.trial_end)))
        paused = None if r.paused_at is None else (_utc(r.paused_at), as_utc(r.resumed_at))
        ended = as_utc(r.ended_at) if r.status in ENDED_STATUSES else None
        found[(str(r.stripe_customer_id), str(r.meter))].subscriptions.append(Subscription(
            str(r.id), str(r.status), as_utc(r.start_date) or as_utc(r.created), trial, paused,
            ended, (_utc(r.current_period_start), _utc(r.current_period_end))))
    lp = INVOICE_PERIODS
    for r in conn.execute(
            select(lp.c.stripe_customer_id, lp.c.meter, lp.c.period_start, lp.c.period_end)
            .join(INVOICES, INVOICES.c.id == lp.c.invoice_id)
            .where(text_in(conn, lp.c.stripe_customer_id, customers), lp.c.meter.is_not(None),
                   INVOICES.c.status != "deleted",
                   or_(lp.c.verdict.is_(None), lp.c.verdict != FREE))):
        found[(str(r.stripe_customer_id), str(r.meter))].lines.append(
            (_utc(r.period_start), _utc(r.period_end)))
    return found


def _utc(value: Any) -> datetime:
    found = as_utc(value)
    assert found is not None
    return found


@dataclass(frozen=True)
class UnbilledEvent:
    """An event on no invoice, as ``billing-outbox unbilled`` lists it."""

    id: int
    tenant_id: str
    stripe_customer_id: str
    meter: str
    quantity: int
    occurred_at: datetime
    reason: str
    subscription_id: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "tenant_id": self.tenant_id,
                "stripe_customer_id": self.stripe_customer_id, "meter": self.meter,
                "quantity": self.quantity, "occurred_at": self.occurred_at.isoformat(),
                "reason": self.reason}


def unbilled_events(conn: Connection, *, tenant_id: str | None = None,
                    reasons: Iterable[str] | None = None,
                    limit: int | None = None) -> list[UnbilledEvent]:
    """The events on no invoice that are still ``sent``, oldest first."""
    stmt = (select(T.c.id, T.c.tenant_id, T.c.meter, T.c.quantity, T.c.occurred_at,
                   UNBILLED.c.stripe_customer_id, UNBILLED.c.reason,
                   UNBILLED.c.subscription_id)
            .select_from(UNBILLED).join(T, T.c.id == UNBILLED.c.event_id)
            .where(status_is(SENT)).order_by(T.c.occurred_at, T.c.id))
    if tenant_id is not None:
        stmt = stmt.where(T.c.tenant_id == tenant_id)
    if reasons is not None:
        stmt = stmt.where(UNBILLED.c.reason.in_(list(reasons)))
    if limit is not None:
        stmt = stmt.limit(limit)
    return [UnbilledEvent(int(r.id), str(r.tenant_id), str(r.stripe_customer_id),
                          str(r.meter), int(r.quantity), _utc(r.occurred_at), str(r.reason),
                          r.subscription_id) for r in conn.execute(stmt)]


def unbilled_totals(conn: Connection) -> dict[str, tuple[int, int]]:
    """Events and units on no invoice (still ``sent``), by reason."""
    return {str(r.reason): (int(r.events), int(r.units or 0)) for r in conn.execute(
        select(UNBILLED.c.reason, func.count().label("events"),
               func.sum(T.c.quantity).label("units"))
        .select_from(UNBILLED).join(T, T.c.id == UNBILLED.c.event_id)
        .where(status_is(SENT)).group_by(UNBILLED.c.reason))}


def tenants_of(conn: Connection, customers: Iterable[str]) -> dict[str, str]:
    """The tenant each customer is mapped to (the first, when several)."""
    out: dict[str, str] = {}
    for r in conn.execute(select(TENANTS.c.stripe_customer_id, func.min(TENANTS.c.tenant_id))
                          .where(TENANTS.c.stripe_customer_id.in_(sorted(set(customers))))
                          .group_by(TENANTS.c.stripe_customer_id)):
        out[str(r[0])] = str(r[1])
    return out
