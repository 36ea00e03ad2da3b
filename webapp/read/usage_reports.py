"""Prepared usage reports: every tenant's usage over a long period, summed once when someone
asks for it and kept, exact as of that moment.

Usage over a period is a sum per tenant and meter of every source :mod:`usage_sources` names.
For a month that is quick; for a year of 100,000 tenants it is 600,000 rows grouped into
200,000, seconds of work that no index can shorten, since the page sorts and totals them all.
So the Tenants & usage page shows periods longer than :data:`LIVE_DAYS` from a report: a
person presses "Prepare the report" (a POST: a page view never writes), the figures are
summed in one snapshot (the same :func:`~usage_sources.per_row` the live page and the
``usage`` command read) and stored a row per tenant and meter; from then on the page sorts,
filters, pages and totals the stored rows, and says the moment they are exact as of. Reports
are kept :data:`KEEP` long; preparing a period again replaces its older report.

The ``usage`` command and :func:`webapp.read.tenants.tenant_usage` stay live: they are
exact at the moment they run.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any, cast

from sqlalchemy import Connection, Engine, Table, delete, func, insert, literal, select

from ..models import REPORT_STATUSES, UsageReport, UsageReportRow
from ..outbox.sql import TENANTS
from .usage_sources import USAGE_STATUSES, as_stored, many_rows, per_row, period_bounds

REPORTS = cast(Table, UsageReport.__table__)
REPORT_ROWS = cast(Table, UsageReportRow.__table__)
#: A report's figure columns, in the page's order.
FIGURES = [f"{s}_{w}" for s in USAGE_STATUSES for w in ("events", "units")]
assert REPORT_STATUSES == USAGE_STATUSES, "a report keeps every column of the usage table"

#: The longest period the page sums live (every tenant); a longer one is read from a report.
#: Every quick period (this month, the last 7 or 30 days, last month) is live.
LIVE_DAYS = 31
#: How long a report is kept after it was prepared.
KEEP = timedelta(days=7)
#: A report of the same period prepared this recently is returned instead of another (two
#: people pressing the button at once).
REUSE = timedelta(seconds=10)


@dataclass(frozen=True)
class Report:
    """A prepared report: its period, the moment its figures are exact as of, its size, how
    long summing took, and who asked."""

    id: int
    start: date
    end: date
    as_of: datetime
    rows: int
    seconds: float
    prepared_by: str


def from_report(start: date, end: date, tenant_id: str | None = None) -> bool:
    """Whether the page reads the period from a report: every tenant over more than
    :data:`LIVE_DAYS` days (one tenant's usage is always live)."""
    return tenant_id is None and (end - start).days + 1 > LIVE_DAYS


def _report(row: Any) -> Report:
    return Report(int(row.id), date.fromisoformat(row.period_start),
                  date.fromisoformat(row.period_end), row.as_of, int(row.rows),
                  float(row.seconds), row.prepared_by)


def newest(conn: Connection, start: date, end: date) -> Report | None:
    """The period's newest report, if one is kept."""
    row = conn.execute(select(REPORTS).where(
        REPORTS.c.period_start == start.isoformat(), REPORTS.c.period_end == end.isoformat())
        .order_by(REPORTS.c.as_of.desc(), REPORTS.c.id.desc()).limit(1)).first()
    return _report(row) if row is not None else None


def report_by_id(conn: Connection, report_id: int) -> Report | None:
    row = conn.execute(select(REPORTS).where(REPORTS.c.id == report_id)).first()
    return _report(row) if row is not None else None


def rows_of(report_id: int, *, names: bool) -> Any:
    """A report's rows as :func:`~usage_sources.per_row` gives them: tenant, meter, a units
    and an events column per status, and (with ``names``) the tenant's name and customer as
    they are now."""
    figures = [REPORT_ROWS.c[c] for c in FIGURES]
    if not names:
        return select(REPORT_ROWS.c.tenant_id, REPORT_ROWS.c.meter, *figures).where(
            REPORT_ROWS.c.report_id == report_id)
    return (select(REPORT_ROWS.c.tenant_id, REPORT_ROWS.c.meter, *figures, TENANTS.c.name,
                   TENANTS.c.stripe_customer_id)
            .select_from(REPORT_ROWS.outerjoin(
                TENANTS, TENANTS.c.tenant_id == REPORT_ROWS.c.tenant_id))
            .where(REPORT_ROWS.c.report_id == report_id))


def prepare(engine: Engine, start: date, end: date, *, now: datetime, actor: str) -> Report:
    """Sum every tenant's usage over ``start``…``end`` (UTC days) in one snapshot and keep it
    as a report exact as of ``now``; then drop the period's older reports and every report
    older than :data:`KEEP`. A report of the period prepared within :data:`REUSE` is returned
    instead. Raises ``ValueError`` for a period that ends before it starts."""
    period_bounds(start, end)
    t0 = time.perf_counter()
    with _snapshot_for_writing(engine) as conn:
        recent = newest(conn, start, end)
        if recent is not None and recent.as_of >= now - REUSE:
            return recent
        report_id = int(conn.execute(insert(REPORTS).values(
            period_start=start.isoformat(), period_end=end.isoformat(), as_of=now, rows=0,
            seconds=0.0, prepared_by=actor).returning(REPORTS.c.id)).scalar_one())
        n = _store_rows(conn, report_id, start, end)
        seconds = time.perf_counter() - t0
        conn.execute(REPORTS.update().where(REPORTS.c.id == report_id)
                     .values(rows=n, seconds=seconds))
    # Apart, after the new report is in: a reader of an old one is never left without one,
    # and two people preparing at once both delete without either's snapshot failing.
    with engine.begin() as conn:
        conn.execute(delete(REPORTS).where(
            ((REPORTS.c.period_start == start.isoformat())
             & (REPORTS.c.period_end == end.isoformat()) & (REPORTS.c.id < report_id))
            | (REPORTS.c.as_of < now - KEEP)))
    return Report(report_id, start, end, now, n, seconds, actor)


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
    per = per_row(conn, start, end, names=False).subquery()
    columns = ["report_id", "tenant_id", "meter", *FIGURES]
    source = select(literal(report_id).label("report_id"),
                    as_stored(conn, per.c.tenant_id).label("tenant_id"),
                    as_stored(conn, per.c.meter).label("meter"), *[per.c[c] for c in FIGURES])
    conn.execute(insert(REPORT_ROWS).from_select(columns, source))
    return int(conn.execute(select(func.count()).select_from(REPORT_ROWS).where(
        REPORT_ROWS.c.report_id == report_id)).scalar_one())


__all__ = ["KEEP", "LIVE_DAYS", "REUSE", "Report", "from_report", "newest", "prepare",
           "report_by_id", "rows_of"]
