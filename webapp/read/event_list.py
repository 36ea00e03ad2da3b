"""The events list: every event matching a set of filters, newest id first, keyset-paginated
by id, counted, and exported — the page every count of events on the dashboard links to.

A status filter splits the query into one piece per status, each with its status written
inline (``status = 'dead'``), so each piece is served by that status's partial index
(``ix_outbox_unsent``, ``ix_outbox_dead``, ``ix_outbox_sent_at``, the rescuer's for events in
flight…); the pieces are paged by id and merged, as ``paging.keyset`` does with ``parts``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from operator import itemgetter
from typing import Any

from sqlalchemy import Connection, Engine, and_, false, func, or_, select

from ..db import exporting, reading
from ..outbox.sql import (
    AUDIT_EVENTS,
    ERROR_SAMPLES,
    IDLE_UNSENT,
    IN_FLIGHT_WHERE,
    INVOICE_PERIODS,
    LINE_EVENTS,
    TENANTS,
    UNBILLED,
    T,
    row_dict,
    sql_str,
    status_is,
    text_in,
)
from ..outbox.states import ALL_STATUSES, DEAD_EXHAUSTED, DEAD_PAST_WINDOW, MAX_AGE
from ..outbox.tracing import request_event_ids
from ..status import PROCESSING, REACHED_STRIPE, SENT, UNSENT_OPEN, WAITING
from .billed import billed_to, tenants_billed_to
from .counts import NEAR_LIMIT
from .event_filters import NONE, EventFilters

#: The most rows one page shows, and the default.
MAX_LIMIT = 200
DEFAULT_LIMIT = 50
#: Counts stop here: past it the page says "more than 10,000".
COUNT_CAP = 10_000
#: Rows fetched at a time while exporting, and the ids of the export's first range.
EXPORT_BATCH = 1000
EXPORT_FIRST_IDS = 50_000

#: The statuses the age limit and "due" apply to (as ``counts.age_limits`` and the claim).
AGE_STATUSES = (*UNSENT_OPEN, PROCESSING)

LIST_COLUMNS = (T.c.id, T.c.tenant_id, T.c.meter, T.c.quantity, T.c.idempotency_key,
                T.c.status, T.c.attempt_count, T.c.occurred_at, T.c.created_at, T.c.sent_at,
                T.c.next_attempt_at, T.c.last_outcome, T.c.last_error_code,
                T.c.last_http_status, T.c.stripe_customer_id)
#: The export's columns: the list's, under their own names.
CSV_HEADER = [c.name for c in LIST_COLUMNS]


def _day_start(day: date) -> datetime:
    return datetime.combine(day, time(0), UTC)


def _statuses(f: EventFilters) -> tuple[str, ...] | None:
    """The statuses the filters allow (None: any), each filter narrowing the others."""
    allowed: set[str] | None = set(f.status) if f.status else None
    for implied in ((WAITING if f.due else None), (AGE_STATUSES if f.age else None),
                    (REACHED_STRIPE if f.sent_from or f.sent_to else None)):
        if implied is not None:
            allowed = set(implied) if allowed is None else allowed & set(implied)
    if allowed is None:
        return None
    return tuple(s for s in ALL_STATUSES if s in allowed)


def mapped_to(conn: Connection, customer: str) -> list[str]:
    """The tenants mapped to ``customer`` now."""
    return list(conn.execute(select(TENANTS.c.tenant_id).where(
        TENANTS.c.stripe_customer_id == customer)).scalars())


def _common(conn: Connection, f: EventFilters, now: datetime) -> list[Any]:
    """The conditions every piece shares."""
    where: list[Any] = []
    if f.tenant:
        where.append(T.c.tenant_id == f.tenant)
    if f.customer:
        # The events whose usage went (or will go) to that customer: through the tenants it
        # bills (read first: the planner then knows which, and takes the tenant index).
        tenants = tenants_billed_to(conn, f.customer)
        mapped = mapped_to(conn, f.customer)
        where += [T.c.tenant_id == tenants[0] if len(tenants) == 1 else
                  text_in(conn, T.c.tenant_id, tenants) if tenants else false(),
                  billed_to(f.customer, text_in(conn, T.c.tenant_id, mapped) if mapped
                            else false())]
    if f.meter:
        where.append(T.c.meter == f.meter)
    if f.source == "python":
        where.append(T.c.source.is_(None))
    elif f.source == "http":
        # ix_outbox_source holds the non-NULL ones only: said, so the planner may take it.
        where += [T.c.source.isnot(None), T.c.source.like("http:%")]
    elif f.source:
        where += [T.c.source.isnot(None), T.c.source == f.source]
    if f.created_from:
        where.append(T.c.created_at >= _day_start(f.created_from))
    if f.created_to:
        where.append(T.c.created_at < _day_start(f.created_to) + timedelta(days=1))
    if f.occurred_from:
        where.append(T.c.occurred_at >= _day_start(f.occurred_from))
    if f.occurred_to:
        where.append(T.c.occurred_at < _day_start(f.occurred_to) + timedelta(days=1))
    if f.period_start is not None:
        where.append(T.c.occurred_at >= datetime.fromtimestamp(f.period_start, UTC))
    if f.period_end is not None:
        where.append(T.c.occurred_at < datetime.fromtimestamp(f.period_end, UTC))
    if f.sent_from:
        where.append(T.c.sent_at >= _day_start(f.sent_from))
    if f.sent_to:
        where.append(T.c.sent_at < _day_start(f.sent_to) + timedelta(days=1))
    if f.due:
        where.append(T.c.next_attempt_at <= now)
    if f.age == "near":
        where += [T.c.occurred_at >= now - MAX_AGE, T.c.occurred_at < now - (MAX_AGE - NEAR_LIMIT)]
    elif f.age == "over":
        where.append(T.c.occurred_at < now - MAX_AGE)
    for value, column in ((f.code, T.c.last_error_code),
                          (f.error_class, T.c.last_error_class),
                          (f.reject_code, T.c.reject_code)):
        if value:
            where.append(column.is_(None) if value == NONE else column == value)
    if f.http:
        where.append(T.c.last_http_status.is_(None) if f.http == NONE
                     else T.c.last_http_status == int(f.http))
    if f.why:
        reason = func.coalesce(T.c.dead_reason, "")
        past = reason == DEAD_PAST_WINDOW
        exhausted = reason.startswith(DEAD_EXHAUSTED, autoescape=True)
        where.append(past if f.why == "unknown_past_window" else
                     exhausted & ~past if f.why == "exhausted" else ~past & ~exhausted)
    if f.outcome:
        where.append(T.c.last_outcome == f.outcome)
    if f.audit:
        where.append(T.c.id.in_(select(AUDIT_EVENTS.c.event_id)
                                .where(AUDIT_EVENTS.c.audit_id.in_(f.audit))))
    where += [T.c.id.in_(request_event_ids(conn, f.request))] if f.request else []
    if f.report:
        where.append(T.c.id.in_(select(ERROR_SAMPLES.c.event_id).where(
            ERROR_SAMPLES.c.stripe_event_id == f.report, ERROR_SAMPLES.c.event_id.is_not(None))))
    if f.line:
        where.append(_on_line(conn, f.line, f.place))
    if f.unbilled:
        found = select(UNBILLED.c.event_id)
        if f.unbilled != "any":
            found = found.where(UNBILLED.c.reason == f.unbilled)
        where += [T.c.id.in_(found), status_is(SENT)]
    if f.attempts_min is not None:
        where.append(T.c.attempt_count >= f.attempts_min)
    if f.attempts_max is not None:
        where.append(T.c.attempt_count <= f.attempts_max)
    return where


def _on_line(conn: Connection, line: str, place: str) -> Any:
    """The events behind one figure of an invoice line (``webapp.outbox.judge``): ``late``
    and ``uncertain`` as the judge recorded them; ``ours`` the line's sent events of its
    customer, meter and period but those."""
    invoice_id, item_id = line.split("/", 1)
    rows = select(LINE_EVENTS.c.event_id).where(LINE_EVENTS.c.invoice_id == invoice_id,
                                               LINE_EVENTS.c.subscription_item_id == item_id)
    late = or_(LINE_EVENTS.c.place == "late", LINE_EVENTS.c.settled == "late")
    if place == "late":
        return T.c.id.in_(rows.where(late))
    unsettled = and_(LINE_EVENTS.c.place == "uncertain", LINE_EVENTS.c.settled.is_(None))
    if place == "uncertain":
        return T.c.id.in_(rows.where(unsettled))
    found = conn.execute(select(INVOICE_PERIODS).where(
        INVOICE_PERIODS.c.invoice_id == invoice_id,
        INVOICE_PERIODS.c.subscription_item_id == item_id)).first()
    if found is None or found.meter is None:
        return false()
    return and_(status_is(SENT), T.c.stripe_customer_id == found.stripe_customer_id,
                T.c.meter == found.meter, T.c.occurred_at >= found.period_start,
                T.c.occurred_at < found.period_end,
                T.c.id.not_in(rows.where(or_(late, unsettled))))


@dataclass(frozen=True)
class Piece:
    """Conditions selecting one disjoint part of the filtered set. ``narrow``: an index on
    its status serves a narrowing condition too (an age, a due time, a day of occurrence),
    so its rows are found through that index and sorted, never by walking the primary key
    backwards past every row that does not match (the planner's bet with a LIMIT, which
    loses when the matches are old)."""

    where: list[Any]
    narrow: bool = False


def _pieces(conn: Connection, f: EventFilters, now: datetime) -> list[Piece]:
    """Disjoint pieces whose union is the filtered set: one per status when the filters name
    statuses (each then served by its own partial index), else one."""
    common = _common(conn, f, now)
    statuses = _statuses(f)
    if statuses is None and (f.tenant or f.customer):
        # A tenant's events: through its index (which leaves the few in flight out), and
        # those in flight through the rescuer's, as the tenant page reads them.
        return [Piece([T.c.status != sql_str(PROCESSING), *common]),
                Piece([IN_FLIGHT_WHERE, *common])]
    if statuses is None:
        return [Piece(common)]
    if not statuses:
        return [Piece([*common, false()])]
    narrowing = bool(f.age or f.due or f.occurred_from or f.occurred_to
                     or f.period_start is not None or f.period_end is not None)
    # Each with the predicate of its partial index written out, as the other reads do.
    return [Piece([status_is(s), *([IDLE_UNSENT] if s not in (SENT, PROCESSING) else []),
                   *common], narrow=narrowing and s != SENT)
            for s in statuses]


@dataclass(frozen=True)
class EventPage:
    rows: list[dict[str, Any]]
    #: The id to pass as ``before`` for the next (older) page; None on the last page.
    next_before: int | None
    #: Matching events (all pages), at most :data:`COUNT_CAP`; ``more`` when there are more.
    count: int
    more: bool
    extra: dict[str, Any] = field(default_factory=dict)


def _page_rows(conn: Connection, pieces: list[Piece], *, before: int | None,
               limit: int) -> tuple[list[dict[str, Any]], int | None]:
    got: list[Any] = []
    for piece in pieces:
        stmt = select(*LIST_COLUMNS).where(*piece.where)
        if before is not None:
            stmt = stmt.where(T.c.id < before)
        # ``id + 0`` orders the same but is no index's key: a narrow piece is sorted.
        order = (T.c.id + 0) if piece.narrow else T.c.id
        got += conn.execute(stmt.order_by(order.desc()).limit(limit + 1)).all()
    got.sort(key=lambda r: int(r.id), reverse=True)
    rows = [row_dict(r) for r in got[:limit]]
    return rows, (int(rows[-1]["id"]) if len(got) > limit and rows else None)


def _count(conn: Connection, pieces: list[Piece]) -> tuple[int, bool]:
    total = 0
    for piece in pieces:
        capped = select(T.c.id).where(*piece.where).limit(COUNT_CAP + 1 - total).subquery()
        total += int(conn.execute(select(func.count()).select_from(capped)).scalar_one())
        if total > COUNT_CAP:
            return COUNT_CAP, True
    return total, False


def event_list(engine: Engine, f: EventFilters, *, now: datetime, before: int | None = None,
               limit: int = DEFAULT_LIMIT) -> EventPage:
    """One page of matching events, newest id first, older than ``before``; and how many
    match in all (to :data:`COUNT_CAP`)."""
    limit = max(1, min(limit, MAX_LIMIT))
    with reading(engine) as conn:
        pieces = _pieces(conn, f, now)
        rows, next_before = _page_rows(conn, pieces, before=before, limit=limit)
        count, more = _count(conn, pieces)
    return EventPage(rows, next_before, count, more)


def export_rows(engine: Engine, f: EventFilters, *, now: datetime
                ) -> Iterator[Sequence[Any]]:
    """Every matching event as a CSV row (:data:`LIST_COLUMNS`, the order of
    :data:`CSV_HEADER`), newest id first, in one snapshot. The ids are read in ranges from
    the newest down, each twice as wide as the one before (from :data:`EXPORT_FIRST_IDS`):
    each piece's rows of a range are one query sorted by id, read :data:`EXPORT_BATCH` rows at
    a time (a server-side cursor on PostgreSQL), and the pieces are merged. So the first rows
    come as soon as the newest range is sorted, not the whole set (the dead events with one
    error code, which no index holds in id order); no row is read
    twice (keyset batches with a LIMIT searched every dead row again for each batch); and an
    export of any size holds a batch a piece in memory."""
    with exporting(engine) as conn:
        pieces = _pieces(conn, f, now)
        low, high = conn.execute(select(func.min(T.c.id), func.max(T.c.id))).one()
        if high is None:
            return
        top, width = int(high) + 1, EXPORT_FIRST_IDS
        while top > low:
            bottom = max(int(low), top - width)
            streams = []
            for piece in pieces:
                order = (T.c.id + 0) if piece.narrow else T.c.id
                streams.append(
                    conn.execution_options(stream_results=True, yield_per=EXPORT_BATCH)
                    .execute(select(*LIST_COLUMNS)
                             .where(*piece.where, T.c.id >= bottom, T.c.id < top)
                             .order_by(order.desc())))
            yield from (streams[0] if len(streams) == 1 else
                        heapq.merge(*streams, key=itemgetter(0), reverse=True))
            top, width = bottom, width * 2
