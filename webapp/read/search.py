"""The search box: what a query names, from whatever a person pasted — a tenant (its id, a
prefix of it, or part of its name), a Stripe customer (``cus_…``: the tenants billed to it), a
Stripe request id (``req_…``: the calls answered under it), an event id, an idempotency key or
a prefix of one, or the identifier an event is sent to Stripe with (the key itself, a
requeued event's ``<key>~rN``, or a call's ``<identifier>:rN:<digest>`` idempotency key).

Every lookup goes through an index: equality on a primary key or an indexed column, and
prefixes as ranges (``lo <= column < hi``) over the same indexes. A range is what a B-tree
serves under any collation; it is exactly "starts with" where the collation orders by code
point (SQLite's ``BINARY``, PostgreSQL's ``C`` and ``C.UTF-8``), and the ``LIKE`` beside it
keeps only true prefixes where it does not. The one scan is the tenant-name search over
``billing_tenants`` (a substring has no index): bounded by its ``LIMIT``, and skipped for a
query shaped like a Stripe id (at 100,000 tenants a miss reads them all in about 20 ms).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, Connection, Engine, Select, and_, select

from ..db import reading
from ..outbox.sql import ATTEMPTS, TENANTS, T, ascii_icontains, row_dict
from ..outbox.states import identifier_of
from .billed import tenants_billed_to
from .numbers import MAX_ID, ascii_int

#: Rows shown per kind; the page says when there are more.
GROUP_LIMIT = 20
#: The longest query (idempotency keys and tenant ids are at most 100 characters; a call's
#: idempotency key adds a retry suffix, a request id is at most 255).
MAX_QUERY = 255
_REQUEUED = re.compile(r"~r[0-9]+$")
#: A Stripe customer or request id, as pasted from Stripe.
_STRIPE_ID = re.compile(r"(cus|req)_[A-Za-z0-9]+")


@dataclass
class Group:
    """The hits of one kind, at most ``GROUP_LIMIT``; ``more``: there were others."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    more: bool = False

    def add(self, row: dict[str, Any], key: str, why: str) -> None:
        """Add ``row`` unless a row with the same ``key`` is already there."""
        if any(r[key] == row[key] for r in self.rows):
            return
        if len(self.rows) >= GROUP_LIMIT:
            self.more = True
            return
        self.rows.append({**row, "why": why})


@dataclass
class Results:
    """What a query found, by kind: tenants, events, and Stripe requests (calls)."""

    query: str
    tenants: Group = field(default_factory=Group)
    events: Group = field(default_factory=Group)
    requests: Group = field(default_factory=Group)

    @property
    def total(self) -> int:
        return len(self.tenants.rows) + len(self.events.rows) + len(self.requests.rows)

    def only(self) -> tuple[str, dict[str, Any]] | None:
        """The single hit, as (kind, row), when there is exactly one and no more."""
        if self.total != 1 or self.tenants.more or self.events.more or self.requests.more:
            return None
        for kind in ("tenants", "events", "requests"):
            rows = getattr(self, kind).rows
            if rows:
                return kind, rows[0]
        return None  # pragma: no cover - total is 1


def prefix_range(column: Any, prefix: str) -> ColumnElement[bool]:
    """``column`` starts with ``prefix``: a range an index on the column serves, and a
    ``LIKE`` (wildcards in ``prefix`` escaped) that keeps only true prefixes."""
    last = ord(prefix[-1])
    bounds = [column >= prefix]
    if last < 0x10FFFF:
        bounds.append(column < prefix[:-1] + chr(last + 1))
    return and_(*bounds, column.startswith(prefix, autoescape=True))


_TENANT_COLS = (TENANTS.c.tenant_id, TENANTS.c.name, TENANTS.c.stripe_customer_id)
_EVENT_COLS = (T.c.id, T.c.tenant_id, T.c.meter, T.c.quantity, T.c.status, T.c.occurred_at,
               T.c.idempotency_key, T.c.stripe_identifier)


def _rows(conn: Connection, stmt: Select[Any]) -> list[dict[str, Any]]:
    return [row_dict(r) for r in conn.execute(stmt.limit(GROUP_LIMIT + 1))]


