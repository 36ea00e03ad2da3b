"""``enqueue_usage``: the request path's only call. One INSERT in the caller's transaction."""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, bindparam, inspect, literal, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import instance_state

from ..config import default_meter
from ..models import OutboxEvent, utcnow
from ..status import PENDING, sql_list
from .ids import text_problem
from .states import MAX_AGE, MAX_AHEAD, Status

MAX_QUANTITY = 10**15 - 1          # Stripe: at most 15 significant digits


class InvalidUsage(ValueError):
    """The usage cannot be billed as given; the message names the field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


class IdempotencyConflict(Exception):
    """The key is already used by an event with different content: a silent mismatch would
    bill the wrong amount, customer or time."""

    def __init__(self, key: str, existing: OutboxEvent, differences: list[str]) -> None:
        super().__init__(
            f"idempotency_key {key!r} already names event {existing.id} with a different "
            + ", ".join(differences))
        self.existing = existing
        self.differences = differences


def _check_text(field: str, value: object, *, ascii_only: bool) -> None:
    problem = text_problem(value, ascii_only=ascii_only)
    if problem:
        raise InvalidUsage(field, problem)


def validate_usage(*, tenant_id: object, quantity: object, idempotency_key: object,
                   meter: object, occurred_at: object, now: datetime) -> None:
    """Raise ``InvalidUsage`` naming the first bad field; return nothing when all are fine."""
    _check_text("tenant_id", tenant_id, ascii_only=False)
    _check_text("idempotency_key", idempotency_key, ascii_only=True)
    _check_text("meter", meter, ascii_only=False)
    if isinstance(quantity, bool) or not isinstance(quantity, int):
        raise InvalidUsage("quantity", f"must be an integer, not {type(quantity).__name__}")
    if quantity <= 0:
        raise InvalidUsage("quantity", f"must be positive (got {quantity})")
    if quantity > MAX_QUANTITY:
        raise InvalidUsage("quantity", "must have at most 15 digits (Stripe's limit)")
    if not isinstance(occurred_at, datetime):
        raise InvalidUsage("occurred_at", "must be a datetime")
    if occurred_at.tzinfo is None or occurred_at.utcoffset() is None:
        raise InvalidUsage("occurred_at", "must be timezone-aware (a naive datetime is ambiguous)")
    if occurred_at < now - MAX_AGE:
        raise InvalidUsage("occurred_at", "is more than 35 days old; Stripe would reject it")
    if occurred_at > now + MAX_AHEAD:
        raise InvalidUsage("occurred_at", "is more than 5 minutes in the future")


_INSERT_COLUMNS = ("tenant_id", "meter", "quantity", "idempotency_key", "occurred_at",
                   "next_attempt_at", "created_at", "updated_at")


_PG_INSERT = (
    "INSERT INTO stripe_usage_outbox (tenant_id, meter, quantity, idempotency_key, "
    "occurred_at, next_attempt_at, created_at, updated_at, status, attempt_count, call_count, "
    f"key_generation) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, {sql_list([PENDING])}, 0, 0, 0) "
    "ON CONFLICT (idempotency_key) DO NOTHING RETURNING id")


@functools.cache
def _insert_statement(dialect: str) -> Any:
    """``INSERT … ON CONFLICT (idempotency_key) DO NOTHING RETURNING id``, built once per
    dialect: building and hashing the statement on every call cost more than the insert."""
    table = cast(Table, OutboxEvent.__table__)
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    values: dict[str, Any] = {name: bindparam(name, type_=table.c[name].type)
                              for name in _INSERT_COLUMNS}
    values.update(status=literal(Status.PENDING.value), attempt_count=literal(0),
                  call_count=literal(0), key_generation=literal(0))
    return (insert(table).values(values)
            .on_conflict_do_nothing(index_elements=[table.c.idempotency_key])
            .returning(table.c.id))


#: Every column of a freshly inserted event that enqueue_usage does not set: NULL, or the
#: constants its INSERT writes.
_FRESH_ROW: dict[str, Any] = {attr.key: None for attr in inspect(OutboxEvent).column_attrs}
_FRESH_ROW.update(status=Status.PENDING.value, attempt_count=0, call_count=0, key_generation=0)


def _as_persistent(db: Session, new_id: int, params: dict[str, Any]) -> OutboxEvent:
    """The row just inserted, as a persistent object of the session, without another query.

    Every column is known (what the INSERT wrote), so the object is made the way SQLAlchemy's
    own loading makes a query's row (``orm/loading.py``): ``ClassManager.new_instance``, its
    identity key, attached to the session's identity map, its ``__dict__`` filled with the
    columns as loaded (nothing marked changed, nothing to flush). ``Session.add`` of a detached
    copy did the same through the save-update cascade and cost as much as the checks and the
    statement's parameters together; the constructor's attribute events cost three times more.
    """
    event: OutboxEvent = _MANAGER.new_instance()
    event.__dict__.update(_FRESH_ROW, id=new_id, **params)
    state = instance_state(event)
    key = _MAPPER.identity_key_from_primary_key((new_id,))
    state.key = key
    state.identity_token = None
    state.session_id = db.hash_key
    db.identity_map._add_unpresent(state, key)
    return event


_MAPPER = inspect(OutboxEvent)
_MANAGER = _MAPPER.class_manager


def enqueue_usage(db: Session, *, tenant_id: str, quantity: int, idempotency_key: str,
                  meter: str | None = None, occurred_at: datetime | None = None,
                  now: datetime | None = None) -> OutboxEvent:
    """Record one usage event in the caller's transaction; never commits, never calls Stripe.

    The same ``idempotency_key`` again returns the existing row. The same key with a different
    tenant, meter, quantity or (when given) occurred_at raises ``IdempotencyConflict``.
    Bad input raises ``InvalidUsage`` naming the field.

    One ``INSERT … ON CONFLICT (idempotency_key) DO NOTHING RETURNING``: a concurrent
    transaction inserting the same key makes this one wait for it, then find its row, so both
    succeed with one row and neither sees an error (the seed's savepoint-plus-IntegrityError
    did the same with one more round trip, and aborted work on PostgreSQL's side).
    """
    now = now or utcnow()
    meter = default_meter() if meter is None else meter
    given_time = occurred_at is not None
    occurred_at = occurred_at if occurred_at is not None else now
    validate_usage(tenant_id=tenant_id, quantity=quantity, idempotency_key=idempotency_key,
                   meter=meter, occurred_at=occurred_at, now=now)

    params = dict(tenant_id=tenant_id, meter=meter, quantity=quantity,
                  idempotency_key=idempotency_key, occurred_at=occurred_at,
                  next_attempt_at=now, created_at=now, updated_at=now)
    conn = db.connection()  # the session's connection, in the caller's transaction
    if conn.dialect.name == "postgresql":
        # The request path's one statement, straight to psycopg (which prepares it
        # server-side after a few uses): SQLAlchemy's per-execution work costs more client
        # time than the INSERT itself (the enqueue bench measures it).
        raw = conn.connection.driver_connection
        assert raw is not None
        with raw.cursor() as cur:
            cur.execute(_PG_INSERT, (tenant_id, meter, quantity, idempotency_key, occurred_at,
                                     now, now, now))
            row = cur.fetchone()
        new_id = row[0] if row is not None else None
    else:
        new_id = conn.execute(_insert_statement(conn.dialect.name), params).scalar()
    if new_id is not None:
        return _as_persistent(db, new_id, params)

    existing = db.scalars(select(OutboxEvent).where(
        OutboxEvent.idempotency_key == idempotency_key)).one()
    differences = []
    if existing.tenant_id != tenant_id:
        differences.append("tenant_id")
    if existing.meter != meter:
        differences.append("meter")
    if existing.quantity != quantity:
        differences.append("quantity")
    # What Stripe receives is whole seconds; compare that when the caller gave a time.
    if given_time and int(existing.occurred_at.timestamp()) != int(occurred_at.timestamp()):
        differences.append("occurred_at")
    if differences:
        raise IdempotencyConflict(idempotency_key, existing, differences)
    return existing
