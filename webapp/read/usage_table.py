"""The Tenants & usage table at any number of tenants: one page of tenant × meter rows, sorted
and filtered in the database, with the period's totals; and every row of it for the CSV,
streamed.

The numbers are :func:`webapp.read.tenants.usage_in`'s: both read the rows per tenant × meter
of :func:`webapp.read.usage_sources.per_row`; this module sorts, filters, pages and totals
them in SQL. At 100,000 tenants the page reads every row of the period once (the totals need
them all) and sends 50 to the browser; no statement carries one parameter per tenant.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    Engine,
    String,
    func,
    literal,
    null,
    or_,
    select,
    union_all,
)
from sqlalchemy import cast as sql_cast

from ..db import reading
from ..outbox.sql import (
    TENANTS,
    as_utc,
    ascii_icontains,
    int_sum,
)
from ..status import PROCESSING
from .compared import compared_for, compared_of, meter_totals
from .counts import Freshness, UnmappedTenant, rollup_freshness
from .mappings import waiting_for_customer
from .reconciliation import RunSummary, last_run
from .search import prefix_range
from .tenants import UsageRow, usage_rows, usage_select, with_own_comparison
from .usage_reports import REPORT_ROWS, Report, customer_of, report_by_id, rows_of, shown_report
from .usage_sources import (
    USAGE_STATUSES,
    as_stored,
    bytewise,
    many_rows,
    per_row,
    period_bounds,
)

#: The orders the table can be sorted in: key -> what it sorts by (ties: tenant, then meter).
SORTS = ("tenant", "sent_units", "sent_events", "waiting_events", "dead_events")
#: Filters that keep only some rows: dead events, events waiting to be sent, no customer.
ONLY = ("dead", "waiting", "unmapped")
#: Rows on one page.
PER_PAGE = 50


@dataclass(frozen=True)
class UsageQuery:
    """Which page of the table: the period (UTC days, inclusive), the order, the filter."""

    start: date
    end: date
    sort: str = "tenant"
    descending: bool = False
    text: str = ""            # a tenant id's start, part of its name, or a customer's start
    only: str = ""            # one of ONLY, or "" for every row
    page: int = 1
    per_page: int = PER_PAGE

    def filtered(self) -> bool:
        return bool(self.text or self.only)


@dataclass(frozen=True)
class UsageTable:
    """One page of rows, how many rows match, and the totals per meter (units of different
    meters are never added together): of the whole period (every tenant) and of the rows
    that match the filter."""

    query: UsageQuery
    rows: list[UsageRow]
    period_rows: int          # tenant × customer × meter rows in the period
    matching: int             # of those, the rows that match the filter
    period_totals: dict[str, UsageRow]
    matching_totals: dict[str, UsageRow]
    #: What reconciliation compared of the period, per meter (every customer): Stripe's
    #: figure, ours then, customer-days (:func:`~.compared.meter_totals`).
    compared_totals: dict[str, tuple[float, int, int]] = field(default_factory=dict)

    @property
    def pages(self) -> int:
        return max(1, -(-self.matching // self.query.per_page))


def _columns() -> list[str]:
    return [f"{s}_{what}" for s in USAGE_STATUSES for what in ("events", "units")]


def _sort_key(u: Any, sort: str, conn: Connection) -> ColumnElement[Any]:
    if sort == "tenant":
        return bytewise(conn, u.c.tenant_id)  # type: ignore[no-any-return]
    if sort == "waiting_events":
        return u.c.pending_events + u.c.retrying_events  # type: ignore[no-any-return]
    return u.c[sort]  # type: ignore[no-any-return]


def _filter(u: Any, query: UsageQuery, waiting: Any = None, *,
            stored: bool = False) -> list[ColumnElement[bool]]:
    """``query``'s filter over the rows ``u`` (``waiting``: their waiting events, when a
    column holds them; ``stored``: a report's rows, whose "no customer" is ``""``)."""
    where: list[ColumnElement[bool]] = []
    if query.text:
        where.append(or_(prefix_range(u.c.tenant_id, query.text),
                         ascii_icontains(u.c.name, query.text),
                         prefix_range(u.c.stripe_customer_id, query.text)))
    if query.only == "dead":
        where.append(u.c.dead_events > 0)
    elif query.only == "waiting":
        where.append((u.c.pending_events + u.c.retrying_events if waiting is None
                      else waiting) > 0)
    elif query.only == "unmapped":
        where.append(u.c.stripe_customer_id == "" if stored
                     else u.c.stripe_customer_id.is_(None))
    return where