def _fill(group: Group, rows: list[dict[str, Any]], key: str, why: str) -> None:
    for row in rows:
        group.add(row, key, why)


def _tenants(conn: Connection, q: str, out: Group) -> None:
    _fill(out, _rows(conn, select(*_TENANT_COLS).where(TENANTS.c.tenant_id == q)),
          "tenant_id", "tenant id")
    if q.startswith("cus_"):
        _fill(out, _rows(conn, select(*_TENANT_COLS).where(TENANTS.c.stripe_customer_id == q)
                         .order_by(TENANTS.c.tenant_id)), "tenant_id", "billed to this customer")
        # Tenants mapped elsewhere since, whose earlier usage went to this customer.
        earlier = tenants_billed_to(conn, q)[:GROUP_LIMIT + 1]
        if earlier:
            _fill(out, _rows(conn, select(*_TENANT_COLS).where(TENANTS.c.tenant_id.in_(earlier))
                             .order_by(TENANTS.c.tenant_id)), "tenant_id",
                  "its usage went to this customer")
    _fill(out, _rows(conn, select(*_TENANT_COLS).where(prefix_range(TENANTS.c.tenant_id, q))
                     .order_by(TENANTS.c.tenant_id)), "tenant_id", "tenant id starts with it")
    if not _STRIPE_ID.fullmatch(q):  # Stripe's ids are not in names: spare the scan
        _fill(out, _rows(conn, select(*_TENANT_COLS).where(ascii_icontains(TENANTS.c.name, q))),
              "tenant_id", "name contains it")


def _events(conn: Connection, q: str, out: Group) -> None:
    number = ascii_int(q)  # "²" or "١٢" is text, looked for as keys below, not an id
    if number is not None and 1 <= number <= MAX_ID:
        _fill(out, _rows(conn, select(*_EVENT_COLS).where(T.c.id == number)), "id", "event id")
    ident = identifier_of(q)
    for value, why in ((q, "idempotency key"), (ident, "sent to Stripe as this identifier")):
        _fill(out, _rows(conn, select(*_EVENT_COLS).where(T.c.idempotency_key == value)),
              "id", why)
        _fill(out, _rows(conn, select(*_EVENT_COLS).where(T.c.stripe_identifier == value)),
              "id", "sent to Stripe as this identifier")
    requeued_from = _REQUEUED.sub("", ident)
    if requeued_from != ident:
        _fill(out, _rows(conn, select(*_EVENT_COLS).where(T.c.idempotency_key == requeued_from)),
              "id", "requeued under this identifier")
    _fill(out, _rows(conn, select(*_EVENT_COLS).where(prefix_range(T.c.idempotency_key, q))
                     .order_by(T.c.idempotency_key)), "id", "idempotency key starts with it")


def _requests(conn: Connection, q: str, out: Group) -> None:
    if not q.startswith("req_"):
        return
    stmt = (select(ATTEMPTS.c.id, ATTEMPTS.c.event_id, ATTEMPTS.c.attempted_at,
                   ATTEMPTS.c.outcome, ATTEMPTS.c.http_status, ATTEMPTS.c.error_code,
                   ATTEMPTS.c.stripe_request_id, T.c.tenant_id, T.c.status)
            .join(T, T.c.id == ATTEMPTS.c.event_id, isouter=True)
            .where(ATTEMPTS.c.stripe_request_id == q)
            .order_by(ATTEMPTS.c.attempted_at.desc(), ATTEMPTS.c.id.desc()))
    _fill(out, _rows(conn, stmt), "id", "Stripe request id")


def search(engine: Engine, query: str) -> Results:
    """Everything ``query`` (stripped, non-empty, at most :data:`MAX_QUERY` characters) names,
    at most :data:`GROUP_LIMIT` rows of each kind; raises ``ValueError`` on an empty query."""
    q = query.strip()
    if not q or len(q) > MAX_QUERY:
        raise ValueError("a search needs a query of 1 to 255 characters")
    out = Results(q)
    with reading(engine) as conn:
        _tenants(conn, q, out.tenants)
        _events(conn, q, out.events)
        _requests(conn, q, out.requests)
    return out
