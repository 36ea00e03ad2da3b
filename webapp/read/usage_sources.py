"""Where a period's usage comes from, for every reader of it (``usage_in``: the ``usage``
command and a tenant's page; ``usage_table``: the paged Tenants & usage table and its CSV):
the sent rollups (years, months and days, added and taken away as :func:`sent_plan` says),
the sent rows past the rollup's mark, the unsent rows through ``ix_outbox_unsent``, the rows
in flight, and resolved and cancelled events past retention from the pruned-usage rollup;
summed per tenant and meter by :func:`per_row`. One definition, so the readers cannot count
differently."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    and_,
    case,
    func,
    literal_column,
    or_,
    select,
    union_all,
)
from sqlalchemy import cast as sql_cast

from ..outbox.rollups import SENT_USAGE, customer_key, live_sent, read_mark
from ..outbox.sql import (
    IDLE_UNSENT,
    IN_FLIGHT_WHERE,
    LATE_USAGE,
    PRUNED_ROLLUP,
    SENT_MONTHLY,
    SENT_ROLLUP,
    SENT_YEARLY,
    TENANTS,
    T,
    int_sum,
    sql_str,
    status_in,
    status_is,
)
from ..status import PENDING, PROCESSING, PRUNABLE, SENT, USAGE_ORDER

#: The usage table's columns. Rejected and cancelled events were accepted by Stripe but are
#: not billed: they are shown apart from ``sent``, never inside it.
USAGE_STATUSES = USAGE_ORDER
#: Statuses whose pruned events are read from the pruned-usage rollup (pruned sent events
#: stay in the sent rollups).
PRUNED_APART = tuple(s for s in PRUNABLE if s != SENT)


def period_bounds(start: date, end: date) -> tuple[datetime, datetime]:
    if end < start:
        raise ValueError("the period ends before it starts")
    lo = datetime(start.year, start.month, start.day, tzinfo=UTC)
    return lo, datetime(end.year, end.month, end.day, tzinfo=UTC) + timedelta(days=1)


def usage_pieces(conn: Connection, start: date, end: date, tenant_id: str | None = None, *,
                 in_flight_apart: bool = False) -> tuple[list[Any], list[Any]]:
    """Every source of the period's usage, the way :func:`per_row` sums them, as rows to be
    summed per tenant, Stripe customer and meter: sent (``(tenant_id, customer, meter,
    events, quantity)`` selects: the sent rollups' rows as :func:`sent_plan` adds and takes
    them (taken away: negative), plus the rows past the rollup's mark, each counting one),
    and the other statuses (``(tenant_id, customer, meter, status, events, quantity)``: the
    rows through ``ix_outbox_unsent``, events in flight as pending (as ``processing`` with
    ``in_flight_apart``), pruned resolved and cancelled events from the pruned-usage
    rollup). The customer is the one fixed on each event at its first attempt (the one its
    usage went to); for an event never attempted, the one its tenant is mapped to now (where
    it will go); ``""`` when there is none. Nothing is grouped here: one sum over them all is
    cheaper than a sum per source and a sum of those."""
    lo, hi = period_bounds(start, end)
    span = [T.c.occurred_at >= lo, T.c.occurred_at < hi]
    if tenant_id is not None:
        span.append(T.c.tenant_id == tenant_id)
    unsent = status_in(tuple(s for s in USAGE_STATUSES if s != SENT))
    mark = read_mark(conn, SENT_USAGE)
    one = sql_cast(literal_column("1"), BigInteger).label("events")
    sent: list[Any] = []
    for level, keys, sign in _grouped(sent_plan(start, end, _probe(conn))):
        table, column = LEVELS[level]
        events, quantity = table.c.events, table.c.quantity
        where = [column.in_(keys)]
        if tenant_id is not None:
            where.append(table.c.tenant_id == tenant_id)
        sent.append(select(table.c.tenant_id, table.c.stripe_customer_id.label("customer"),
                           table.c.meter, (events if sign > 0 else -events).label("events"),
                           (quantity if sign > 0 else -quantity).label("quantity"))
                    .where(*where))
    sent.append(select(T.c.tenant_id, customer_key(T.c.stripe_customer_id), T.c.meter, one,
                       T.c.quantity).where(live_sent(mark), *span))
    # Where an event not yet attempted will go: its tenant's customer now.
    mapped_now = (select(TENANTS.c.stripe_customer_id)
                  .where(TENANTS.c.tenant_id == T.c.tenant_id).scalar_subquery())
    will_go = func.coalesce(T.c.stripe_customer_id, mapped_now, "").label("customer")
    other = [
        select(T.c.tenant_id, will_go, T.c.meter, T.c.status, one, T.c.quantity)
        .where(unsent, IDLE_UNSENT, *span),
        select(T.c.tenant_id, customer_key(T.c.stripe_customer_id), T.c.meter,
               sql_str(PROCESSING if in_flight_apart else PENDING).label("status"), one,
               T.c.quantity)
        .where(IN_FLIGHT_WHERE, *span),
    ]
    # A late event billed on a later invoice is counted once, on the original: its copy
    # (``late_usage.new_event_id``, webapp.outbox.late) is taken away wherever it counts.
    copies = T.c.id.in_(select(LATE_USAGE.c.new_event_id)
                        .where(LATE_USAGE.c.new_event_id.is_not(None)))
    minus = sql_cast(literal_column("-1"), BigInteger).label("events")
    taken = (-T.c.quantity).label("quantity")
    sent.append(select(T.c.tenant_id, customer_key(T.c.stripe_customer_id), T.c.meter, minus,
                       taken).where(status_is(SENT), copies, *span))
    other += [
        select(T.c.tenant_id, will_go, T.c.meter, T.c.status, minus, taken)
        .where(unsent, IDLE_UNSENT, copies, *span),
        select(T.c.tenant_id, customer_key(T.c.stripe_customer_id), T.c.meter,
               sql_str(PROCESSING if in_flight_apart else PENDING).label("status"), minus,
               taken)
        .where(IN_FLIGHT_WHERE, copies, *span),
    ]
    # Resolved and cancelled events past retention, from the pruned-usage rollup (pruned
    # sent events stay in the sent rollups, read above).
    pruned = (select(PRUNED_ROLLUP.c.tenant_id,
                     PRUNED_ROLLUP.c.stripe_customer_id.label("customer"),
                     PRUNED_ROLLUP.c.meter, PRUNED_ROLLUP.c.status,
                     PRUNED_ROLLUP.c.events, PRUNED_ROLLUP.c.quantity)
              .where(PRUNED_ROLLUP.c.day >= start.isoformat(),
                     PRUNED_ROLLUP.c.day <= end.isoformat(),
                     PRUNED_ROLLUP.c.status.in_([sql_str(s) for s in PRUNED_APART])))
    if tenant_id is not None:
        pruned = pruned.where(PRUNED_ROLLUP.c.tenant_id == tenant_id)
    return sent, other + [pruned]


#: The sent rollups by level: each row of a level is the sum of the rows below it (one
#: writer, ``rollups.add_sent``, writes all three in one transaction).
LEVELS: dict[str, tuple[Any, Any]] = {"year": (SENT_YEARLY, SENT_YEARLY.c.year),
                                      "month": (SENT_MONTHLY, SENT_MONTHLY.c.month),
                                      "day": (SENT_ROLLUP, SENT_ROLLUP.c.day)}


@dataclass(frozen=True)
class Piece:
    """A year (``YYYY``), month (``YYYY-MM``) or day (``YYYY-MM-DD``) of a sent rollup, added
    (``sign`` 1) or taken away (-1)."""

    level: str
    key: str
    sign: int


def sent_plan(start: date, end: date, has_rows: Callable[[date, date], bool]) -> list[Piece]:
    """The sent rollups' rows that sum to days ``start``…``end``, as few as it can: a year or a
    month whose days all fall in the period is one row; so is one part of which lies in the
    period when the rest holds nothing (``has_rows(first, last)``, a probe of the daily
    rollup, says whether days ``first``…``last`` hold anything: "this year so far" is the
    year's row, as nothing has occurred after today); one most of which lies in the period
    is its row less the rows of the days outside it (the 365 days from 2 December 2025 are
    2026's row plus December 2025's less its first day's, not 365 days' rows). At 100,000
    tenants a year is then about 385,000 rows to sum, not 2.6 million."""
    if end < start:
        raise ValueError("the period ends before it starts")
    pieces: list[Piece] = []
    a = start
    while a <= end:
        b = min(end, date(a.year, 12, 31))
        pieces += _cover("year", a, b, 1, has_rows)
        a = b + timedelta(days=1)
    return pieces


def _cover(level: str, a: date, b: date, sign: int,
           has_rows: Callable[[date, date], bool]) -> list[Piece]:
    """Days ``a``…``b``, all inside one ``level`` unit (a year or a month), as signed
    pieces."""
    if level == "day":
        return [Piece("day", (a + timedelta(days=i)).isoformat(), sign)
                for i in range((b - a).days + 1)]
    first, last = _unit(level, a)
    key = a.isoformat()[:4 if level == "year" else 7]
    outside = [(x, y) for x, y in ((first, a - timedelta(days=1)), (b + timedelta(days=1), last))
               if x <= y]
    inner = "month" if level == "year" else "day"
    if not outside or not any(has_rows(x, y) for x, y in outside):
        return [Piece(level, key, sign)]
    inside_units = _units(inner, a, b)
    outside_units = sum(len(_units(inner, x, y)) for x, y in outside)
    if outside_units < len(inside_units):
        pieces = [Piece(level, key, sign)]
        for x, y in outside:
            for u, v in _units(inner, x, y):
                pieces += _cover(inner, u, v, -sign, has_rows)
        return pieces
    return [p for u, v in inside_units for p in _cover(inner, u, v, sign, has_rows)]


def _unit(level: str, d: date) -> tuple[date, date]:
    """The first and last day of the year or month holding ``d``."""
    if level == "year":
        return date(d.year, 1, 1), date(d.year, 12, 31)
    return d.replace(day=1), _next_month(d) - timedelta(days=1)


def _units(level: str, a: date, b: date) -> list[tuple[date, date]]:
    """Days ``a``…``b`` cut at month boundaries (``level`` "month") or one by one ("day")."""
    out = []
    while a <= b:
        last = min(b, _next_month(a) - timedelta(days=1)) if level == "month" else a
        out.append((a, last))
        a = last + timedelta(days=1)
    return out


def _grouped(pieces: list[Piece]) -> list[tuple[str, list[str], int]]:
    """Pieces of one level and sign together (one statement each)."""
    by: dict[tuple[str, int], list[str]] = {}
    for p in pieces:
        by.setdefault((p.level, p.sign), []).append(p.key)
    return [(level, keys, sign) for (level, sign), keys in by.items()]


def _probe(conn: Connection) -> Callable[[date, date], bool]:
    """Whether the daily sent rollup holds anything on days ``first``…``last`` (a range of
    its primary key's first column)."""
    def has_rows(first: date, last: date) -> bool:
        return conn.execute(select(SENT_ROLLUP.c.day).where(
            SENT_ROLLUP.c.day >= first.isoformat(), SENT_ROLLUP.c.day <= last.isoformat())
            .limit(1)).first() is not None
    return has_rows


def _next_month(d: date) -> date:
    return (d.replace(day=28) + timedelta(days=4)).replace(day=1)


def per_row(conn: Connection, start: date, end: date, tenant_id: str | None = None, *,
            names: bool = True, in_flight_apart: bool = False) -> Any:
    """The period's usage, one row per tenant × Stripe customer × meter (the customer its
    events went to: a tenant remapped within the period has a row per customer), a column
    per status and figure (``<status>_events``, ``<status>_units``; ``processing_…`` too
    with ``in_flight_apart``), ``stripe_customer_id`` (None where there is none), and the
    tenant's name (unless not ``names``). A tenant and meter with nothing in the period has
    no row.

    Sent usage (the rollups: the bulk) is summed with two sums; the other statuses (a few
    rows) are spread into their columns apart; the two are joined (a left join, plus the
    rows with no sent usage: no FULL JOIN, which SQLite before 3.39 lacks)."""
    sent_pieces, other_pieces = usage_pieces(conn, start, end, tenant_id,
                                             in_flight_apart=in_flight_apart)
    s_all = union_all(*sent_pieces).subquery()
    events, units = int_sum(s_all.c.events), int_sum(s_all.c.quantity)
    # Grouped, joined and sorted byte by byte: PostgreSQL compares text under the locale
    # otherwise, which made each sort and merge of 200,000 keys several times slower.
    tenant, meter = bytewise(conn, s_all.c.tenant_id), bytewise(conn, s_all.c.meter)
    customer = bytewise(conn, s_all.c.customer)
    sent = (select(tenant.label("tenant_id"), customer.label("customer"), meter.label("meter"),
                   events.label("sent_events"), units.label("sent_units"))
            .group_by(tenant, customer, meter)
            # a year's row less its months outside the period leaves zeros for the tenants
            # that had usage only outside it
            .having(or_(events != 0, units != 0)).cte("sent_usage"))
    o_all = union_all(*other_pieces).subquery()
    # Summed per tenant, customer, meter and status first (two sums a row), then spread into
    # a column per status (fourteen sums a row, over one row per status held): at 300,000
    # unsent rows, spreading every row took three times as long.
    tenant, meter = bytewise(conn, o_all.c.tenant_id), bytewise(conn, o_all.c.meter)
    customer = bytewise(conn, o_all.c.customer)
    by_status = (select(tenant.label("tenant_id"), customer.label("customer"),
                        meter.label("meter"), o_all.c.status,
                        int_sum(o_all.c.events).label("events"),
                        int_sum(o_all.c.quantity).label("quantity"))
                 .group_by(tenant, customer, meter, o_all.c.status).subquery())
    unsent = [s for s in USAGE_STATUSES if s != SENT] + (
        [PROCESSING] if in_flight_apart else [])
    spread = []
    for st in unsent:
        mine = by_status.c.status == sql_str(st)
        spread += [int_sum(case((mine, by_status.c.events), else_=0)).label(f"{st}_events"),
                   int_sum(case((mine, by_status.c.quantity), else_=0)).label(f"{st}_units")]
    tenant, meter = bytewise(conn, by_status.c.tenant_id), bytewise(conn, by_status.c.meter)
    customer = bytewise(conn, by_status.c.customer)
    other = (select(tenant.label("tenant_id"), customer.label("customer"),
                    meter.label("meter"), *spread)
             .group_by(tenant, customer, meter).cte("other_usage"))
    same = and_(other.c.tenant_id == sent.c.tenant_id, other.c.customer == sent.c.customer,
                other.c.meter == sent.c.meter)
    zero = sql_cast(literal_column("0"), BigInteger)
    with_sent = select(
        sent.c.tenant_id, sent.c.meter, sent.c.customer, sent.c.sent_events, sent.c.sent_units,
        *[func.coalesce(other.c[f"{st}_{w}"], zero).label(f"{st}_{w}")
          for st in unsent for w in ("events", "units")]
    ).select_from(sent.outerjoin(other, same))
    only_other = select(
        other.c.tenant_id, other.c.meter, other.c.customer, zero.label("sent_events"),
        zero.label("sent_units"),
        *[other.c[f"{st}_{w}"] for st in unsent for w in ("events", "units")]
    ).where(~select(sent.c.tenant_id).where(same).exists())
    rows = union_all(with_sent, only_other).subquery()
    figures = [rows.c[f"{st}_{w}"] for st in (SENT, *unsent) for w in ("events", "units")]
    customer_id = func.nullif(rows.c.customer, "").label("stripe_customer_id")
    if not names:
        return select(rows.c.tenant_id, rows.c.meter, customer_id, *figures)
    return (select(rows.c.tenant_id, rows.c.meter, customer_id, *figures, TENANTS.c.name)
            .select_from(rows.outerjoin(TENANTS, TENANTS.c.tenant_id == as_stored(
                conn, rows.c.tenant_id))))


def bytewise(conn: Connection, column: Any) -> Any:
    """``column`` compared byte by byte on PostgreSQL (the ``"C"`` collation), as SQLite and
    Python order text: the same order everywhere, and at 100,000 tenants several times
    cheaper than the locale's rules."""
    return column.collate("C") if conn.dialect.name == "postgresql" else column


def many_rows(conn: Connection) -> None:
    """Settings for the rest of ``conn``'s transaction (PostgreSQL) that a read summing every
    tenant's usage needs: its sorts and hashes of 200,000 tenant × meter rows fit in 64 MB,
    not the default 4 MB (which spilled them to disk); no JIT, whose compiling of a
    statement this size costs more than it saves; and no parallel workers: on a small machine
    their partial sums and the merge of them cost more than one process, and they take the
    cores the other requests need (measured in bench/RESULTS.md's history)."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("SET LOCAL jit = off")
        conn.exec_driver_sql("SET LOCAL work_mem = '64MB'")
        conn.exec_driver_sql("SET LOCAL max_parallel_workers_per_gather = 0")


def as_stored(conn: Connection, column: Any) -> Any:
    """A :func:`bytewise` column compared under the column's own collation again, so that
    an equality with a stored column can use that column's index (PostgreSQL)."""
    return column.collate("default") if conn.dialect.name == "postgresql" else column
