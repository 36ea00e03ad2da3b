"""The Tenants & usage page, a tenant's own page, and the mappings page: usage per tenant and
meter for a period, a tenant's events, and who is billed to which Stripe customer."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, func, literal_column, select, union_all

from ..db import reading
from ..outbox.retention import PRUNABLE, pruned_usage
from ..outbox.rollups import SENT_USAGE, Mark, live_sent, read_mark
from ..outbox.sql import (
    IDLE_UNSENT,
    IN_FLIGHT,
    SENT_ROLLUP,
    TENANTS,
    T,
    int_sum,
    row_dict,
    sql_str,
    status_in,
    status_is,
    text_in,
)
from .counts import Freshness, UnmappedTenant, rollup_freshness, unmapped_tenants
from .paging import Cursor, Page, keyset
from .series import Bucket, sent_by_occurrence_day

#: The usage table's columns. Rejected and cancelled events were accepted by Stripe but are
#: not billed: they are shown apart from ``sent``, never inside it.
USAGE_STATUSES = ("sent", "pending", "retrying", "rejected", "dead", "cancelled", "resolved")
#: Statuses whose pruned events are read from the pruned-usage rollup.
PRUNED_APART = tuple(s for s in PRUNABLE if s != "sent")


@dataclass
class UsageRow:
    """One tenant × meter: events and units by status."""

    tenant_id: str
    meter: str
    name: str | None = None
    stripe_customer_id: str | None = None
    events: dict[str, int] = field(default_factory=lambda: dict.fromkeys(USAGE_STATUSES, 0))
    quantity: dict[str, int] = field(default_factory=lambda: dict.fromkeys(USAGE_STATUSES, 0))


@dataclass(frozen=True)
class Usage:
    """Usage for the UTC days ``start``…``end`` (inclusive)."""

    start: date
    end: date            # inclusive
    rows: list[UsageRow]

    def total(self, what: str, status: str) -> int:
        return sum(getattr(r, what)[status] for r in self.rows)


def month_start(now: datetime) -> date:
    """The first day of ``now``'s UTC month."""
    return now.astimezone(UTC).date().replace(day=1)


def tenant_usage(engine: Engine, *, start: date, end: date,
                 tenant_id: str | None = None, in_flight_apart: bool = False) -> Usage:
    """:func:`usage_in` in a snapshot of its own."""
    with reading(engine) as conn:
        return usage_in(conn, start=start, end=end, tenant_id=tenant_id,
                        in_flight_apart=in_flight_apart)


def usage_in(conn: Connection, *, start: date, end: date,
             tenant_id: str | None = None, in_flight_apart: bool = False) -> Usage:
    """Usage per tenant and meter for events that *occurred* (Stripe bills by the event's
    timestamp) on UTC days ``start``…``end`` inclusive: events and quantities by status.
    Processing counts as pending (the page's columns), or as ``processing`` of its own with
    ``in_flight_apart`` (the ``usage`` command: a pair for every status). Sent comes from
    the rollup plus the rows past its mark; the rest through ``ix_outbox_unsent``. Raises
    ``ValueError`` for a period that ends before it starts."""
    if end < start:
        raise ValueError("the period ends before it starts")
    lo = datetime(start.year, start.month, start.day, tzinfo=UTC)
    hi = datetime(end.year, end.month, end.day, tzinfo=UTC) + timedelta(days=1)
    table: dict[tuple[str, str], UsageRow] = {}

    def row(t: str, m: str) -> UsageRow:
        r = table.get((t, m))
        if r is None:
            r = table[(t, m)] = UsageRow(t, m)
            if in_flight_apart:
                r.events["processing"] = r.quantity["processing"] = 0
        return r

    mark = read_mark(conn, SENT_USAGE)
    for t, m, n, q in conn.execute(_sent_usage(mark, lo, hi, start, end, tenant_id)).all():
        r = row(t, m)
        r.events["sent"] += int(n)
        r.quantity["sent"] += int(q)
    span = [T.c.occurred_at >= lo, T.c.occurred_at < hi]
    if tenant_id is not None:
        span.append(T.c.tenant_id == tenant_id)
    for where in ((status_in(tuple(s for s in USAGE_STATUSES if s != "sent")), IDLE_UNSENT),
                  (IN_FLIGHT,)):
        for t, m, s, n, q in conn.execute(
                select(T.c.tenant_id, T.c.meter, T.c.status, func.count(),
                       int_sum(T.c.quantity))
                .where(*where, *span).group_by(T.c.tenant_id, T.c.meter, T.c.status)
        ).all():
            status = "pending" if s == "processing" and not in_flight_apart else s
            r = row(t, m)
            r.events[status] += int(n)
            r.quantity[status] += int(q)
    # Resolved and cancelled events past retention are counted in the pruned-usage rollup
    # (pruned sent events stay in the sent rollup, read above).
    for t, m, s, n, q in pruned_usage(conn, start=start.isoformat(), end=end.isoformat(),
                                      statuses=PRUNED_APART, tenant_id=tenant_id):
        r = row(t, m)
        r.events[s] += int(n)
        r.quantity[s] += int(q)
    ids = sorted({t for t, _ in table})
    tenants = {t.tenant_id: t for t in conn.execute(
        select(TENANTS.c.tenant_id, TENANTS.c.name, TENANTS.c.stripe_customer_id)
        .where(text_in(conn, TENANTS.c.tenant_id, ids)))} if ids else {}
    for (t, _m), r in table.items():
        if t in tenants:
            r.name = tenants[t].name
            r.stripe_customer_id = tenants[t].stripe_customer_id
    return Usage(start, end, sorted(table.values(), key=lambda r: (r.tenant_id, r.meter)))


