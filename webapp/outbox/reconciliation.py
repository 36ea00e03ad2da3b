"""Reconciliation: the units the outbox believes Stripe holds against Stripe's meter event
summaries, per customer × meter and UTC day (hours at the window's ragged ends).

Ours: events ``sent`` (not rejected, not cancelled), bucketed by ``occurred_at`` — Stripe
bills by the event's timestamp. A bucket is *pending*, not a mismatch, while Stripe's
summaries may still move: when it ends less than the settle time ago, or holds an event whose
state changed within it, or one whose outcome at Stripe is still unknown (in flight, or
retrying after a call that may have landed). The calls to Stripe are
``webapp.worker.reconciler``'s; this module is the arithmetic and the bookkeeping.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    case,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    tuple_,
)

from ..models import fit, fit_json_list
from ..status import SENT
from .sql import (
    RECON_DAYS,
    RECON_METER_DAYS,
    RECON_MISMATCHES,
    RECON_MONTHS,
    RECON_RUNS,
    T,
    as_utc,
    epoch_bucket,
    insert_for,
    int_sum,
    status_is,
)
from .states import MAX_AGE, Status

DAY = timedelta(days=1)
HOUR = timedelta(hours=1)


@dataclass(frozen=True)
class Span:
    """A stretch of the window read with one summaries call: ``grouping`` is ``day`` (00:00
    UTC bounds) or ``hour`` (hour bounds)."""

    start: datetime
    end: datetime
    grouping: str

    def buckets(self) -> list[tuple[datetime, datetime]]:
        step = DAY if self.grouping == "day" else HOUR
        out, at = [], self.start
        while at < self.end:
            out.append((at, min(at + step, self.end)))
            at += step
        return out


def _floor(at: datetime, step: timedelta) -> datetime:
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return epoch + ((at.astimezone(UTC) - epoch) // step) * step


def default_window(now: datetime) -> tuple[datetime, datetime]:
    """The last 35 days Stripe still accepts, on hour bounds."""
    return _floor(now - MAX_AGE, HOUR) + HOUR, _floor(now, HOUR)


def align(since: datetime, until: datetime) -> tuple[datetime, datetime]:
    """A window on hour bounds (summaries are read per hour or per day): ``since`` down,
    ``until`` down. Raises ``ValueError`` for an empty window."""
    start, end = _floor(since, HOUR), _floor(until, HOUR)
    if end <= start:
        raise ValueError("the window must hold at least one whole hour")
    return start, end


def spans(since: datetime, until: datetime) -> list[Span]:
    """Whole UTC days in one ``day`` span, the ragged hours at either end in ``hour`` spans."""
    first_day, last_day = _floor(since, DAY), _floor(until, DAY)
    if since != first_day:
        first_day += DAY
    if first_day >= last_day:
        return [Span(since, until, "hour")]
    out = []
    if since < first_day:
        out.append(Span(since, first_day, "hour"))
    out.append(Span(first_day, last_day, "day"))
    if last_day < until:
        out.append(Span(last_day, until, "hour"))
    return out


@dataclass
class PairTotals:
    """Ours for one customer × meter: per bucket start, units and events sent, and the
    buckets that are not settled."""

    stripe_customer_id: str
    meter: str
    tenants: set[str] = field(default_factory=set)
    units: dict[datetime, int] = field(default_factory=lambda: defaultdict(int))
    events: dict[datetime, int] = field(default_factory=lambda: defaultdict(int))
    unsettled: set[datetime] = field(default_factory=set)


def local_totals(conn: Connection, since: datetime, until: datetime, *, now: datetime,
                 settle_seconds: float, tenant_id: str | None = None
                 ) -> dict[tuple[str, str], PairTotals]:
    """Ours, per (customer, meter) with events in the window: units and events sent per hour
    (summed into days by the caller's spans), and the hours not settled.

    ``tenant_id``: only the customers that tenant's events went to, each with every tenant's
    events of it. Stripe's figure is the customer's, so comparing it with one tenant's share
    would call a customer billed to two tenants a mismatch (and keep that as its day)."""
    where: list[Any] = [T.c.occurred_at >= since, T.c.occurred_at < until,
                        T.c.stripe_customer_id.is_not(None)]
    if tenant_id is not None:
        where.append(T.c.stripe_customer_id.in_(
            select(T.c.stripe_customer_id).where(
                T.c.tenant_id == tenant_id, T.c.occurred_at >= since, T.c.occurred_at < until,
                T.c.stripe_customer_id.is_not(None)).distinct()))
    hour = epoch_bucket(T.c.occurred_at, literal(3600)).label("hour")
    recent = now - timedelta(seconds=settle_seconds)
    unsettled = or_(
        T.c.status.in_([Status.PROCESSING.value]),
        (T.c.status == Status.RETRYING.value) & (T.c.call_count > 0),
        (T.c.status.in_([Status.SENT.value, Status.REJECTED.value, Status.CANCELLED.value])
         & (T.c.updated_at >= recent)))
    sent = status_is(SENT)
    rows = conn.execute(
        select(T.c.stripe_customer_id, T.c.meter, T.c.tenant_id, hour,
               int_sum(case((sent, T.c.quantity), else_=0)),
               int_sum(case((sent, 1), else_=0)), int_sum(case((unsettled, 1), else_=0)))
        .where(*where).group_by(T.c.stripe_customer_id, T.c.meter, T.c.tenant_id, hour)).all()
    out: dict[tuple[str, str], PairTotals] = {}
    for customer, meter, tenant, h, units, events, open_ in rows:
        pair = out.setdefault((customer, meter), PairTotals(customer, meter))
        pair.tenants.add(tenant)
        start = datetime.fromtimestamp(int(h) * 3600, UTC)
        pair.units[start] += int(units)
        pair.events[start] += int(events)
        if int(open_):
            pair.unsettled.add(start)
    return out


@dataclass(frozen=True)
class Mismatch:
    tenant_id: str
    stripe_customer_id: str
    meter: str
    formula: str
    start: datetime
    end: datetime
    local_units: int
    stripe_units: float

    @property
    def difference(self) -> float:
        return self.stripe_units - self.local_units

    def as_dict(self) -> dict[str, Any]:
        """The contract's shape (``reconcile --json``)."""
        return {"tenant_id": self.tenant_id, "stripe_customer_id": self.stripe_customer_id,
                "meter": self.meter, "start": _iso(self.start), "end": _iso(self.end),
                "local_units": self.local_units, "stripe_units": _number(self.stripe_units),
                "difference": _number(self.difference)}


@dataclass(frozen=True)
class ComparedDay:
    """One whole UTC day of one customer and meter that was compared (matched or not)."""

    stripe_customer_id: str
    meter: str
    day: str
    formula: str
    ours: int
    stripe: float


@dataclass
class Comparison:
    """What comparing one or more pairs found: how many buckets were compared and pending,
    the mismatches, and every whole day compared (kept, so usage shows Stripe's figure)."""

    checked: int = 0
    pending: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)
    days: list[ComparedDay] = field(default_factory=list)