def _row(m: Any) -> UsageRow:
    """A row of the page's statement as a ``UsageRow`` (a meter's totals row: no tenant,
    customer or name), with what was compared of it when the statement read that."""
    r = (UsageRow(m["tenant_id"], m["meter"], m["name"], m["stripe_customer_id"])
         if m["tenant_id"] is not None else UsageRow("", m["meter"] or ""))
    for s in USAGE_STATUSES:
        r.events[s] = int(m[f"{s}_events"] or 0)
        r.quantity[s] = int(m[f"{s}_units"] or 0)
    if m.get("compared_days"):
        r.stripe_units, r.compared_units = float(m["stripe_units"]), int(m["compared_units"])
        r.compared_days, r.compared_at = int(m["compared_days"]), as_utc(m["compared_at"])
    return r


def _compared_rows(conn: Connection, page: Sequence[Any], query: UsageQuery) -> list[UsageRow]:
    """A page's rows, each with what was compared of it over the period (read for the page's
    rows only: a few primary-key ranges, whatever the number of customers)."""
    compared = compared_of(conn, [(m["stripe_customer_id"], m["meter"]) for m in page],
                           query.start, query.end)
    return [_row({**m, **compared.get((m["stripe_customer_id"], m["meter"]), {})})
            for m in page]


def _by_meter(rows: Any) -> dict[str, UsageRow]:
    """Totals rows (one per meter) by meter, in the meters' order."""
    return {t.meter: t for t in sorted((_row(m) for m in rows), key=lambda t: t.meter)}


@dataclass(frozen=True)
class TenantsPage:
    query: UsageQuery
    #: None when the period is read from a report and none has been prepared.
    table: UsageTable | None
    unmapped: list[UnmappedTenant]
    unmapped_total: int
    freshness: Freshness
    #: Whether the period is read from a report (longer than a month), and the report.
    from_report: bool = False
    report: Report | None = None
    #: The last reconciliation (where Stripe's figures come from), if any ran.
    reconciled: RunSummary | None = None


def tenants_page(engine: Engine, query: UsageQuery, *, now: datetime,
                 margin: timedelta) -> TenantsPage:
    """The tenants page, in one snapshot: a page of the period's usage (summed live, or read
    from the period's report as :func:`~usage_reports.shown_report` says: no table if the
    period needs one and has none), the tenants waiting longest for a customer (and how
    many wait), and how fresh the rollups are."""
    with reading(engine) as conn:
        many_rows(conn)
        prepared, report = shown_report(conn, query.start, query.end, now=now)
        table = (report_table(conn, query, report) if report is not None
                 else None if prepared else usage_table(conn, query))
        unmapped, total = waiting_for_customer(conn)
        return TenantsPage(query, table, unmapped, total,
                           rollup_freshness(conn, now=now, margin=margin), prepared, report,
                           last_run(conn))