def _sent_usage(mark: Mark, lo: datetime, hi: datetime, start: date, end: date,
                tenant_id: str | None) -> Any:
    """Folded days plus the rows not folded yet."""
    folded = select(SENT_ROLLUP.c.tenant_id, SENT_ROLLUP.c.meter,
                    SENT_ROLLUP.c.events.label("events"),
                    SENT_ROLLUP.c.quantity.label("quantity")).where(
        SENT_ROLLUP.c.day >= start.isoformat(), SENT_ROLLUP.c.day <= end.isoformat())
    live = select(T.c.tenant_id, T.c.meter, literal_column("1").label("events"),
                  T.c.quantity.label("quantity")).where(
        live_sent(mark), T.c.occurred_at >= lo, T.c.occurred_at < hi)
    if tenant_id is not None:
        folded = folded.where(SENT_ROLLUP.c.tenant_id == tenant_id)
        live = live.where(T.c.tenant_id == tenant_id)
    both = union_all(folded, live).subquery()
    return (select(both.c.tenant_id, both.c.meter, int_sum(both.c.events),
                   int_sum(both.c.quantity))
            .group_by(both.c.tenant_id, both.c.meter))


def tenants_list(conn: Connection) -> list[dict[str, Any]]:
    """Every mapped (or named) tenant."""
    return [row_dict(r) for r in conn.execute(
        select(TENANTS.c.tenant_id, TENANTS.c.name, TENANTS.c.stripe_customer_id,
               TENANTS.c.updated_at).order_by(TENANTS.c.tenant_id))]


@dataclass(frozen=True)
class TenantsPage:
    usage: Usage
    unmapped: list[UnmappedTenant]
    freshness: Freshness


def tenants_page(engine: Engine, *, start: date, end: date, now: datetime,
                 margin: timedelta) -> TenantsPage:
    """The tenants page: usage for the period, the tenants waiting for a customer, and how
    fresh the rollups are."""
    with reading(engine) as conn:
        return TenantsPage(usage_in(conn, start=start, end=end), unmapped_tenants(conn),
                           rollup_freshness(conn, now=now, margin=margin))


@dataclass(frozen=True)
class Mappings:
    tenants: list[dict[str, Any]]
    unmapped: list[UnmappedTenant]


def mappings(engine: Engine) -> Mappings:
    """Every tenant with its Stripe customer, and the unmapped ones with waiting events."""
    with reading(engine) as conn:
        return Mappings(tenants_list(conn), unmapped_tenants(conn))


@dataclass(frozen=True)
class TenantDetail:
    tenant_id: str
    tenant: dict[str, Any] | None
    usage: Usage
    events: Page
    waiting: int
    daily: list[Bucket]      # sent events per UTC day of occurrence in the period


def tenant_detail(engine: Engine, tenant_id: str, *, start: date, end: date,
                  after: Cursor | None = None, before: Cursor | None = None,
                  limit: int = 50) -> TenantDetail:
    """A tenant's mapping, its usage for the period by meter and its sent events per day of
    the period (the rollup plus the rows not folded yet), and its events newest first
    (keyset on (created_at, id): through ``ix_outbox_tenant_created`` for events not in
    flight, merged with the few in flight, found through ``ix_outbox_processing_deadline``)."""
    stmt = select(T.c.id, T.c.meter, T.c.quantity, T.c.idempotency_key, T.c.status,
                  T.c.occurred_at, T.c.created_at, T.c.attempt_count, T.c.sent_at,
                  T.c.last_outcome, T.c.last_error_code, T.c.next_attempt_at).where(
        T.c.tenant_id == tenant_id)
    with reading(engine) as conn:
        usage = usage_in(conn, start=start, end=end, tenant_id=tenant_id)
        tenant = conn.execute(select(TENANTS).where(TENANTS.c.tenant_id == tenant_id)).first()
        page = keyset(conn, stmt, T.c.created_at, T.c.id, after=after, before=before,
                      limit=limit, key="created_at",
                      parts=(T.c.status != sql_str("processing"), status_is("processing")))
        waiting = int(conn.execute(select(func.count()).where(
            status_in(("pending", "retrying")), IDLE_UNSENT, T.c.tenant_id == tenant_id))
            .scalar_one())
        daily = sent_by_occurrence_day(conn, end, (end - start).days + 1, tenant_id=tenant_id)
    return TenantDetail(tenant_id, row_dict(tenant) if tenant else None, usage, page, waiting,
                        daily)
