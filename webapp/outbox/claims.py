"""Claiming due events, and giving claimed events back: the claim statement, release and the
rescue of expired claims. Short transactions only; no network call happens in here.

Each claim carries a fresh token; every later write for a claimed event is guarded by
``claim_token = :token`` (:func:`held`), so a worker whose claim expired and was taken over
cannot overwrite the newer claim's outcome (fencing).
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Integer,
    String,
    and_,
    bindparam,
    case,
    func,
    literal,
    select,
    text,
    union_all,
)
from sqlalchemy import update as sa_update
from sqlalchemy.dialects import postgresql

from ..status import IN_FLIGHT, sql_list
from .sendable import PG_SENDABLE_NOW, PG_WAITING, WAITING_SQL, sendable_now_sql
from .sql import PROCESSING_SQL, SENT_AS, TENANTS, T, id_in
from .states import EventView, Status, idempotency_key

#: Where a claimed event goes back to without a call: pending if never called, else retrying.
RELEASED_STATUS = case((T.c.call_count == 0, Status.PENDING.value),
                       else_=Status.RETRYING.value)

#: PostgreSQL: lanes fall into this many shards, by a hash the claim computes
#: (``_LANE_SHARD``); draining workers split them (``webapp.worker.shards``) and each claims
#: from its own shards before it takes anything else.
SHARDS = 64


def held(conn: Connection, ids: Sequence[int], token: str) -> ColumnElement[bool]:
    """The events of ``ids`` still held under ``token``: the guard of every write a claim
    makes after its calls (fencing).

    The claim token is set only by a claim and cleared by every write that moves an event out
    of ``processing`` (outcome, release, rescue, requeue), so ``claim_token = :token`` already
    means "processing, under this claim". ``status`` is deliberately not repeated: with
    statistics taken while few rows were processing, it lured the planner onto the partial
    indexes over status, which it then walked — dead entries of earlier batches included —
    filtering the id list row by row. Without it the primary key is the only way in.
    """
    return and_(id_in(conn, T.c.id, ids), T.c.claim_token == token)


class ClaimedEvent(NamedTuple):
    """An event held by one worker under ``token`` until ``deadline``. (A named tuple: a
    batch builds a thousand of these, and a tuple is built several times faster than a
    frozen dataclass.)"""

    id: int
    tenant_id: str
    meter: str
    quantity: int
    identifier: str
    occurred_at: datetime
    stripe_customer_id: str
    attempt_count: int
    call_count: int
    key_generation: int
    first_unknown_at: datetime | None

    @property
    def lane(self) -> tuple[str, str]:
        """The (Stripe customer, meter) pair Stripe allows one concurrent call for."""
        return (self.stripe_customer_id, self.meter)

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.identifier, self.key_generation)

    def view(self) -> EventView:
        return EventView(Status.PROCESSING.value, self.attempt_count, self.call_count,
                         self.key_generation, self.first_unknown_at)


@dataclass
class Claim:
    """One batch held by one worker: its token, its deadline and its events (by id)."""

    token: str
    worker: str
    deadline: datetime
    events: list[ClaimedEvent] = field(default_factory=list)


def new_token() -> str:
    """A fresh claim token (128 random bits)."""
    return secrets.token_hex(16)


_CLAIM_COLUMNS = (T.c.id, T.c.tenant_id, T.c.meter, T.c.quantity, SENT_AS, T.c.occurred_at,
                  T.c.stripe_customer_id, T.c.attempt_count, T.c.call_count,
                  T.c.key_generation, T.c.first_unknown_at)

_LANE_SHARD = (f"(hashtextextended(COALESCE(o.stripe_customer_id, t.stripe_customer_id) "
               f"|| chr(31) || o.meter, 0) & {SHARDS - 1})")

# The claim on PostgreSQL, written out: the tenant's customer is looked up by a join in the
# candidate scan (not a subquery per row), and the UPDATE finds the picked rows by primary key
# from an array (an index lookup each, never a join that walks the table).
#
# Two scans feed one UPDATE: first the events a draft invoice still needs, soonest to
# finalize first (``ix_outbox_invoice_first``: empty at most times, so this costs an empty
# index scan), then the other due events for what is left of the batch. The second leaves the
# first's events out by their mark, so no row is picked twice.
_PG_CANDIDATES = """
    SELECT o.id
    FROM stripe_usage_outbox AS o
    LEFT JOIN billing_tenants AS t ON t.tenant_id = o.tenant_id
    WHERE {sendable}
      AND o.invoice_finalizes_at IS {mark}
      AND NOT (COALESCE(o.stripe_customer_id, t.stripe_customer_id) || chr(31) || o.meter
               = ANY(:avoid))
      {meters}
      {shards}
    ORDER BY {order}
    LIMIT {limit}
    FOR UPDATE OF o SKIP LOCKED"""

_PG_CLAIM_SQL = """
WITH invoice_first AS MATERIALIZED ({first}
), the_rest AS MATERIALIZED ({rest}
)
UPDATE stripe_usage_outbox AS o
SET status = {processing}, claim_token = :token, claimed_by = :worker,
    processing_deadline_at = :deadline, updated_at = :now,
    stripe_customer_id = COALESCE(o.stripe_customer_id,
        (SELECT t.stripe_customer_id FROM billing_tenants AS t WHERE t.tenant_id = o.tenant_id)),
    first_attempt_at = COALESCE(o.first_attempt_at, :now)
