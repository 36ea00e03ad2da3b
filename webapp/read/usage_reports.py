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
tenants the usage reporter (``webapp.worker.reporter``) keeps the quick periods prepared too,
and the page reads them from their reports while fresh (:func:`shown_report`). This module
only reads them; preparing one (a write) is :mod:`webapp.worker.report_writer`.

The ``usage`` command and :func:`webapp.read.tenants.tenant_usage` stay live: they are
exact at the moment they run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any, cast

from sqlalchemy import Connection, Table, func, select

from ..models import REPORT_STATUSES, UsageReport, UsageReportRow
from ..outbox.sql import SENT_MONTHLY
from .usage_sources import USAGE_STATUSES

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


__all__ = ["FIGURES", "KEEP", "LIVE_DAYS", "REFRESH", "REFRESH_CLOSED", "REPORTS", "REUSE",
           "SCHEDULE", "STANDING_AGE", "Report", "from_report", "many_tenants", "newest",
           "quick_periods", "report_by_id", "rows_of", "shown_report"]