def usage_table(conn: Connection, query: UsageQuery) -> UsageTable:
    """One page of the period's usage, sorted and filtered by ``query``, with the totals per
    meter of the whole period and of the matching rows, in one statement: the rows per
    tenant, customer and meter are computed once (a materialised CTE), then read three times
    (the page, the period's totals, the matching rows' totals). Raises ``ValueError`` for a
    period that ends before it starts, an unknown sort or filter."""
    if query.sort not in SORTS or (query.only and query.only not in ONLY):
        raise ValueError("unknown sort or filter")
    # Names are joined to the page's rows only, unless the filter needs them for every row
    # (at 100,000 tenants the join of every row cost a third of the page).
    names = bool(query.text)
    per = per_row(conn, query.start, query.end, names=names).cte("usage_rows")
    key = _sort_key(per, query.sort, conn)
    where = _filter(per, query)
    figures = [per.c[c] for c in _columns()]
    sums = [int_sum(per.c[c]).label(c) for c in _columns()]
    none = [null().label(c) for c in ("sort_key", "tenant_id")]
    order = [key.desc() if query.descending else key.asc()]
    if query.sort != "tenant":
        order.append(bytewise(conn, per.c.tenant_id).asc())
    # Rows without a customer before the others, as a report's ("" for none) sort.
    order += [bytewise(conn, per.c.meter).asc(),
              func.coalesce(per.c.stripe_customer_id, "").asc()]
    name = per.c.name if names else sql_cast(null(), String).label("name")
    page = (select(literal(2).label("part"), key.label("sort_key"), per.c.tenant_id,
                   per.c.meter, per.c.stripe_customer_id, name,
                   sql_cast(null(), BigInteger).label("n"), *figures)
            .where(*where).order_by(*order).limit(query.per_page)
            .offset((query.page - 1) * query.per_page).subquery())
    if not names:
        page = (select(page.c.part, page.c.sort_key, page.c.tenant_id, page.c.meter,
                       page.c.stripe_customer_id, TENANTS.c.name, page.c.n,
                       *[page.c[c] for c in _columns()])
                .select_from(page.outerjoin(TENANTS, TENANTS.c.tenant_id == as_stored(
                    conn, page.c.tenant_id)))
                .subquery())
    # The page first: its columns' types are the union's (PostgreSQL types the NULLs of the
    # totals' rows from it). The totals: a row per meter.
    blank = [null().label(c) for c in ("stripe_customer_id", "name")]
    parts = union_all(
        select(page),
        select(literal(0).label("part"), *none, per.c.meter, *blank, func.count().label("n"),
               *sums).group_by(per.c.meter),
        select(literal(1).label("part"), *none, per.c.meter, *blank, func.count().label("n"),
               *sums).where(*where).group_by(per.c.meter),
    ).subquery()
    last = bytewise(conn, parts.c.sort_key) if query.sort == "tenant" else parts.c.sort_key
    got = conn.execute(select(parts).order_by(
        parts.c.part, last.desc() if query.descending else last.asc(),
        bytewise(conn, parts.c.tenant_id), bytewise(conn, parts.c.meter),
        func.coalesce(parts.c.stripe_customer_id, ""))).mappings().all()
    everything = [m for m in got if m["part"] == 0]
    matching = [m for m in got if m["part"] == 1]
    rows = [m for m in got if m["part"] == 2]
    return UsageTable(query, _compared_rows(conn, rows, query),
                      sum(int(m["n"]) for m in everything),
                      sum(int(m["n"]) for m in matching), _by_meter(everything),
                      _by_meter(matching), meter_totals(conn, query.start, query.end))


def report_table(conn: Connection, query: UsageQuery, report: Report) -> UsageTable:
    """:func:`usage_table` of a prepared report: the same page, order, filter and totals,
    read from its stored rows (names as they were when it was prepared). The page is read in
    the order of an index (by tenant, or a figure largest first: the defaults), so it reads
    50 rows, not 200,000; the period's totals are the report's own; only a filter sums the
    rows it matches."""
    if query.sort not in SORTS or (query.only and query.only not in ONLY):
        raise ValueError("unknown sort or filter")
    r = REPORT_ROWS
    where = [r.c.report_id == report.id, *_filter(r, query, r.c.waiting_events, stored=True)]
    key = r.c.tenant_id if query.sort == "tenant" else r.c[query.sort]
    order = [key.desc() if query.descending else key.asc()]
    if query.sort != "tenant":
        order.append(r.c.tenant_id.asc())
    order += [r.c.meter.asc(), r.c.stripe_customer_id.asc()]
    # The page's rows keep their order through the join: their place in it, numbered.
    rows = (select(r.c.tenant_id, r.c.meter, r.c.name, customer_of(r),
                   *[r.c[c] for c in _columns()], func.row_number().over(order_by=order)
                   .label("place")).where(*where).order_by(*order)
            .limit(query.per_page).offset((query.page - 1) * query.per_page).subquery())
    page = _compared_rows(conn, conn.execute(select(rows).order_by(rows.c.place))
                          .mappings().all(), query)
    everything = {m: _row({"tenant_id": None, "meter": m, **t})
                  for m, t in sorted(report.meter_totals.items())}
    totals = meter_totals(conn, query.start, query.end)
    if not query.filtered():
        return UsageTable(query, page, report.rows, report.rows, everything, everything,
                          totals)
    got = conn.execute(select(r.c.meter, func.count().label("n"), *[
        int_sum(r.c[c]).label(c) for c in _columns()]).where(*where)
        .group_by(r.c.meter)).mappings().all()
    matching = _by_meter([{"tenant_id": None, **m} for m in got])
    return UsageTable(query, page, report.rows, sum(int(m["n"]) for m in got), everything,
                      matching, totals)


