"""The billing periods that are closing: for each tenant and meter whose last period ended
and whose invoice is still a draft, or whose period ends within a day, the events and units
of that period Stripe has not accepted yet, and what they wait for. Read from the tables the
billing refresher keeps (``webapp.outbox.invoices``): nothing is asked of Stripe here.

What an unsent event waits for, in the order it is judged:

- ``person``: dead or rejected — a person must requeue or resolve it;
- ``meter``: waiting for a meter Stripe does not have active;
- ``retry``: pending, retrying or being sent — the drainer sends it on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, func, literal, null, select, tuple_, union_all

from ..outbox import invoices, stripe_runs
from ..outbox.billing_watch import Watch, watched
from ..outbox.late import (
    BILLING_STATUSES,
    UNSENT,
    LateEvent,
    late_events,
    unsent_parts,
)
from ..outbox.late_lines import short_lines
from ..outbox.meters import active_meters
from ..outbox.sql import (
    INVOICE_PERIODS,
    INVOICES,
    SUBSCRIPTION_ITEMS,
    TENANTS,
    T,
    as_utc,
    int_sum,
)
from ..status import NEEDS_A_PERSON

#: A period ending within this long is closing (its invoice is drafted at its end).
ENDS_WITHIN = timedelta(days=1)
#: What an unsent event waits for (see the module's docstring).
WAITS = ("retry", "meter", "person")


@dataclass
class ClosingPeriod:
    """One tenant × meter × period that is closing, and what of it is not at Stripe yet."""

    tenant_id: str | None
    stripe_customer_id: str
    meter: str
    period_start: datetime
    period_end: datetime
    invoice_id: str | None
    invoice_status: str | None
    finalizes_at: datetime | None
    unsent_events: int = 0
    unsent_units: int = 0
    #: Events by what they wait for (``WAITS``).
    waits: dict[str, int] = field(default_factory=dict)

    def seconds_left(self, now: datetime) -> float | None:
        """Until the draft finalizes (None without a draft)."""
        return None if self.finalizes_at is None else (self.finalizes_at - now).total_seconds()

    def as_dict(self) -> dict[str, Any]:
        return {"tenant_id": self.tenant_id, "stripe_customer_id": self.stripe_customer_id,
                "meter": self.meter, "period_start": _iso(self.period_start),
                "period_end": _iso(self.period_end), "invoice_id": self.invoice_id,
                "invoice_status": self.invoice_status,
                "finalizes_at": _iso(self.finalizes_at),
                "unsent_events": self.unsent_events, "unsent_units": self.unsent_units,
                "waiting_for": {w: self.waits.get(w, 0) for w in WAITS}}


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _drafts() -> Any:
    """A draft invoice's metered lines: (customer, meter, start, end, invoice_id, status,
    finalizes_at)."""
    return (select(INVOICE_PERIODS.c.stripe_customer_id.label("customer"),
                   INVOICE_PERIODS.c.meter.label("meter"),
                   INVOICE_PERIODS.c.period_start.label("start"),
                   INVOICE_PERIODS.c.period_end.label("end"),
                   INVOICES.c.id.label("invoice_id"), INVOICES.c.status.label("status"),
                   INVOICES.c.finalizes_at.label("finalizes_at"))
            .select_from(INVOICES)
            .join(INVOICE_PERIODS, INVOICE_PERIODS.c.invoice_id == INVOICES.c.id)
            .where(INVOICES.c.status == invoices.DRAFT, INVOICE_PERIODS.c.meter.is_not(None)))


def _windows(now: datetime) -> Any:
    """Every closing window as one subquery: a draft invoice's metered lines, and the items
    whose current period ends within ``ENDS_WITHIN`` (or ended, with no invoice read yet)."""
    drafts = _drafts()
    billed = (select(INVOICE_PERIODS.c.invoice_id)
              .where(INVOICE_PERIODS.c.subscription_item_id == SUBSCRIPTION_ITEMS.c.id,
                     INVOICE_PERIODS.c.period_start == SUBSCRIPTION_ITEMS.c.current_period_start)
              .exists())
    ending = (select(SUBSCRIPTION_ITEMS.c.stripe_customer_id, SUBSCRIPTION_ITEMS.c.meter,
                     SUBSCRIPTION_ITEMS.c.current_period_start,
                     SUBSCRIPTION_ITEMS.c.current_period_end,
                     null(), null(), null())
              .where(SUBSCRIPTION_ITEMS.c.current_period_end <= now + ENDS_WITHIN,
                     SUBSCRIPTION_ITEMS.c.subscription_status.in_(BILLING_STATUSES),
                     SUBSCRIPTION_ITEMS.c.meter.is_not(None), ~billed))
    return union_all(drafts, ending).subquery("w")


def closing_periods(conn: Connection, now: datetime) -> list[ClosingPeriod]:
    """Every closing period, with its unsent events by tenant; soonest to finalize first
    (periods without a draft after, soonest to end first)."""
    w = _windows(now)
    found: dict[tuple[Any, ...], ClosingPeriod] = {}
    for r in conn.execute(select(w, TENANTS.c.tenant_id)
                          .outerjoin(TENANTS, TENANTS.c.stripe_customer_id == w.c.customer)):
        key = (r.tenant_id, r.customer, r.meter, as_utc(r.start), r.invoice_id)
        found[key] = ClosingPeriod(r.tenant_id, r.customer, r.meter, _utc(r.start),
                                   _utc(r.end), r.invoice_id, r.status, as_utc(r.finalizes_at))
    if not found:
        return []
    active = set(active_meters(conn))
    customer = func.coalesce(T.c.stripe_customer_id, TENANTS.c.stripe_customer_id)
    waits = [select(T.c.tenant_id, w.c.customer, w.c.meter, w.c.start, w.c.end,
                    w.c.invoice_id, w.c.status, w.c.finalizes_at,
                    T.c.status.label("event_status"), func.count().label("events"),
                    int_sum(T.c.quantity).label("units"))
             .select_from(T)
             .outerjoin(TENANTS, TENANTS.c.tenant_id == T.c.tenant_id)
             .join(w, and_(w.c.customer == customer, w.c.meter == T.c.meter,
                           w.c.start <= T.c.occurred_at, T.c.occurred_at < w.c.end))
             .where(*where)
             .group_by(T.c.tenant_id, w.c.customer, w.c.meter, w.c.start, w.c.end,
                       w.c.invoice_id, w.c.status, w.c.finalizes_at, T.c.status)
             for where in unsent_parts()]
    for r in conn.execute(union_all(*waits)):
        key = (r.tenant_id, r.customer, r.meter, as_utc(r.start), r.invoice_id)
        period = found.get(key)
        if period is None:      # a tenant remapped since: its events went to this customer
            period = found[key] = ClosingPeriod(
                r.tenant_id, r.customer, r.meter, _utc(r.start), _utc(r.end), r.invoice_id,
                r.status, as_utc(r.finalizes_at))
        period.unsent_events += int(r.events)
        period.unsent_units += int(r.units)
        what = _waits_for(str(r.event_status), str(r.meter) in active)
        period.waits[what] = period.waits.get(what, 0) + int(r.events)
    far = datetime.max.replace(tzinfo=now.tzinfo)
    return sorted(found.values(), key=lambda p: (
        p.finalizes_at or far, p.period_end, p.stripe_customer_id, p.tenant_id or "",
        p.meter))


def _waits_for(status: str, meter_active: bool) -> str:
    if status in NEEDS_A_PERSON:
        return "person"
    if not meter_active:
        return "meter"
    return "retry"


def _utc(value: Any) -> datetime:
    found = as_utc(value)
    assert found is not None
    return found


@dataclass(frozen=True)
class Overlap:
    """A customer with more than one billing metered item on one meter: Stripe bills the
    same events on each line (meter events name a customer, not an item)."""

    stripe_customer_id: str
    meter: str
    subscription_items: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"stripe_customer_id": self.stripe_customer_id, "meter": self.meter,
                "subscription_items": list(self.subscription_items)}


def overlaps(conn: Connection, *, limit: int | None = None) -> list[Overlap]:
    """Every customer and meter with more than one item of a subscription that bills."""
    i = SUBSCRIPTION_ITEMS
    billing = [i.c.subscription_status.in_(BILLING_STATUSES), i.c.meter.is_not(None)]
    pairs = (select(i.c.stripe_customer_id, i.c.meter).where(*billing)
             .group_by(i.c.stripe_customer_id, i.c.meter).having(func.count() > 1)
             .order_by(i.c.stripe_customer_id, i.c.meter))
    if limit is not None:
        pairs = pairs.limit(limit)
    found = [(str(r[0]), str(r[1])) for r in conn.execute(pairs)]
    if not found:
        return []
    items: dict[tuple[str, str], list[str]] = {p: [] for p in found}
    for r in conn.execute(select(i.c.stripe_customer_id, i.c.meter, i.c.id)
                          .where(*billing, i.c.stripe_customer_id.in_(sorted({p[0] for p in
                                                                               found})))
                          .order_by(i.c.id)):
        key = (str(r[0]), str(r[1]))
        if key in items:
            items[key].append(str(r[2]))
    return [Overlap(c, m, tuple(items[(c, m)])) for c, m in found]


@dataclass
class PeriodsSummary:
    """What ``billing-outbox periods`` prints."""

    as_of: datetime
    closing: list[ClosingPeriod]
    late_events: int = 0
    late_units: int = 0
    overlaps: list[Overlap] = field(default_factory=list)

    def at_risk(self, within: timedelta) -> list[ClosingPeriod]:
        """The drafts finalizing within ``within`` with events unsent."""
        return [p for p in self.closing
                if p.finalizes_at is not None and p.unsent_events
                and p.finalizes_at - self.as_of <= within]

    def as_dict(self) -> dict[str, Any]:
        return {"as_of": self.as_of.isoformat(),
                "closing": [p.as_dict() for p in self.closing],
                "late": {"events": self.late_events, "units": self.late_units},
                "overlaps": [o.as_dict() for o in self.overlaps]}


def periods_summary(conn: Connection, now: datetime) -> PeriodsSummary:
    """The closing periods, the late usage not handled yet (late events, and the units short
    lines lack) and the customers billed twice on one meter."""
    late = late_events(conn)
    short = short_lines(conn)
    return PeriodsSummary(now, closing_periods(conn, now), late_events=len(late),
                          late_units=sum(e.quantity for e in late)
                          + int(sum(s.units for s in short)),
                          overlaps=overlaps(conn))


#: Closing periods a page shows at most, per part.
PAGE = 50


@dataclass
class PeriodsPage:
    """The periods page: drafts finalizing (soonest first, a page of them) and periods ending
    within a day, each with what of it is not at Stripe; the figures kept for the status line;
    when Stripe's billing was last read."""

    drafts: list[ClosingPeriod]
    #: The invoice to start the next page of drafts after (None: no more).
    drafts_next: str | None
    ending: list[ClosingPeriod]
    ending_more: bool
    watch: dict[str, Watch]
    refreshed: stripe_runs.RunStatus