WHERE o.id = ANY(ARRAY(SELECT id FROM invoice_first UNION ALL SELECT id FROM the_rest))
  AND {waiting}
RETURNING o.id, o.tenant_id, o.meter, o.quantity,
          COALESCE(o.stripe_identifier, o.idempotency_key), o.occurred_at,
          o.stripe_customer_id, o.attempt_count, o.call_count, o.key_generation,
          o.first_unknown_at
"""


@functools.cache
def _pg_claim(skipping: bool, meters: bool) -> Any:
    """The claim statement: leaving out the lane shards this worker does not own
    (``skipping``), and events of meters not active at Stripe (``meters``)."""
    binds: list[Any] = [bindparam("avoid", type_=postgresql.ARRAY(String))]
    if skipping:
        binds.append(bindparam("skip_shards", type_=postgresql.ARRAY(Integer)))
    if meters:
        binds.append(bindparam("meters", type_=postgresql.ARRAY(String)))
    terms = dict(sendable=PG_SENDABLE_NOW,
                 shards=f"AND NOT {_LANE_SHARD} = ANY(:skip_shards)" if skipping else "",
                 meters="AND o.meter = ANY(:meters)" if meters else "")
    first = _PG_CANDIDATES.format(
        mark="NOT NULL", order="o.invoice_finalizes_at, o.next_attempt_at, o.id",
        limit=":limit", **terms)
    rest = _PG_CANDIDATES.format(
        mark="NULL", order="o.next_attempt_at, o.id",
        limit="(:limit - (SELECT count(*) FROM invoice_first))", **terms)
    return text(_PG_CLAIM_SQL.format(first=first, rest=rest, waiting=PG_WAITING,
                                     processing=sql_list(IN_FLIGHT))
                ).bindparams(*binds)


def claim_batch(engine: Engine, *, worker: str, limit: int, now: datetime,
                claim_timeout_seconds: float, avoid_lanes: Iterable[tuple[str, str]] = (),
                skip_shards: Sequence[int] = (), fill_from_skipped: bool = True,
                meters: Sequence[str] | None = None) -> Claim:
    """Claim up to ``limit`` due events of mapped tenants, in a transaction of its own that
    commits before this returns (see :func:`claim_in`)."""
    with engine.begin() as conn:
        return claim_in(conn, worker=worker, limit=limit, now=now,
                        claim_timeout_seconds=claim_timeout_seconds, avoid_lanes=avoid_lanes,
                        skip_shards=skip_shards, fill_from_skipped=fill_from_skipped,
                        meters=meters)


def claim_in(conn: Connection, *, worker: str, limit: int, now: datetime,
             claim_timeout_seconds: float, avoid_lanes: Iterable[tuple[str, str]] = (),
             skip_shards: Sequence[int] = (), fill_from_skipped: bool = True,
             meters: Sequence[str] | None = None) -> Claim:
    """Claim up to ``limit`` due events of mapped tenants in one statement, in the caller's
    transaction: first those a draft invoice still needs (marked with when it finalizes,
    :mod:`webapp.outbox.invoices`), soonest to finalize first; then the oldest due.

    PostgreSQL: ``SELECT … FOR UPDATE SKIP LOCKED`` feeds ``UPDATE … RETURNING``, so
    concurrent claimers never wait on or see each other's rows, even before either commits.
    SQLite (no SKIP LOCKED): the same UPDATE, guarded by "still claimable", inside a write
    transaction, so a row is won by exactly one claimer. The customer is fixed on the row
    here, at its first claim.

    ``avoid_lanes``: lanes busy in this process, whose events are left for later.
    ``skip_shards`` (PostgreSQL): the lane shards this worker does not own. Their events are
    claimed only when its own do not fill the batch and ``fill_from_skipped``, by a second
    statement in the same transaction. ``meters``: the event names Stripe has an active
    meter for; events of other meters wait (None: no such filter).
    """
    if meters is not None and not meters:
        return Claim(token=new_token(), worker=worker,
                     deadline=now + timedelta(seconds=claim_timeout_seconds))
    token = new_token()
    deadline = now + timedelta(seconds=claim_timeout_seconds)
    lanes = list(avoid_lanes)
    if conn.dialect.name == "postgresql":
        params: dict[str, Any] = dict(now=now, limit=limit, token=token, worker=worker,
                                      deadline=deadline,
                                      avoid=[f"{c}\x1f{m}" for c, m in lanes])
        by_meter = meters is not None
        if by_meter:
            params["meters"] = list(meters or ())
        if skip_shards:
            # Owning no shard at all, the first statement could only scan for nothing.
            rows = conn.execute(_pg_claim(True, by_meter),
                                dict(params, skip_shards=list(skip_shards))).all() \
                if len(skip_shards) < SHARDS else []
            if fill_from_skipped and len(rows) < limit:
                params.update(limit=limit - len(rows))
                rows = [*rows, *conn.execute(_pg_claim(False, by_meter), params).all()]
        else:
            rows = conn.execute(_pg_claim(False, by_meter), params).all()
    else:
        rows = conn.execute(_sqlite_claim(token, worker, limit, now, deadline, lanes,
                                          meters)).all()
    make = ClaimedEvent._make
    events = [make(row) for row in rows]
    events.sort(key=lambda e: e.id)
    return Claim(token=token, worker=worker, deadline=deadline, events=events)


def _sqlite_claim(token: str, worker: str, limit: int, now: datetime, deadline: datetime,
                  lanes: list[tuple[str, str]], meters: Sequence[str] | None) -> Any:
    """The claim as one ``UPDATE … WHERE id IN (due candidates) AND still claimable``."""
    mapped = (select(TENANTS.c.stripe_customer_id)
              .where(TENANTS.c.tenant_id == T.c.tenant_id)
              .scalar_subquery())
    conditions: list[Any] = [*sendable_now_sql(now, mapped)]
    if lanes:
        conditions.append(func.coalesce(T.c.stripe_customer_id, mapped).concat("\x1f")
                          .concat(T.c.meter).not_in([f"{c}\x1f{m}" for c, m in lanes]))
    if meters is not None:
        conditions.append(T.c.meter.in_(list(meters)))
    # Draft invoices' events first, soonest to finalize first; then the rest of the batch.
    first = (select(T.c.id, literal(0).label("part"),
                    T.c.invoice_finalizes_at.label("due"), T.c.next_attempt_at.label("next"))
             .where(*conditions, text("stripe_usage_outbox.invoice_finalizes_at IS NOT NULL"))
             .order_by(T.c.invoice_finalizes_at, T.c.next_attempt_at, T.c.id)
             .limit(limit).subquery())
    rest = (select(T.c.id, literal(1).label("part"), T.c.next_attempt_at.label("due"),
                   T.c.next_attempt_at.label("next"))
            .where(*conditions, T.c.invoice_finalizes_at.is_(None))
            .order_by(T.c.next_attempt_at, T.c.id).limit(limit).subquery())
    both = union_all(select(first), select(rest)).subquery()
    candidates = (select(both.c.id)
                  .order_by(both.c.part, both.c.due, both.c.next, both.c.id).limit(limit))
    values = dict(status=Status.PROCESSING.value, claim_token=token, claimed_by=worker,
                  processing_deadline_at=deadline, updated_at=now,
                  stripe_customer_id=func.coalesce(T.c.stripe_customer_id, mapped),
                  first_attempt_at=func.coalesce(T.c.first_attempt_at, now))
    return (sa_update(T).where(T.c.id.in_(candidates), WAITING_SQL).values(**values)
            .returning(*_CLAIM_COLUMNS))


def release_claimed(conn: Connection, token: str, ids: Sequence[int], *, now: datetime,
                    delay_seconds: float = 0.0) -> int:
    """Return claimed events to the queue untouched (no attempt spent), claimable at once
    (or after ``delay_seconds``), in the caller's transaction. Returns how many."""
    values: dict[str, object] = dict(status=RELEASED_STATUS, claim_token=None, claimed_by=None,
                                     processing_deadline_at=None, updated_at=now)
    if delay_seconds > 0:
        values["next_attempt_at"] = now + timedelta(seconds=delay_seconds)
    done = conn.execute(sa_update(T).where(held(conn, ids, token)).values(**values))
    return done.rowcount


def release(engine: Engine, token: str, ids: Sequence[int], *, now: datetime,
            delay_seconds: float = 0.0) -> int:
    """:func:`release_claimed` in a transaction of its own."""
    if not ids:
        return 0
    with engine.begin() as conn:
        return release_claimed(conn, token, ids, now=now, delay_seconds=delay_seconds)


def rescue_expired(engine: Engine, *, now: datetime) -> int:
    """Return events whose claim deadline passed (their worker died) to the queue; how many.

    The dead worker may have sent the event before dying, so its outcome is unknown: the
    dedupe-window clock starts at the claim (if it had not already), which keeps a resend
    inside Stripe's 24-hour window or sends the event to a person.
    """
    claimed_at = T.c.first_attempt_at  # never later than this claim
    stmt = (sa_update(T)
            .where(PROCESSING_SQL, T.c.processing_deadline_at < now)
            .values(status=RELEASED_STATUS, claim_token=None, claimed_by=None,
                    processing_deadline_at=None, updated_at=now,
                    first_unknown_at=func.coalesce(T.c.first_unknown_at, claimed_at),
                    last_outcome="claim_expired"))
    with engine.begin() as conn:
        return conn.execute(stmt).rowcount
