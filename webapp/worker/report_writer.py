"""Preparing usage reports: every tenant's usage over a period summed in one snapshot and
kept a row per tenant, customer and meter (what they are, and how the page reads them:
:mod:`webapp.read.usage_reports`). A person's POST from Tenants & usage, or the usage
reporter for the quick periods at many tenants; a page view never prepares one."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date, datetime

from sqlalchemy import Connection, Engine, delete, func, insert, literal, select, text

from ..db import reading
from ..outbox.sql import int_sum
from ..read.usage_reports import (
    FIGURES,
    KEEP,
    REFRESH,
    REFRESH_CLOSED,
    REPORT_ROWS,
    REPORTS,
    REUSE,
    SCHEDULE,
    Report,
    many_tenants,
    newest,
    quick_periods,
    report_by_id,
)
from ..read.usage_sources import as_stored, many_rows, per_row, period_bounds


class ReportBusy(Exception):
    """Another report is being prepared right now (on PostgreSQL one at a time: each sums
    hundreds of thousands of rows, and several at once would take every core)."""


#: The transaction-scoped advisory lock one preparation holds (PostgreSQL; a two-key lock,
#: apart from the lanes' one-key locks). Advisory locks are the server's, not a schema's: the
#: second key is the outbox's schema, so two outboxes on one server (a staging copy beside
#: production) do not wait for each other.
_LOCK = text("SELECT pg_try_advisory_xact_lock(8463, hashtext(current_schema()))")


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


__all__ = ["ReportBusy", "keep_quick_periods", "prepare"]
