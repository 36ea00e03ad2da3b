"""The mappings page at any number of tenants: a page of tenants in the order of their ids
(keyset: as fast on the last page as on the first), found by the start of their id, part of
their name or the start of their Stripe customer id; and the tenants whose events wait for a
customer, the first few with a count of the rest, or all of them a page at a time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Connection, Engine, func, or_, select

from ..db import reading
from ..outbox.sql import TENANTS, as_utc, ascii_icontains, row_dict
from .counts import UnmappedTenant, waiting_unmapped
from .search import prefix_range

#: Tenants on one page.
PER_PAGE = 50
#: Tenants waiting for a customer listed above the table; the rest are counted.
UNMAPPED_SHOWN = 20


@dataclass(frozen=True)
class MappingQuery:
    """Which tenants: ``text`` (an id's start, part of a name, a customer id's start), and
    the page (after or before a tenant id)."""

    text: str = ""
    after: str | None = None
    before: str | None = None
    limit: int = PER_PAGE


@dataclass(frozen=True)
class KeyPage:
    """One page of rows in the order of their tenant ids, and where the next and previous
    pages start (None: there is none)."""

    rows: list[Any]
    next: str | None
    prev: str | None


@dataclass(frozen=True)
class MappingsPage:
    tenants: KeyPage
    unmapped: list[UnmappedTenant]
    unmapped_total: int       # tenants waiting for a customer, shown or not


def _keyset(conn: Connection, stmt: Any, column: Any,
            query: MappingQuery) -> list[dict[str, Any] | None]:
    """``stmt`` ordered by ``column``, ``limit + 1`` rows after or before a key (the extra
    row says whether another page exists)."""
    if query.before is not None:
        got = [row_dict(r) for r in conn.execute(
            stmt.where(column < query.before).order_by(column.desc()).limit(query.limit + 1))]
        more: list[dict[str, Any] | None] = [None] if len(got) > query.limit else []
        return list(reversed(got[:query.limit])) + more
    if query.after is not None:
        stmt = stmt.where(column > query.after)
    return [row_dict(r) for r in conn.execute(stmt.order_by(column).limit(query.limit + 1))]


def _page(rows: list[dict[str, Any] | None], query: MappingQuery, key: str) -> KeyPage:
    """Rows from :func:`_keyset` as a page: going back, a trailing ``None`` marks more
    before; going forward, an extra row marks more after."""
    if query.before is not None:
        more_before = bool(rows) and rows[-1] is None
        shown = [r for r in rows if r is not None]
        return KeyPage(shown, shown[-1][key] if shown else None,
                       shown[0][key] if shown and more_before else None)
    ahead = [r for r in rows[:query.limit] if r is not None]
    return KeyPage(ahead, ahead[-1][key] if len(rows) > query.limit else None,
                   ahead[0][key] if ahead and query.after is not None else None)


def _matches(text: str) -> ColumnElement[bool]:
    """A tenant whose id starts with ``text`` (its primary key), whose customer id does
    (``ix_tenants_customer``), or whose name holds it (a scan of the names)."""
    return or_(prefix_range(TENANTS.c.tenant_id, text),
               prefix_range(TENANTS.c.stripe_customer_id, text),
               ascii_icontains(TENANTS.c.name, text))


def _unmapped(rows: Any) -> list[UnmappedTenant]:
    return [UnmappedTenant(r["tenant_id"], int(r["n"]), as_utc(r["oldest"])) for r in rows]


def mappings_page(engine: Engine, query: MappingQuery) -> MappingsPage:
    """A page of tenants with their customers, the tenants waiting longest for one (most
    events first) and how many wait in all."""
    stmt = select(TENANTS.c.tenant_id, TENANTS.c.name, TENANTS.c.stripe_customer_id,
                  TENANTS.c.updated_at)
    if query.text:
        stmt = stmt.where(_matches(query.text))
    with reading(engine) as conn:
        page = _page(_keyset(conn, stmt, TENANTS.c.tenant_id, query), query, "tenant_id")
        first, total = waiting_for_customer(conn)
    return MappingsPage(page, first, total)


def waiting_for_customer(conn: Connection,
                         shown: int = UNMAPPED_SHOWN) -> tuple[list[UnmappedTenant], int]:
    """The ``shown`` tenants with the most events waiting for a customer, and how many
    tenants wait in all (in the same pass: the count is a window over every group)."""
    waiting = waiting_unmapped()
    rows = conn.execute(select(waiting, func.count().over().label("total")).order_by(
        waiting.c.n.desc(), waiting.c.tenant_id).limit(shown)).mappings().all()
    first = _unmapped(rows)
    total = int(rows[0]["total"]) if rows else 0
    return first, total


def unmapped_page(engine: Engine, query: MappingQuery) -> KeyPage:
    """Every tenant waiting for a customer, a page at a time in the order of their ids
    (``text``: ids that start with it)."""
    with reading(engine) as conn:
        waiting = waiting_unmapped()
        stmt = select(waiting)
        if query.text:
            stmt = stmt.where(prefix_range(waiting.c.tenant_id, query.text))
        page = _page(_keyset(conn, stmt, waiting.c.tenant_id, query), query, "tenant_id")
    return KeyPage(_unmapped(page.rows), page.next, page.prev)