def usage_rows_streamed(engine: Engine, *, start: date, end: date,
                        tenant_id: str | None = None,
                        in_flight_apart: bool = False) -> Iterator[UsageRow]:
    """Every tenant × meter row of the period, by tenant then meter, read a thousand at a
    time in one snapshot (the CSV of 100,000 tenants, or the ``usage`` command's JSON, never
    sits in memory whole); events in flight as ``processing`` of their own with
    ``in_flight_apart``, as :func:`~webapp.read.tenants.usage_in` counts them. Raises
    ``ValueError`` for a period that ends before it starts (when first advanced)."""
    statuses = USAGE_STATUSES + ((PROCESSING,) if in_flight_apart else ())
    for part in usage_cells_streamed(engine, start=start, end=end, tenant_id=tenant_id,
                                     in_flight_apart=in_flight_apart):
        yield from usage_rows(part, statuses)


def usage_cells_streamed(engine: Engine, *, start: date, end: date,
                         tenant_id: str | None = None, in_flight_apart: bool = False
                         ) -> Iterator[Sequence[Sequence[Any]]]:
    """:func:`usage_rows_streamed`'s rows as the database gives them, a thousand at a time,
    in :func:`~webapp.read.tenants.usage_select`'s columns (tenant, meter, name, customer,
    events then units per status, then :data:`~.compared.COLUMNS`, all None where nothing
    was compared), for a reader that writes them out without building a ``UsageRow`` each.
    One tenant's rows read what was compared of them alone."""
    period_bounds(start, end)
    statuses = USAGE_STATUSES + ((PROCESSING,) if in_flight_apart else ())
    with reading(engine) as conn:
        if tenant_id is None:
            many_rows(conn)
        per = per_row(conn, start, end, tenant_id, in_flight_apart=in_flight_apart).subquery()
        if tenant_id is None:
            yield from _streamed(conn, per, statuses, compared_for(conn, start, end))
            return
        # One tenant's few rows, with what was compared of them alone.
        yield with_own_comparison(conn, conn.execute(usage_select(conn, per, statuses)).all(),
                                  start, end)


def report_rows_streamed(engine: Engine, report_id: int) -> Iterator[UsageRow]:
    """Every row of report ``report_id``, as :func:`usage_rows_streamed` gives a live
    period's (by tenant then meter, a thousand at a time), with each tenant's name and
    customer as they were when it was prepared."""
    with reading(engine) as conn:
        report = report_by_id(conn, report_id)
        compared = (compared_for(conn, report.start, report.end) if report is not None
                    else None)
        for part in _streamed(conn, rows_of(report_id).subquery(), USAGE_STATUSES, compared):
            yield from usage_rows(part)


def _streamed(conn: Connection, per: Any, statuses: tuple[str, ...],
              compared: Any = None) -> Iterator[Sequence[Sequence[Any]]]:
    """Rows ``per`` by tenant, meter then customer, with what was compared of each (with
    ``compared``), read a thousand at a time."""
    result = conn.execution_options(stream_results=True, yield_per=1000).execute(
        usage_select(conn, per, statuses, compared))
    yield from result.partitions()


__all__ = ["ONLY", "PER_PAGE", "SORTS", "TenantsPage", "UsageQuery", "UsageTable",
           "report_rows_streamed", "report_table", "usage_cells_streamed",
           "usage_rows_streamed", "usage_table"]
