"""The Tenants & usage table at any number of tenants: one page of tenant × meter rows, sorted
and filtered in the database, with the period's totals; and every row of it for the CSV,
streamed.

The numbers are :func:`webapp.read.tenants.usage_in`'s, computed in SQL rather than in Python:
the same sources (:func:`usage_pieces`: the sent rollup, the sent rows past its mark, the
unsent rows, the rows in flight as pending) summed per tenant × meter, then per status. At
100,000 tenants the page reads every row of the period once (the totals need them all) and
sends 50 to the browser; no statement carries one parameter per tenant.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    case,
    func,
    or_,
    select,
    union_all,
)

from ..db import reading
from ..outbox.rollups import SENT_USAGE, Mark, live_sent, read_mark
from ..outbox.sql import (
    IDLE_UNSENT,
    IN_FLIGHT,
    SENT_ROLLUP,
    TENANTS,
    T,
    ascii_icontains,
    int_sum,
    sql_str,
    status_in,
)
from .counts import Freshness, UnmappedTenant, rollup_freshness
from .mappings import waiting_for_customer
from .search import prefix_range
from .tenants import USAGE_STATUSES, UsageRow

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
    """One page of rows, how many rows match, and the totals: of the whole period (every
    tenant) and of the rows that match the filter."""

    query: UsageQuery
    rows: list[UsageRow]
    period_rows: int          # tenant × meter rows in the period
    matching: int             # of those, the rows that match the filter
    period_total: UsageRow
    matching_total: UsageRow

    @property
    def pages(self) -> int:
        return max(1, -(-self.matching // self.query.per_page))


def _bounds(start: date, end: date) -> tuple[datetime, datetime]:
    if end < start:
        raise ValueError("the period ends before it starts")
    lo = datetime(start.year, start.month, start.day, tzinfo=UTC)
    return lo, datetime(end.year, end.month, end.day, tzinfo=UTC) + timedelta(days=1)


def usage_pieces(mark: Mark, start: date, end: date, tenant_id: str | None = None) -> list[Any]:
    """Every source of the period's usage as ``(tenant_id, meter, status, events, quantity)``
    selects, the way ``usage_in`` reads them: sent from the rollup plus the rows past its
    mark, the unsent statuses through ``ix_outbox_unsent``, events in flight as pending."""
    lo, hi = _bounds(start, end)
    span = [T.c.occurred_at >= lo, T.c.occurred_at < hi]
    folded = [SENT_ROLLUP.c.day >= start.isoformat(), SENT_ROLLUP.c.day <= end.isoformat()]
    if tenant_id is not None:
        span.append(T.c.tenant_id == tenant_id)
        folded.append(SENT_ROLLUP.c.tenant_id == tenant_id)
    unsent = status_in(tuple(s for s in USAGE_STATUSES if s != "sent"))
    return [
        select(SENT_ROLLUP.c.tenant_id, SENT_ROLLUP.c.meter, sql_str("sent").label("status"),
               SENT_ROLLUP.c.events.label("events"), SENT_ROLLUP.c.quantity.label("quantity"))
        .where(*folded),
        select(T.c.tenant_id, T.c.meter, sql_str("sent").label("status"),
               func.count().label("events"), int_sum(T.c.quantity).label("quantity"))
        .where(live_sent(mark), *span).group_by(T.c.tenant_id, T.c.meter),
        select(T.c.tenant_id, T.c.meter, T.c.status, func.count().label("events"),
               int_sum(T.c.quantity).label("quantity"))
        .where(unsent, IDLE_UNSENT, *span).group_by(T.c.tenant_id, T.c.meter, T.c.status),
        select(T.c.tenant_id, T.c.meter, sql_str("pending").label("status"),
               func.count().label("events"), int_sum(T.c.quantity).label("quantity"))
        .where(IN_FLIGHT, *span).group_by(T.c.tenant_id, T.c.meter),
    ]


def _per_row(conn: Connection, start: date, end: date, tenant_id: str | None = None) -> Any:
    """The period's usage, one row per tenant × meter, a column per status and figure
    (``<status>_events``, ``<status>_units``), with the tenant's name and customer."""
    both = union_all(*usage_pieces(read_mark(conn, SENT_USAGE), start, end,
                                   tenant_id)).subquery()
    figures = []
    for s in USAGE_STATUSES:
        mine = both.c.status == sql_str(s)
        figures += [int_sum(case((mine, both.c.events), else_=0)).label(f"{s}_events"),
                    int_sum(case((mine, both.c.quantity), else_=0)).label(f"{s}_units")]
    grouped = (select(both.c.tenant_id, both.c.meter, *figures)
               .group_by(both.c.tenant_id, both.c.meter).subquery())
    return (select(grouped, TENANTS.c.name, TENANTS.c.stripe_customer_id)
            .select_from(grouped.outerjoin(TENANTS, TENANTS.c.tenant_id == grouped.c.tenant_id))
            .subquery())


def _columns() -> list[str]:
    return [f"{s}_{what}" for s in USAGE_STATUSES for what in ("events", "units")]