def compare(pair: PairTotals, formula: str, span: Span, stripe: dict[datetime, float], *,
            now: datetime, settle_seconds: float, into: Comparison) -> None:
    """Compare one span of one pair, bucket by bucket. ``stripe``: Stripe's aggregated value
    per bucket start (buckets it left out hold nothing). ``formula`` ``sum`` compares units,
    ``count`` compares events."""
    settled_before = now - timedelta(seconds=settle_seconds)
    step = DAY if span.grouping == "day" else HOUR
    by_bucket: dict[datetime, list[datetime]] = defaultdict(list)
    for h in pair.units:
        if span.start <= h < span.end:
            by_bucket[span.start + (h - span.start) // step * step].append(h)
    for start, end in span.buckets():
        hours = by_bucket.get(start, [])
        ours = sum((pair.events if formula == "count" else pair.units)[h] for h in hours)
        theirs = stripe.get(start, 0.0)
        if not ours and not theirs:
            continue
        if end > settled_before or any(h in pair.unsettled for h in hours):
            into.pending += 1
            continue
        into.checked += 1
        if span.grouping == "day":
            into.days.append(ComparedDay(pair.stripe_customer_id, pair.meter,
                                         start.date().isoformat(), formula, ours, theirs))
        if abs(theirs - ours) > 1e-6 * max(1.0, abs(ours)):
            into.mismatches.append(Mismatch(
                ", ".join(sorted(pair.tenants)), pair.stripe_customer_id, pair.meter, formula,
                start, end, ours, theirs))


@dataclass
class RunRecord:
    """One reconciliation as stored and as ``reconcile --json`` prints it."""

    since: datetime
    until: datetime
    started_at: datetime
    trigger: str
    tenant_id: str | None = None
    actor: str | None = None
    finished_at: datetime | None = None
    comparison: Comparison = field(default_factory=Comparison)
    calls: int = 0
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    id: int | None = None

    @property
    def ok(self) -> bool:
        return not self.errors

    def as_dict(self) -> dict[str, Any]:
        c = self.comparison
        return {"since": _iso(self.since), "until": _iso(self.until),
                "buckets_checked": c.checked, "pending": c.pending,
                "mismatches": [m.as_dict() for m in c.mismatches], "errors": list(self.errors),
                "notes": list(self.notes), "calls": self.calls, "run_id": self.id}


def store_run(engine: Engine, run: RunRecord) -> int:
    """Keep a finished run and its mismatches; the run's id. Its errors quote Stripe's
    answers: they are kept as a JSON list cut to its column (``fit_json_list``), so storing a
    run never fails on them."""
    c = run.comparison
    R, X = RECON_RUNS.c, RECON_MISMATCHES.c  # noqa: N806 - table columns
    with engine.begin() as conn:
        run_id = int(conn.execute(insert(RECON_RUNS).values(
            started_at=run.started_at, finished_at=run.finished_at, since=run.since,
            until=run.until, tenant_id=fit(R.tenant_id, run.tenant_id), trigger=run.trigger,
            actor=fit(R.actor, run.actor), buckets_checked=c.checked, pending=c.pending,
            mismatches=len(c.mismatches), calls=run.calls, ok=run.ok,
            errors=fit_json_list(R.errors, run.errors),
            notes=fit_json_list(R.notes, run.notes)).returning(R.id)).scalar_one())
        if c.mismatches:
            conn.execute(insert(RECON_MISMATCHES), [dict(
                run_id=run_id, tenant_id=fit(X.tenant_id, m.tenant_id),
                stripe_customer_id=fit(X.stripe_customer_id, m.stripe_customer_id),
                meter=fit(X.meter, m.meter), formula=fit(X.formula, m.formula),
                start=m.start, end=m.end, local_units=m.local_units,
                stripe_units=m.stripe_units, difference=m.difference) for m in c.mismatches])
        keep_days(conn, run_id, c.days, at=run.finished_at or run.started_at)
    run.id = run_id
    return run_id


def keep_days(conn: Connection, run_id: int, days: list[ComparedDay], *,
              at: datetime) -> None:
    """Keep what a run compared, day by day (replacing an earlier comparison of the same
    customer, meter and day), and add the months and the meters' days it touched up again
    from their days."""
    if not days:
        return
    D, M = RECON_DAYS.c, RECON_MONTHS.c  # noqa: N806 - table columns
    ins = insert_for(conn, RECON_DAYS)
    rows = [dict(stripe_customer_id=fit(D.stripe_customer_id, d.stripe_customer_id),
                 meter=d.meter, day=d.day, formula=fit(D.formula, d.formula), ours=d.ours,
                 stripe=d.stripe, compared_at=at, run_id=run_id) for d in days]
    conn.execute(ins.on_conflict_do_update(
        index_elements=[D.stripe_customer_id, D.meter, D.day],
        set_={c: ins.excluded[c] for c in ("formula", "ours", "stripe", "compared_at",
                                            "run_id")}), rows)
    by_month: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for r in rows:
        by_month[r["day"][:7]].add((r["stripe_customer_id"], r["meter"]))
    for month, pairs in sorted(by_month.items()):
        listed = sorted(pairs)
        for i in range(0, len(listed), 500):
            chunk = listed[i:i + 500]
            conn.execute(delete(RECON_MONTHS).where(
                M.month == month, tuple_(M.stripe_customer_id, M.meter).in_(chunk)))
            # The month's days of these pairs: a range of the primary key for each pair.
            conn.execute(insert(RECON_MONTHS).from_select(
                ["stripe_customer_id", "meter", "month", "ours", "stripe", "days",
                 "compared_at"],
                select(D.stripe_customer_id, D.meter, literal(month), int_sum(D.ours),
                       func.sum(D.stripe), func.count(), func.max(D.compared_at))
                .where(tuple_(D.stripe_customer_id, D.meter).in_(chunk),
                       D.day >= f"{month}-01", D.day <= f"{month}-31")
                .group_by(D.stripe_customer_id, D.meter)))
    # Every customer of each (meter, day) touched, added up again: the days' ids by day
    # (``ix_reconciled_days_day``), the meter among them.
    MD = RECON_METER_DAYS.c  # noqa: N806 - table columns
    touched = sorted({(r["meter"], r["day"]) for r in rows})
    conn.execute(delete(RECON_METER_DAYS).where(tuple_(MD.meter, MD.day).in_(touched)))
    conn.execute(insert(RECON_METER_DAYS).from_select(
        ["meter", "day", "ours", "stripe", "customer_days", "compared_at"],
        select(D.meter, D.day, int_sum(D.ours), func.sum(D.stripe), func.count(),
               func.max(D.compared_at))
        .where(D.day.in_(sorted({day for _meter, day in touched})),
               tuple_(D.meter, D.day).in_(touched))
        .group_by(D.meter, D.day)))


def last_run_started(conn: Connection, *, trigger: str | None = None) -> datetime | None:
    """When the last reconciliation (of ``trigger``, if given) started."""
    stmt = select(func.max(RECON_RUNS.c.started_at))
    if trigger is not None:
        stmt = stmt.where(RECON_RUNS.c.trigger == trigger)
    return as_utc(conn.execute(stmt).scalar())


def next_scheduled(conn: Connection, interval_seconds: float, *, now: datetime
                   ) -> datetime | None:
    """When the next scheduled reconciliation is due: ``interval_seconds`` after the last
    scheduled one started (``now`` if that is past or none has run: the scheduler starts it
    within a minute); None when it runs only when asked (an interval of 0)."""
    if interval_seconds <= 0:
        return None
    last = last_run_started(conn, trigger="schedule")
    due = now if last is None else last + timedelta(seconds=interval_seconds)
    return max(due, now)


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else float(value)
