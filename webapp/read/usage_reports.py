"""Prepared usage reports: every tenant's usage over a long period, summed once when someone
asks for it and kept, exact as of that moment.

Usage over a period is a sum per tenant and meter of every source :mod:`usage_sources` names.
For a year of 100,000 tenants it is 600,000 rows grouped into 200,000, seconds of work that no
index can shorten, since the page sorts and totals them all (a month: about a second).
So the Tenants & usage page shows periods longer than :data:`LIVE_DAYS` from a report: a
person presses "Prepare the report" (a POST: a page view never writes), the figures are
summed in one snapshot (the same :func:`~usage_sources.per_row` the live page and the
``usage`` command read) and stored a row per tenant and meter; from then on the page sorts,
filters, pages and totals the stored rows, and says the moment they are exact as of. Reports
are kept :data:`KEEP` long; preparing a period again replaces its older report. At many
tenants the usage reporter (``webapp.worker.reporter``) keeps the quick periods prepared too
(:func:`keep_quick_periods`), and the page reads them from their reports while fresh
(:func:`shown_report`).

The ``usage`` command and :func:`webapp.read.tenants.tenant_usage` stay live: they are
exact at the moment they run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any, cast

from sqlalchemy import Connection, Engine, Table, delete, func, insert, literal, select, text

from ..db import reading
from ..models import REPORT_STATUSES, UsageReport, UsageReportRow
from ..outbox.sql import SENT_MONTHLY, int_sum
from .usage_sources import USAGE_STATUSES, as_stored, many_rows, per_row, period_bounds

REPORTS = cast(Table, UsageReport.__table__)
REPORT_ROWS = cast(Table, UsageReportRow.__table__)
#: A report's figure columns, in the page's order.
FIGURES = [f"{s}_{w}" for s in USAGE_STATUSES for w in ("events", "units")]
assert REPORT_STATUSES == USAGE_STATUSES, "a report keeps every column of the usage table"

#: The longest period the page may sum live (every tenant); a longer one is always read from
#: a report. Every quick period (this month, the last 7 or 30 days, last month) is this long
#: or shorter.
LIVE_DAYS = 31
#: How long a report is kept after it was prepared.
KEEP = timedelta(days=7)
#: A report of the same period prepared this recently is returned instead of another (two
#: people pressing the button at once).
REUSE = timedelta(seconds=10)
#: At many tenants a month is slow to sum too (a second at 100,000 tenants): the reporter
#: keeps the page's quick periods prepared, each at most :data:`REFRESH` old, and the page
#: reads a period of :data:`LIVE_DAYS` or fewer from its report when it is younger than
#: :data:`STANDING_AGE` (else it sums live).
REFRESH = timedelta(minutes=5)
STANDING_AGE = timedelta(minutes=15)
#: A closed period (last month) changes only when an old event changes status: its report
#: is brought up to date every hour, and stands in for the live sum for three.
REFRESH_CLOSED = timedelta(hours=1)
STANDING_AGE_CLOSED = timedelta(hours=3)
#: "Many tenants": this many tenant × meter rows of sent usage this month and last.
STANDING_FROM_ROWS = 20_000
#: Who prepared a report the reporter keeps.
SCHEDULE = "schedule"


class ReportBusy(Exception):
    """Another report is being prepared right now (on PostgreSQL one at a time: each sums
    hundreds of thousands of rows, and several at once would take every core)."""


#: The transaction-scoped advisory lock one preparation holds (PostgreSQL; a two-key lock,
#: apart from the lanes' one-key locks). Advisory locks are the server's, not a schema's: the
#: second key is the outbox's schema, so two outboxes on one server (a staging copy beside
#: production) do not wait for each other.
_LOCK = text("SELECT pg_try_advisory_xact_lock(8463, hashtext(current_schema()))")


@dataclass(frozen=True)
class Report:
    """A prepared report: its period, the moment its figures are exact as of, its size, how
    long summing took, who asked, and the period's totals (figure column -> sum)."""

    id: int
    start: date
    end: date
    as_of: datetime
    rows: int
    seconds: float
    prepared_by: str
    totals: dict[str, int]
    #: The totals per meter (figure column -> sum, by meter).
    meter_totals: dict[str, dict[str, int]] = field(default_factory=dict)


def from_report(start: date, end: date, tenant_id: str | None = None) -> bool:
    """Whether the page reads the period from a report: every tenant over more than
    :data:`LIVE_DAYS` days (one tenant's usage is always live)."""
    return tenant_id is None and (end - start).days + 1 > LIVE_DAYS