def _tenants_of(conn: Connection, customers: set[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {c: [] for c in customers}
    if customers:
        for r in conn.execute(select(TENANTS.c.tenant_id, TENANTS.c.stripe_customer_id)
                              .where(TENANTS.c.stripe_customer_id.in_(sorted(customers)))
                              .order_by(TENANTS.c.tenant_id)):
            found[str(r.stripe_customer_id)].append(str(r.tenant_id))
    return found


def _fill_unsent(conn: Connection, periods: Sequence[ClosingPeriod], active: set[str]) -> None:
    """Fill each mapped period's unsent events, units and waits (its tenant's events of its
    meter in its period, billed to its customer): one statement for the page. The periods are
    a list of literals joined to the outbox; the events not in flight are found through
    ``ix_outbox_unsent_tenant`` (tenant, status, time), those in flight (few) apart."""
    mapped = [p for p in periods if p.tenant_id is not None]
    if not mapped:
        return
    at = T.c.occurred_at.type
    pw = union_all(*[select(literal(i).label("k"), literal(p.tenant_id).label("tenant"),
                            literal(p.meter).label("meter"),
                            literal(p.period_start, at).label("start"),
                            literal(p.period_end, at).label("end"),
                            literal(p.stripe_customer_id).label("customer"))
                     for i, p in enumerate(mapped)]).subquery("pw")
    customer = func.coalesce(T.c.stripe_customer_id, TENANTS.c.stripe_customer_id)

    def part(where: tuple[Any, ...]) -> Any:
        return (select(pw.c.k, T.c.status, func.count().label("n"),
                       int_sum(T.c.quantity).label("units"))
                .select_from(pw)
                .join(T, and_(T.c.tenant_id == pw.c.tenant, *where,
                              T.c.meter == pw.c.meter, T.c.occurred_at >= pw.c.start,
                              T.c.occurred_at < pw.c.end))
                .outerjoin(TENANTS, TENANTS.c.tenant_id == T.c.tenant_id)
                .where(customer == pw.c.customer)
                .group_by(pw.c.k, T.c.status))

    for r in conn.execute(union_all(*[part(where) for where in unsent_parts()])):
        period = mapped[int(r.k)]
        period.unsent_events += int(r.n)
        period.unsent_units += int(r.units)
        what = _waits_for(str(r.status), period.meter in active)
        period.waits[what] = period.waits.get(what, 0) + int(r.n)


def _by_tenant(conn: Connection, rows: Sequence[Any], active: set[str]
               ) -> list[ClosingPeriod]:
    tenants = _tenants_of(conn, {str(r.customer) for r in rows})
    out = []
    for r in rows:
        mapped: list[str | None] = [*tenants[str(r.customer)]]
        for tenant in mapped or [None]:
            out.append(ClosingPeriod(tenant, str(r.customer), str(r.meter), _utc(r.start),
                                     _utc(r.end), r.invoice_id, r.status,
                                     as_utc(r.finalizes_at)))
    _fill_unsent(conn, out, active)
    return out


def periods_page(conn: Connection, now: datetime, *, after: str | None = None,
                 limit: int = PAGE) -> PeriodsPage:
    """One page of closing periods (drafts after the invoice ``after``)."""
    active = set(active_meters(conn))
    drafts = _drafts()
    if after is not None:
        mark = conn.execute(select(INVOICES.c.finalizes_at).where(
            INVOICES.c.id == after, INVOICES.c.status == invoices.DRAFT)).scalar()
        if mark is not None:
            drafts = drafts.where(tuple_(INVOICES.c.finalizes_at, INVOICES.c.id)
                                  > tuple_(literal(as_utc(mark)), literal(after)))
    rows = conn.execute(drafts.order_by(INVOICES.c.finalizes_at, INVOICES.c.id,
                                        INVOICE_PERIODS.c.subscription_item_id)
                        .limit(limit + 1)).all()
    more = len(rows) > limit
    rows = rows[:limit]
    w = _windows(now)
    ending = conn.execute(select(w).where(w.c.invoice_id.is_(None))
                          .order_by(w.c.end, w.c.customer, w.c.meter).limit(limit + 1)).all()
    return PeriodsPage(
        drafts=_by_tenant(conn, rows, active),
        drafts_next=str(rows[-1].invoice_id) if more and rows else None,
        ending=_by_tenant(conn, ending[:limit], active), ending_more=len(ending) > limit,
        watch=watched(conn), refreshed=stripe_runs.run_status(conn, stripe_runs.BILLING))


__all__ = ["ENDS_WITHIN", "UNSENT", "WAITS", "ClosingPeriod", "LateEvent", "Overlap",
           "PeriodsSummary", "PeriodsPage", "closing_periods", "late_events", "overlaps",
           "periods_page", "periods_summary"]
