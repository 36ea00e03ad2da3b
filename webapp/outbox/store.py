"""Claiming, recording outcomes, releasing and rescuing events: every write to ``status``
that the drainer makes. Short transactions only; no network call happens in here.

Each claim carries a fresh token; every later write for a claimed event is guarded by
``claim_token = :token`` (a token exists only while its event is ``processing``: see
``_held``), so a worker whose claim expired and was taken over cannot overwrite the newer
claim's outcome (fencing).
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple, cast

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    Engine,
    Integer,
    String,
    Table,
    Text,
    and_,
    any_,
    bindparam,
    case,
    func,
    insert,
    or_,
    select,
    text,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy import update as sa_update
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from ..models import Control, DeliveryAttempt, OutboxEvent, Tenant
from .states import (
    COUNTED,
    CallResult,
    EventView,
    Outcome,
    Policy,
    Status,
    Transition,
    idempotency_key,
    transition,
)

T = cast(Table, OutboxEvent.__table__)
TENANTS = cast(Table, Tenant.__table__)
ATTEMPTS = cast(Table, DeliveryAttempt.__table__)
CONTROL = cast(Table, Control.__table__)

# Literal predicates, not bound parameters: PostgreSQL can then prove they imply the partial
# indexes' predicates, even in the generic plans of prepared statements.
CLAIMABLE_SQL = text("stripe_usage_outbox.status IN ('pending', 'retrying')")
PROCESSING_SQL = text("stripe_usage_outbox.status = 'processing'")


def _held(conn: Connection, ids: Sequence[int], token: str) -> ColumnElement[bool]:
    """The events of ``ids`` still held under ``token``: the guard of every write a claim
    makes after its calls (fencing).

    The claim token is set only by a claim and cleared by every write that moves an event out
    of ``processing`` (outcome, release, rescue, requeue), so ``claim_token = :token`` already
    means "processing, under this claim". ``status`` is deliberately not repeated: with
    statistics taken while few rows were processing, it lured the planner onto the partial
    indexes over status, which it then walked — dead entries of earlier batches included —
    filtering the id list row by row. Without it the primary key is the only way in.
    """
    return and_(_id_in(conn, ids), T.c.claim_token == token)

RELEASED_STATUS = case((T.c.call_count == 0, Status.PENDING.value), else_=Status.RETRYING.value)


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
        return (self.stripe_customer_id, self.meter)

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.identifier, self.key_generation)

    def view(self) -> EventView:
        return EventView(Status.PROCESSING.value, self.attempt_count, self.call_count,
                         self.key_generation, self.first_unknown_at)


@dataclass
class Claim:
    token: str
    worker: str
    deadline: datetime
    events: list[ClaimedEvent] = field(default_factory=list)


class AttemptRecord(NamedTuple):
    """One call made under a claim, with its classified result."""

    event: ClaimedEvent
    result: CallResult
    attempted_at: datetime
    duration_ms: int


@dataclass
class RecordSummary:
    sent: int = 0
    retrying: int = 0
    dead: int = 0
    released: int = 0
    fenced: int = 0           # outcomes not applied: the claim had been taken over


def new_token() -> str:
    return secrets.token_hex(16)


_CLAIM_COLUMNS = (T.c.id, T.c.tenant_id, T.c.meter, T.c.quantity, T.c.idempotency_key,
                  T.c.occurred_at, T.c.stripe_customer_id, T.c.attempt_count, T.c.call_count,
                  T.c.key_generation, T.c.first_unknown_at)


#: PostgreSQL: lanes fall into this many shards, by a hash the claim computes
#: (``_LANE_SHARD``); draining workers split them (``drainer.LaneLocks``) and each claims
#: from its own shards before it takes anything else.
SHARDS = 64
_LANE_SHARD = (f"(hashtextextended(COALESCE(o.stripe_customer_id, t.stripe_customer_id) "
               f"|| chr(31) || o.meter, 0) & {SHARDS - 1})")

# The claim on PostgreSQL, written out: the tenant's customer is looked up by a join in the
# candidate scan (not a subquery per row), and the UPDATE finds the picked rows by primary key
# from an array (an index lookup each, never a join that walks the table).
_PG_CLAIM_SQL = """
WITH picked AS MATERIALIZED (
    SELECT o.id
    FROM stripe_usage_outbox AS o
    LEFT JOIN billing_tenants AS t ON t.tenant_id = o.tenant_id
    WHERE o.status IN ('pending', 'retrying')
      AND o.next_attempt_at <= :now
      AND (o.stripe_customer_id IS NOT NULL OR t.stripe_customer_id IS NOT NULL)
      AND NOT (COALESCE(o.stripe_customer_id, t.stripe_customer_id) || chr(31) || o.meter
               = ANY(:avoid))
      {shards}
    ORDER BY o.next_attempt_at, o.id
    LIMIT :limit
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE stripe_usage_outbox AS o
SET status = 'processing', claim_token = :token, claimed_by = :worker,
    processing_deadline_at = :deadline, updated_at = :now,
    stripe_customer_id = COALESCE(o.stripe_customer_id,
        (SELECT t.stripe_customer_id FROM billing_tenants AS t WHERE t.tenant_id = o.tenant_id)),
    first_attempt_at = COALESCE(o.first_attempt_at, :now)
WHERE o.id = ANY(ARRAY(SELECT id FROM picked))
  AND o.status IN ('pending', 'retrying')
RETURNING o.id, o.tenant_id, o.meter, o.quantity, o.idempotency_key, o.occurred_at,
          o.stripe_customer_id, o.attempt_count, o.call_count, o.key_generation,
          o.first_unknown_at
"""
_PG_CLAIM = text(_PG_CLAIM_SQL.format(shards="")).bindparams(
    bindparam("avoid", type_=postgresql.ARRAY(String)))
# The same, leaving out the lane shards this worker does not own.
_PG_CLAIM_SKIPPING = text(_PG_CLAIM_SQL.format(
    shards=f"AND NOT {_LANE_SHARD} = ANY(:skip_shards)")).bindparams(
    bindparam("avoid", type_=postgresql.ARRAY(String)),
    bindparam("skip_shards", type_=postgresql.ARRAY(Integer)))


def claim_batch(engine: Engine, *, worker: str, limit: int, now: datetime,
                claim_timeout_seconds: float, avoid_lanes: Iterable[tuple[str, str]] = (),
                skip_shards: Sequence[int] = (), fill_from_skipped: bool = True) -> Claim:
    """Claim up to ``limit`` due events of mapped tenants in one statement, oldest due first.

    PostgreSQL: ``SELECT … FOR UPDATE SKIP LOCKED`` feeds ``UPDATE … RETURNING``, so
    concurrent claimers never wait on or see each other's rows. SQLite (no SKIP LOCKED):
    the same UPDATE, guarded by "still claimable", inside a write transaction, so a row is
    won by exactly one claimer. The customer is fixed on the row here, at its first claim.

    ``skip_shards`` (PostgreSQL): the lane shards this worker does not own. Their events are
    claimed only when its own do not fill the batch and ``fill_from_skipped``, by a second
    statement in the same transaction.
    """
    token = new_token()
    deadline = now + timedelta(seconds=claim_timeout_seconds)
    mapped = (select(TENANTS.c.stripe_customer_id)
              .where(TENANTS.c.tenant_id == T.c.tenant_id)
              .scalar_subquery())
    conditions: list[Any] = [CLAIMABLE_SQL, T.c.next_attempt_at <= now,
                  or_(T.c.stripe_customer_id.is_not(None), mapped.is_not(None))]
    lanes = list(avoid_lanes)
    if lanes:
        # Lanes busy in this process: leave their events for later instead of releasing them.
        conditions.append(func.coalesce(T.c.stripe_customer_id, mapped).concat("\x1f")
                          .concat(T.c.meter).not_in([f"{c}\x1f{m}" for c, m in lanes]))
    candidates = (select(T.c.id).where(*conditions)
                  .order_by(T.c.next_attempt_at, T.c.id).limit(limit))
    values = dict(status=Status.PROCESSING.value, claim_token=token, claimed_by=worker,
                  processing_deadline_at=deadline, updated_at=now,
                  stripe_customer_id=func.coalesce(T.c.stripe_customer_id, mapped),
                  first_attempt_at=func.coalesce(T.c.first_attempt_at, now))
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            params: dict[str, Any] = dict(
                now=now, limit=limit, token=token, worker=worker, deadline=deadline,
                avoid=[f"{c}\x1f{m}" for c, m in lanes])
            if skip_shards:
                # Owning no shard at all, the first statement could only scan for nothing.
                rows = conn.execute(_PG_CLAIM_SKIPPING,
                                    dict(params, skip_shards=list(skip_shards))).all() \
                    if len(skip_shards) < SHARDS else []
                if fill_from_skipped and len(rows) < limit:
                    params.update(limit=limit - len(rows))
                    rows = [*rows, *conn.execute(_PG_CLAIM, params).all()]
            else:
                rows = conn.execute(_PG_CLAIM, params).all()
        else:
            stmt = sa_update(T).where(T.c.id.in_(candidates), CLAIMABLE_SQL)
            rows = conn.execute(stmt.values(**values).returning(*_CLAIM_COLUMNS)).all()
    make = ClaimedEvent._make
    events = [make(row) for row in rows]
    events.sort(key=lambda e: e.id)
    return Claim(token=token, worker=worker, deadline=deadline, events=events)


def record_outcomes(engine: Engine, claim: Claim, attempts: Sequence[AttemptRecord], *,
                    release_ids: Sequence[int] = (), dead_without_call: Sequence[tuple[int, str]]
                    = (), now: datetime, policy: Policy, release_delay_seconds: float = 0.0,
                    rng: random.Random | None = None) -> RecordSummary:
    """Apply a batch's results in one transaction, each write guarded by the claim's token.

    ``attempts``: the calls made. ``release_ids``: claimed events not called (lane busy, claim
    too short, stopping, paused); they return to the queue untouched. ``dead_without_call``:
    (id, reason) for events that must not be sent (past the dedupe window).
    """
    summary = RecordSummary()
    delivered = [a for a in attempts if a.result.outcome is Outcome.DELIVERED]
    others = [a for a in attempts if a.result.outcome is not Outcome.DELIVERED]
    applied_ids: set[int] = set()
    with engine.begin() as conn:
        if delivered:
            ids = [a.event.id for a in delivered]
            last = {a.event.id: a for a in delivered}
            stmt = (sa_update(T)
                    .where(_held(conn, ids, claim.token))
                    .values(status=Status.SENT.value, sent_at=now, updated_at=now,
                            attempt_count=T.c.attempt_count + 1, call_count=T.c.call_count + 1,
                            claim_token=None, processing_deadline_at=None,
                            last_outcome=Outcome.DELIVERED.value,
                            # The event's error fields describe why it is not sent yet;
                            # once it is, they go (every attempt keeps its own in the
                            # attempts table).
                            last_error_class=None, last_error_code=None,
                            last_http_status=None, last_error_message=None,
                            last_request_id=None)
                    .returning(T.c.id))
            got = set(conn.execute(stmt).scalars().all())  # one fetchall, not a fetch per row
            applied_ids |= got
            summary.sent += len(got)
            summary.fenced += len(last) - len(got)
        for a in others:
            if a.result.outcome is Outcome.SYSTEMIC:
                continue  # never changes the event; it is released below
            tr = transition(a.event.view(), a.result, attempted_at=a.attempted_at, now=now,
                            policy=policy, rng=rng)
            if _apply_transition(conn, claim, a, tr, now):
                applied_ids.add(a.event.id)
                if tr.status == Status.DEAD.value:
                    summary.dead += 1
                else:
                    summary.retrying += 1
            else:
                summary.fenced += 1
        for event_id, reason in dead_without_call:
            done = conn.execute(
                sa_update(T).where(T.c.id == event_id, T.c.claim_token == claim.token)
                .values(status=Status.DEAD.value, dead_reason=reason, dead_at=now,
                        updated_at=now, claim_token=None, processing_deadline_at=None))
            summary.dead += done.rowcount
        release = list(release_ids) + [a.event.id for a in attempts
                                        if a.result.outcome is Outcome.SYSTEMIC]
        if release:
            summary.released += release_claimed(conn, claim.token, release, now=now,
                                                delay_seconds=release_delay_seconds)
        if attempts:
            _insert_attempts(conn, [_attempt_row(claim, a, a.event.id in applied_ids)
                                    for a in attempts])
    return summary


def _apply_transition(conn: Connection, claim: Claim, a: AttemptRecord, tr: Transition,
                      now: datetime) -> bool:
    r = a.result
    values = dict(status=tr.status, attempt_count=tr.attempt_count, call_count=tr.call_count,
                  key_generation=tr.key_generation, first_unknown_at=tr.first_unknown_at,
                  claim_token=None, processing_deadline_at=None, updated_at=now,
                  last_outcome=r.outcome.value, last_error_class=r.error_class,
                  last_error_code=r.error_code, last_http_status=r.http_status,
                  last_error_message=r.message, last_request_id=r.request_id)
    if tr.next_attempt_at is not None:
        values["next_attempt_at"] = tr.next_attempt_at
    if tr.status == Status.DEAD.value:
        values.update(dead_reason=tr.dead_reason, dead_at=now)
    done = conn.execute(sa_update(T).where(T.c.id == a.event.id,
                                           T.c.claim_token == claim.token).values(**values))
    return done.rowcount == 1


def _id_in(conn: Connection, ids: Sequence[int]) -> ColumnElement[bool]:
    """``id = ANY(:ids)`` (one array parameter) on PostgreSQL, ``id IN (…)`` elsewhere."""
    if conn.dialect.name == "postgresql":
        return T.c.id == any_(sql_cast(bindparam("ids", bigint_array(ids), type_=Text),
                                   postgresql.ARRAY(BigInteger)))
    return T.c.id.in_(list(ids))


def bigint_array(ids: Iterable[int]) -> str:
    """A PostgreSQL array literal of integers, ``{1,2,3}``, for ``CAST(:p AS bigint[])``: a
    quarter of the client CPU psycopg spends adapting a list of a thousand ints element by
    element."""
    return "{" + ",".join([str(int(i)) for i in ids]) + "}"


_ATTEMPT_COLUMNS = ("event_id", "attempted_at", "duration_ms", "worker", "claim_token",
                    "idempotency_key", "outcome", "counted", "http_status", "stripe_request_id",
                    "error_class", "error_code", "error_message", "applied")
#: The columns' PostgreSQL types, for binary COPY (which must match them exactly).
_ATTEMPT_PG_TYPES = ("int8", "timestamptz", "int4", "varchar", "varchar", "varchar", "varchar",
                     "bool", "int4", "varchar", "varchar", "varchar", "text", "bool")
_PG_COPY_ATTEMPTS = (f"COPY stripe_usage_attempts ({', '.join(_ATTEMPT_COLUMNS)}) "
                     "FROM STDIN (FORMAT BINARY)")


def _insert_attempts(conn: Connection, rows: list[tuple[object, ...]]) -> None:
    """Write a batch's attempt rows (tuples in ``_ATTEMPT_COLUMNS`` order): binary COPY on
    PostgreSQL (several times cheaper than an INSERT per row; the binary format spares the
    client formatting every timestamp as text), in the caller's transaction."""
    if conn.dialect.name != "postgresql":
        conn.execute(insert(ATTEMPTS), [dict(zip(_ATTEMPT_COLUMNS, r, strict=True))
                                        for r in rows])
        return
    raw = conn.connection.driver_connection
    assert raw is not None
    with raw.cursor() as cur, cur.copy(_PG_COPY_ATTEMPTS) as copy:
        copy.set_types(list(_ATTEMPT_PG_TYPES))
        write = copy.write_row
        for r in rows:
            write(r)


def _attempt_row(claim: Claim, a: AttemptRecord, applied: bool) -> tuple[object, ...]:
    ev, r = a.event, a.result
    return (ev.id, a.attempted_at, a.duration_ms, claim.worker, claim.token,
            idempotency_key(ev.identifier, ev.key_generation), r.outcome.value,
            r.outcome in COUNTED, r.http_status, r.request_id, r.error_class, r.error_code,
            r.message, applied)


def release_claimed(conn: Connection, token: str, ids: Sequence[int], *, now: datetime,
                    delay_seconds: float = 0.0) -> int:
    """Return claimed events to the queue untouched (no attempt spent), claimable at once
    (or after ``delay_seconds``)."""
    values: dict[str, object] = dict(status=RELEASED_STATUS, claim_token=None, claimed_by=None,
                                     processing_deadline_at=None, updated_at=now)
    if delay_seconds > 0:
        values["next_attempt_at"] = now + timedelta(seconds=delay_seconds)
    done = conn.execute(sa_update(T).where(_held(conn, ids, token)).values(**values))
    return done.rowcount


def release(engine: Engine, token: str, ids: Sequence[int], *, now: datetime,
            delay_seconds: float = 0.0) -> int:
    """``release_claimed`` in a transaction of its own."""
    if not ids:
        return 0
    with engine.begin() as conn:
        return release_claimed(conn, token, ids, now=now, delay_seconds=delay_seconds)


def rescue_expired(engine: Engine, *, now: datetime) -> int:
    """Return events whose claim deadline passed (their worker died) to the queue.

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


# -- the sending switch --------------------------------------------------------------------------

SENDING = "sending"


@dataclass(frozen=True)
class PauseState:
    paused: bool
    reason: str | None = None
    kind: str | None = None
    changed_at: datetime | None = None
    changed_by: str | None = None


def pause_state(conn: Connection) -> PauseState:
    """Whether sending is paused, for every worker (one indexed read)."""
    row = conn.execute(select(CONTROL.c.paused, CONTROL.c.reason, CONTROL.c.kind,
                              CONTROL.c.changed_at, CONTROL.c.changed_by)
                       .where(CONTROL.c.name == SENDING)).first()
    if row is None or not row.paused:
        return PauseState(False)
    return PauseState(True, row.reason, row.kind, row.changed_at, row.changed_by)


def set_paused(engine: Engine, *, paused: bool, reason: str | None, kind: str, by: str,
               now: datetime, only_kind: str | None = None) -> bool:
    """Pause or resume sending. ``only_kind``: change it only if the current pause is of that
    kind (a probe resumes a systemic pause, never a person's). Returns whether it changed."""
    with engine.begin() as conn:
        # Several lanes (threads, processes) can meet the same 401 at once: make sure the row
        # exists, then lock it, so concurrent callers queue here instead of racing to INSERT
        # (a unique violation on PostgreSQL that failed the drain pass).
        dialect_insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
        conn.execute(dialect_insert(CONTROL).values(name=SENDING, paused=False)
                     .on_conflict_do_nothing(index_elements=[CONTROL.c.name]))
        conn.execute(select(CONTROL.c.name).where(CONTROL.c.name == SENDING).with_for_update())
        current = pause_state(conn)
        if only_kind is not None and (not current.paused or current.kind != only_kind):
            return False
        if current.paused == paused and current.reason == reason:
            return False
        if paused and current.paused and current.kind == "operator" and kind != "operator":
            return False  # a systemic cause never replaces a person's pause (a probe could lift it)
        values = dict(paused=paused, reason=reason if paused else None,
                      kind=kind if paused else None, changed_at=now, changed_by=by)
        conn.execute(sa_update(CONTROL).where(CONTROL.c.name == SENDING).values(**values))
        return True


def lane_filter(lanes: Iterable[tuple[str, str]]) -> object:
    """SQL condition selecting the events of the given lanes (for tests and tools)."""
    return or_(*[and_(T.c.stripe_customer_id == c, T.c.meter == m) for c, m in lanes])


__all__ = ["AttemptRecord", "Claim", "ClaimedEvent", "PauseState", "RecordSummary",
           "bindparam", "claim_batch", "pause_state", "record_outcomes", "release",
           "release_claimed", "rescue_expired", "set_paused"]
