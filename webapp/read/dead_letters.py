"""The Dead letters page: dead (or resolved) events filtered and keyset-paginated, grouped by
error, and what a requeue would do with them — judged by the one requeue rule,
:func:`webapp.outbox.guards.requeue_check`, that the requeue itself applies."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, and_, case, func, literal, or_, select, union_all

from ..db import reading
from ..outbox.guards import REQUEUE_RULE, RequeueCheck, requeue_check
from ..outbox.operations import requeue_checks
from ..outbox.sql import (
    DEAD_PIECES,
    T,
    as_utc,
    ascii_icontains,
    int_sum,
    row_dict,
    rule_sql,
    status_is,
)
from ..outbox.states import DEAD_EXHAUSTED, DEAD_PAST_WINDOW, MAX_AGE
from ..status import DEAD, RESOLVED
from .counts import NEAR_LIMIT
from .paging import Cursor, Page, keyset
from .usage_sources import many_rows

#: "Requeue all matching" previews and acts on at most this many events at a time.
MAX_BULK = 10_000

AGES = {
    "": "any age",
    "1h": "dead in the last hour",
    "24h": "dead in the last 24 h",
    "7d": "dead in the last 7 days",
    "gt24h": "dead for over 24 h",
    "gt7d": "dead for over 7 days",
    "near_limit": "occurred over 28 days ago",
}
DEAD_STATUSES = {DEAD: "Dead (to act on)", RESOLVED: "Resolved (history)"}
KINDS = {"unknown_past_window": "outcome unknown past the 24 h window",
         "exhausted": "retries exhausted", "permanent": "permanent error"}


@dataclass(frozen=True)
class DeadFilters:
    """The page's filters; raises ``ValueError`` naming a bad one."""

    status: str = DEAD
    tenant: str = ""
    meter: str = ""
    code: str = ""
    error_class: str = ""
    age: str = ""
    q: str = ""

    def __post_init__(self) -> None:
        if self.status not in DEAD_STATUSES:
            raise ValueError(f"status must be one of {', '.join(DEAD_STATUSES)}")
        if self.age not in AGES:
            raise ValueError(f"age must be one of {', '.join(a for a in AGES if a)}")
        for name in ("tenant", "meter", "code", "error_class", "q"):
            if len(getattr(self, name)) > 200:
                raise ValueError(f"{name} is too long")

    def params(self) -> dict[str, str]:
        """The non-empty filters, as query-string parameters."""
        return {k: v for k, v in self.__dict__.items() if v and not (k == "status" and
                                                                      v == DEAD)}

    def conditions(self, now: datetime) -> list[Any]:
        where: list[Any] = [status_is(self.status), T.c.dead_at.is_not(None)]
        if self.tenant:
            where.append(T.c.tenant_id == self.tenant)
        if self.meter:
            where.append(T.c.meter == self.meter)
        if self.code:
            where.append(T.c.last_error_code == self.code)
        if self.error_class:
            where.append(T.c.last_error_class == self.error_class)
        if self.q:
            where.append(or_(_contains(T.c.last_error_message, self.q),
                             _contains(T.c.dead_reason, self.q),
                             T.c.idempotency_key == self.q))
        age = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7)}
        if self.age in age:
            where.append(T.c.dead_at >= now - age[self.age])
        elif self.age == "gt24h":
            where.append(T.c.dead_at < now - timedelta(days=1))
        elif self.age == "gt7d":
            where.append(T.c.dead_at < now - timedelta(days=7))
        elif self.age == "near_limit":
            where.append(T.c.occurred_at < now - (MAX_AGE - NEAR_LIMIT))
        return where


def _contains(column: Any, q: str) -> Any:
    """``ascii_icontains(column, q)``, tested first, when ``q`` has two or more characters
    in a row that are not ASCII letters (as ids have: ``cus_…000042``), on whether ``column``
    holds those characters as they are: a plain ``LIKE``, which needs no lowered copy of each
    text, rules out nearly every row before the ``ILIKE`` (which does) is asked."""
    runs = re.findall(r"[^A-Za-z]{2,}", q)
    if not runs:
        return ascii_icontains(column, q)
    run = max(runs, key=len)
    escaped = run.replace("/", "//").replace("%", "/%").replace("_", "/_")
    return and_(column.like(f"%{escaped}%", escape="/"), ascii_icontains(column, q))