def quick_periods(today: date) -> list[tuple[str, date, date]]:
    """The Tenants & usage page's quick periods: name, first and last day."""
    last_month_end = today.replace(day=1) - timedelta(days=1)
    return [("This month", today.replace(day=1), today),
            ("Last 7 days", today - timedelta(days=6), today),
            ("Last 30 days", today - timedelta(days=29), today),
            ("Last month", last_month_end.replace(day=1), last_month_end)]


def shown_report(conn: Connection, start: date, end: date, *,
                 now: datetime) -> tuple[bool, Report | None]:
    """Whether the page reads the period from a report, and the report (None: none yet).
    A long period always does; a shorter one when its newest report is younger than
    :data:`STANDING_AGE` (:data:`STANDING_AGE_CLOSED` for a period that has ended): the
    reporter's, at many tenants, or one a person prepared."""
    report = newest(conn, start, end)
    if from_report(start, end):
        return True, report
    age = STANDING_AGE if end >= now.date() else STANDING_AGE_CLOSED
    if report is not None and report.as_of >= now - age:
        return True, report
    return False, None


def many_tenants(conn: Connection, today: date) -> bool:
    """Whether this month and last hold :data:`STANDING_FROM_ROWS` tenant × meter rows of
    sent usage (a bounded count of the monthly rollup's keys)."""
    months = [today.strftime("%Y-%m"), (today.replace(day=1) - timedelta(days=1)).strftime(
        "%Y-%m")]
    found = select(SENT_MONTHLY.c.tenant_id).where(SENT_MONTHLY.c.month.in_(months)).limit(
        STANDING_FROM_ROWS).subquery()
    n = conn.execute(select(func.count()).select_from(found)).scalar_one()
    return int(n) >= STANDING_FROM_ROWS


def keep_quick_periods(engine: Engine, *, now: datetime) -> list[Report]:
    """At many tenants, prepare each quick period whose newest report is older than
    :data:`REFRESH` (:data:`REFRESH_CLOSED` for last month) (several reporters share the
    work: a report another prepared meanwhile is not made again); the reports prepared."""
    today = now.date()
    with reading(engine) as conn:
        if not many_tenants(conn, today):
            return []
        due = [(a, b) for _, a, b in quick_periods(today)
               if (r := newest(conn, a, b)) is None
               or r.as_of < now - (REFRESH if b >= today else REFRESH_CLOSED)]
    made = []
    for a, b in due:
        try:
            made.append(prepare(engine, a, b, now=now, actor=SCHEDULE))
        except ReportBusy:
            break  # a person's report first; the rest at the next turn
    return made


def _report(row: Any) -> Report:
    by_meter = json.loads(row.meter_totals) if row.meter_totals else {}
    return Report(int(row.id), date.fromisoformat(row.period_start),
                  date.fromisoformat(row.period_end), row.as_of, int(row.rows),
                  float(row.seconds), row.prepared_by,
                  {c: int(row._mapping[f"total_{c}"]) for c in FIGURES},
                  {str(m): {c: int(v.get(c, 0)) for c in FIGURES} for m, v in by_meter.items()})


def newest(conn: Connection, start: date, end: date) -> Report | None:
    """The period's newest report, if one is kept."""
    row = conn.execute(select(REPORTS).where(
        REPORTS.c.period_start == start.isoformat(), REPORTS.c.period_end == end.isoformat())
        .order_by(REPORTS.c.as_of.desc(), REPORTS.c.id.desc()).limit(1)).first()
    return _report(row) if row is not None else None


def report_by_id(conn: Connection, report_id: int) -> Report | None:
    row = conn.execute(select(REPORTS).where(REPORTS.c.id == report_id)).first()
    return _report(row) if row is not None else None


def rows_of(report_id: int) -> Any:
    """A report's rows as :func:`~usage_sources.per_row` gives them: tenant, meter, the
    customer the usage went to, a units and an events column per status, and the tenant's
    name when it was prepared."""
    r = REPORT_ROWS
    return select(r.c.tenant_id, r.c.meter, customer_of(r), *[r.c[c] for c in FIGURES],
                  r.c.name).where(r.c.report_id == report_id)


def customer_of(rows: Any) -> Any:
    """A report row's customer as the live rows give it (None, not ``""``, for none)."""
    return func.nullif(rows.c.stripe_customer_id, "").label("stripe_customer_id")