def _sort_key(u: Any, sort: str) -> ColumnElement[Any]:
    if sort == "tenant":
        return u.c.tenant_id  # type: ignore[no-any-return]
    if sort == "waiting_events":
        return u.c.pending_events + u.c.retrying_events  # type: ignore[no-any-return]
    return u.c[sort]  # type: ignore[no-any-return]


def _filter(u: Any, query: UsageQuery) -> list[ColumnElement[bool]]:
    where: list[ColumnElement[bool]] = []
    if query.text:
        where.append(or_(prefix_range(u.c.tenant_id, query.text),
                         ascii_icontains(u.c.name, query.text),
                         prefix_range(u.c.stripe_customer_id, query.text)))
    if query.only == "dead":
        where.append(u.c.dead_events > 0)
    elif query.only == "waiting":
        where.append(u.c.pending_events + u.c.retrying_events > 0)
    elif query.only == "unmapped":
        where.append(u.c.stripe_customer_id.is_(None))
    return where


def _row(m: Any) -> UsageRow:
    r = UsageRow(m["tenant_id"], m["meter"], m["name"], m["stripe_customer_id"])
    for s in USAGE_STATUSES:
        r.events[s] = int(m[f"{s}_events"] or 0)
        r.quantity[s] = int(m[f"{s}_units"] or 0)
    return r


def _total(m: Any, prefix: str) -> UsageRow:
    r = UsageRow("", "")
    if m is not None:
        for s in USAGE_STATUSES:
            r.events[s] = int(m[f"{prefix}{s}_events"] or 0)
            r.quantity[s] = int(m[f"{prefix}{s}_units"] or 0)
    return r


@dataclass(frozen=True)
class TenantsPage:
    table: UsageTable
    unmapped: list[UnmappedTenant]
    unmapped_total: int
    freshness: Freshness


def tenants_page(engine: Engine, query: UsageQuery, *, now: datetime,
                 margin: timedelta) -> TenantsPage:
    """The tenants page, in one snapshot: a page of the period's usage, the tenants waiting
    longest for a customer (and how many wait), and how fresh the rollups are."""
    with reading(engine) as conn:
        table = usage_table(conn, query)
        unmapped, total = waiting_for_customer(conn)
        return TenantsPage(table, unmapped, total,
                           rollup_freshness(conn, now=now, margin=margin))


def usage_table(conn: Connection, query: UsageQuery) -> UsageTable:
    """One page of the period's usage, sorted and filtered by ``query``, with the totals of
    the whole period and of the matching rows (window sums over every row, read in the
    same pass as the page). Raises ``ValueError`` for a period that ends before it starts,
    an unknown sort or filter."""
    if query.sort not in SORTS or (query.only and query.only not in ONLY):
        raise ValueError("unknown sort or filter")
    per = _per_row(conn, query.start, query.end)
    everyone = [func.count().over().label("all_rows")] + [
        func.sum(per.c[c]).over().label(f"all_{c}") for c in _columns()]
    u = select(per, *everyone).subquery()
    matching = [func.count().over().label("matching")] + [
        func.sum(u.c[c]).over().label(f"m_{c}") for c in _columns()]
    key = _sort_key(u, query.sort)
    order = [key.desc() if query.descending else key.asc()]
    if query.sort != "tenant":
        order.append(u.c.tenant_id.asc())
    order.append(u.c.meter.asc())
    stmt = select(u, *matching).where(*_filter(u, query)).order_by(*order)
    got = conn.execute(stmt.limit(query.per_page)
                       .offset((query.page - 1) * query.per_page)).mappings().all()
    first = got[0] if got else None
    if first is None and query.page > 1:      # past the last page: still say the totals
        first = conn.execute(stmt.limit(1)).mappings().first()
    if first is None:                          # nothing matches: the period's totals
        first = conn.execute(select(u).limit(1)).mappings().first()
        return UsageTable(query, [], int(first["all_rows"]) if first else 0, 0,
                          _total(first, "all_"), UsageRow("", ""))
    return UsageTable(query, [_row(m) for m in got], int(first["all_rows"]),
                      int(first["matching"]), _total(first, "all_"), _total(first, "m_"))


def usage_rows_streamed(engine: Engine, *, start: date, end: date,
                        tenant_id: str | None = None) -> Iterator[UsageRow]:
    """Every tenant × meter row of the period, by tenant then meter, read a thousand at a
    time (the CSV of 100,000 tenants never sits in memory whole). Raises ``ValueError`` for
    a period that ends before it starts (when first advanced)."""
    _bounds(start, end)
    with reading(engine) as conn:
        per = _per_row(conn, start, end, tenant_id)
        result = conn.execution_options(stream_results=True, yield_per=1000).execute(
            select(per).order_by(per.c.tenant_id, per.c.meter))
        for m in result.mappings():
            yield _row(m)


__all__ = ["ONLY", "PER_PAGE", "SORTS", "UsageQuery", "UsageTable", "usage_pieces",
           "usage_rows_streamed", "usage_table"]