DEAD_COLUMNS = (T.c.id, T.c.tenant_id, T.c.meter, T.c.quantity, T.c.idempotency_key,
                T.c.occurred_at, T.c.status, T.c.attempt_count, T.c.call_count, T.c.last_outcome,
                T.c.last_error_class, T.c.last_error_code, T.c.last_http_status,
                T.c.last_error_message, T.c.dead_reason, T.c.dead_at, T.c.first_unknown_at,
                T.c.resolved_at, T.c.resolved_by, T.c.resolve_reason, T.c.resolve_note)


def check_row(row: dict[str, Any], *, now: datetime, window_seconds: float) -> RequeueCheck:
    """:func:`~webapp.outbox.guards.requeue_check` for a row read by this module."""
    return requeue_check(status=row["status"], occurred_at=row["occurred_at"],
                         dead_reason=row.get("dead_reason"),
                         first_unknown_at=row.get("first_unknown_at"), now=now,
                         window_seconds=window_seconds)


def _pieces(filters: DeadFilters) -> tuple[Any, ...]:
    """Dead rows are read in two disjoint pieces, each through its own index (``DEAD_PIECES``);
    resolved ones through ``ix_outbox_resolved`` alone."""
    return DEAD_PIECES if filters.status == DEAD else ()


def dead_letters(engine: Engine, filters: DeadFilters, *, now: datetime, window_seconds: float,
                 after: Cursor | None = None, before: Cursor | None = None,
                 limit: int = 50) -> Page:
    """One page of dead (or resolved) events, newest death first, keyset-paginated on
    (dead_at, id). The page's (dead_at, id) are found first, from the index alone where it
    can be (``ix_outbox_dead_errors`` holds every column the filters and the text search
    read, so the search reads no heap page per dead event), then its rows by id, in the same
    snapshot. Each dead row carries ``requeue`` (its requeue check) and ``near_limit``."""
    stmt = select(T.c.dead_at, T.c.id).where(*filters.conditions(now))
    with reading(engine) as conn:
        keys = keyset(conn, stmt, T.c.dead_at, T.c.id, after=after, before=before,
                      limit=limit, key="dead_at", parts=_pieces(filters))
        ids = [k["id"] for k in keys.rows]
        found = {r["id"]: r for r in (row_dict(r) for r in conn.execute(
            select(*DEAD_COLUMNS).where(T.c.id.in_(ids))))} if ids else {}
    rows = [found[i] for i in ids]  # one snapshot (``reading``): every id is still there
    for r in rows:
        r["requeue"] = (check_row(r, now=now, window_seconds=window_seconds).value
                        if r["status"] == DEAD else None)
        r["near_limit"] = r["occurred_at"] < now - (MAX_AGE - NEAR_LIMIT)
    return Page(rows, keys.next, keys.prev)


@dataclass(frozen=True)
class ErrorGroup:
    kind: str
    error_class: str | None
    code: str | None
    http_status: int | None
    events: int
    quantity: int
    tenants: int
    first_dead_at: datetime | None
    last_dead_at: datetime | None


#: The kinds of death as the groups' statement numbers them (``_grouped``): a small integer
#: per row is cheaper to hash, 210,000 times, than the kind's name.
KIND_CODES = ("unknown_past_window", "exhausted", "permanent")


def dead_letter_groups(engine: Engine, filters: DeadFilters, *, now: datetime,
                       limit: int = 50) -> list[ErrorGroup]:
    """Dead (or resolved) events matching ``filters``, grouped by error: why they died,
    error class, code and HTTP status. Largest groups first.

    Dead events are read from ``ix_outbox_dead_errors`` alone, and from
    ``ix_outbox_dead_outsize`` too when it holds any (texts too long for the first).
    Tenants are counted in two steps, per tenant within each group, then per group: one
    hash aggregation each, where ``count(DISTINCT)`` would sort every group's rows. The
    first holds a group per tenant and error (118,000 of 210,000 dead events at 10 million
    rows): it runs with :func:`~webapp.read.usage_sources.many_rows`' memory, which keeps it
    in one batch instead of five spilled to disk."""
    kind = case((T.c.dead_reason == DEAD_PAST_WINDOW, literal(0)),
                (T.c.dead_reason.startswith(DEAD_EXHAUSTED, autoescape=True), literal(1)),
                else_=literal(2))
    base = select(kind.label("kind"), T.c.last_error_class, T.c.last_error_code,
                  T.c.last_http_status, T.c.quantity, T.c.tenant_id, T.c.dead_at).where(
        *filters.conditions(now))
    pieces = [base.where(p) for p in _pieces(filters)] or [base]
    with reading(engine) as conn:
        if len(pieces) > 1 and conn.execute(
                select(T.c.id).where(status_is(DEAD), DEAD_PIECES[1]).limit(1)).first() is None:
            # No dead row is too long for the covering index (the usual case): read it alone.
            # Over a union the planner underestimates the rows and sorts them all instead.
            pieces = pieces[:1]
        many_rows(conn)
        rows = conn.execute(_grouped(pieces, limit)).all()
    return [ErrorGroup(KIND_CODES[k], c, code, h, int(n), int(q), int(t), as_utc(lo),
                       as_utc(hi))
            for k, c, code, h, n, q, t, lo, hi in rows]