def prepare(engine: Engine, start: date, end: date, *, now: datetime, actor: str) -> Report:
    """Sum every tenant's usage over ``start``…``end`` (UTC days) in one snapshot and keep it
    as a report exact as of ``now``; then drop the period's older reports and every report
    older than :data:`KEEP`. A report of the period prepared within :data:`REUSE` is returned
    instead. Raises ``ValueError`` for a period that ends before it starts, and
    :class:`ReportBusy` while another report is being prepared (PostgreSQL; SQLite's writers
    take turns anyway)."""
    period_bounds(start, end)
    t0 = time.perf_counter()
    with _snapshot_for_writing(engine) as conn:
        if conn.dialect.name == "postgresql" and not conn.execute(_LOCK).scalar_one():
            raise ReportBusy("another report is being prepared")
        recent = newest(conn, start, end)
        if recent is not None and recent.as_of >= now - REUSE:
            return recent
        report_id = int(conn.execute(insert(REPORTS).values(
            period_start=start.isoformat(), period_end=end.isoformat(), as_of=now, rows=0,
            seconds=0.0, prepared_by=actor, **{f"total_{c}": 0 for c in FIGURES})
            .returning(REPORTS.c.id)).scalar_one())
        n = _store_rows(conn, report_id, start, end)
        seconds = time.perf_counter() - t0
        conn.execute(REPORTS.update().where(REPORTS.c.id == report_id)
                     .values(rows=n, seconds=seconds))
        done = report_by_id(conn, report_id)
        assert done is not None
    # Apart, after the new report is in: a reader of an old one is never left without one,
    # and two people preparing at once both delete without either's snapshot failing.
    with engine.begin() as conn:
        conn.execute(delete(REPORTS).where(
            ((REPORTS.c.period_start == start.isoformat())
             & (REPORTS.c.period_end == end.isoformat()) & (REPORTS.c.id < report_id))
            | (REPORTS.c.as_of < now - KEEP)))
        if conn.dialect.name == "postgresql":
            # The planner's row counts for the new report (a fresh table's or id's are
            # guesses), so its pages are read in index order.
            conn.exec_driver_sql("ANALYZE usage_report_rows")
    return done


@contextmanager
def _snapshot_for_writing(engine: Engine) -> Iterator[Connection]:
    """One transaction whose reads all see one snapshot, and that can write: PostgreSQL's
    ``REPEATABLE READ`` (the rollup's mark and the rows past it must be read at one moment,
    or a fold between them would count its rows twice). SQLite's transactions see one
    snapshot already."""
    with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
        with conn.begin():
            yield conn


def _store_rows(conn: Connection, report_id: int, start: date, end: date) -> int:
    """Sum the period into the report's rows; return how many."""
    many_rows(conn)
    per = per_row(conn, start, end).subquery()
    columns = ["report_id", "tenant_id", "stripe_customer_id", "meter", *FIGURES,
               "waiting_events", "name"]
    source = select(literal(report_id).label("report_id"),
                    as_stored(conn, per.c.tenant_id).label("tenant_id"),
                    func.coalesce(per.c.stripe_customer_id, "").label("stripe_customer_id"),
                    as_stored(conn, per.c.meter).label("meter"), *[per.c[c] for c in FIGURES],
                    (per.c.pending_events + per.c.retrying_events).label("waiting_events"),
                    per.c.name)
    conn.execute(insert(REPORT_ROWS).from_select(columns, source))
    mine = REPORT_ROWS.c.report_id == report_id
    got = conn.execute(select(REPORT_ROWS.c.meter, func.count().label("n"), *[
        int_sum(REPORT_ROWS.c[c]).label(c) for c in FIGURES]).where(mine)
        .group_by(REPORT_ROWS.c.meter)).all()
    by_meter = {str(g.meter): {c: int(g._mapping[c]) for c in FIGURES} for g in got}
    conn.execute(REPORTS.update().where(REPORTS.c.id == report_id).values(
        meter_totals=json.dumps(by_meter),
        **{f"total_{c}": sum(m[c] for m in by_meter.values()) for c in FIGURES}))
    return sum(int(g.n) for g in got)


__all__ = ["KEEP", "LIVE_DAYS", "REFRESH", "REUSE", "SCHEDULE", "STANDING_AGE", "Report",
           "ReportBusy",
           "from_report", "keep_quick_periods", "many_tenants", "newest", "prepare",
           "quick_periods", "report_by_id", "rows_of", "shown_report"]