def _grouped(pieces: list[Any], limit: int) -> Any:
    """The groups of the rows of ``pieces`` (disjoint), largest first."""
    rows: Any = union_all(*pieces) if len(pieces) > 1 else pieces[0]
    matching = rows.subquery()
    keys = (matching.c.kind, matching.c.last_error_class, matching.c.last_error_code,
            matching.c.last_http_status)
    per_tenant = (select(*keys, func.count().label("n"), func.sum(matching.c.quantity).label("q"),
                         func.min(matching.c.dead_at).label("lo"),
                         func.max(matching.c.dead_at).label("hi"))
                  .group_by(*keys, matching.c.tenant_id).subquery())
    keys = (per_tenant.c.kind, per_tenant.c.last_error_class, per_tenant.c.last_error_code,
            per_tenant.c.last_http_status)
    events = int_sum(per_tenant.c.n)
    return (select(*keys, events, int_sum(per_tenant.c.q), func.count(),
                   func.min(per_tenant.c.lo), func.max(per_tenant.c.hi))
            .group_by(*keys).order_by(events.desc()).limit(limit))


@dataclass(frozen=True)
class RequeuePreview:
    """What "requeue all matching" would do, and the exact ids it would act on."""

    matched: int                 # matching dead events looked at (capped at MAX_BULK + 1)
    capped: bool                 # more matched than one bulk action takes
    ok_ids: list[int]
    force_ids: list[int]         # outcome unknown past the 24 h window: only with force
    too_old_ids: list[int]       # past Stripe's 35-day limit: excluded
    near_limit: int              # of ok+force, within 7 days of the limit
    tenants: int
    units: int
    force_units: int


def requeue_preview(engine: Engine, filters: DeadFilters, *, now: datetime,
                    window_seconds: float, cap: int = MAX_BULK) -> RequeuePreview:
    """Snapshot the dead events matching ``filters`` (oldest deaths first, at most ``cap``),
    each sorted by the requeue rule compiled to SQL (:data:`REQUEUE_RULE`), so a preview of
    thousands reads no timestamps into Python. Raises ``ValueError`` unless the filters
    select dead events."""
    if filters.status != DEAD:
        raise ValueError("only dead events can be requeued")
    near_cut = now - (MAX_AGE - NEAR_LIMIT)
    verdict = rule_sql(REQUEUE_RULE, RequeueCheck.OK.value, dict(T.c.items()), now=now,
                       window_seconds=window_seconds)
    stmt = (select(T.c.id, T.c.tenant_id, T.c.quantity, verdict, T.c.occurred_at < near_cut)
            .where(*filters.conditions(now)).order_by(T.c.dead_at, T.c.id).limit(cap + 1))
    with reading(engine) as conn:
        rows = conn.execute(stmt).all()
    by: dict[str, list[int]] = {c.value: [] for c in RequeueCheck}
    tenants: set[str] = set()
    units = force_units = near = 0
    for ident, tenant, quantity, check, is_near in rows[:cap]:
        by[check].append(int(ident))
        if check in (RequeueCheck.OK.value, RequeueCheck.FORCE.value):
            tenants.add(tenant)
            units += int(quantity)
            force_units += int(quantity) if check == RequeueCheck.FORCE.value else 0
            near += 1 if is_near else 0
    return RequeuePreview(len(rows), len(rows) > cap, by[RequeueCheck.OK.value],
                          by[RequeueCheck.FORCE.value], by[RequeueCheck.TOO_OLD.value], near,
                          len(tenants), units, force_units)


def classify_for_requeue(engine: Engine, ids: Sequence[int], *, now: datetime,
                         window_seconds: float) -> dict[str, list[int]]:
    """The given events by requeue check (``ok``/``force``/``too_old``/``wrong_status``; an id
    naming no event counts as ``wrong_status``), as the requeue itself would judge them."""
    out: dict[str, list[int]] = {c.value: [] for c in RequeueCheck}
    with reading(engine) as conn:
        checks = requeue_checks(conn, ids, now=now, window_seconds=window_seconds)
    for i in ids:
        out[(checks[i] or RequeueCheck.WRONG_STATUS).value].append(i)
    return out
