"""A batch of usage events from the HTTP ingest API, with ``enqueue_usage``'s rules: each event
checked on its own (the same :func:`validate_usage`), the valid ones inserted in one statement
(``ON CONFLICT (idempotency_key) DO NOTHING RETURNING``; on PostgreSQL from five arrays through
``unnest``, as the row ``enqueue_usage`` writes), those already there read back in one
more and compared field by field. Each event gets its result, in the order sent: ``created``,
``duplicate`` (the same key with the same content) or ``error`` with the field and why.

Unlike ``enqueue_usage`` this is not in the producer's transaction: the batch commits here, and
a retry of it with the same keys is safe (what was created the first time is a duplicate).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.dialects import postgresql, sqlite

from ..config import default_meter
from ..status import PENDING, sql_list
from .enqueue import InvalidUsage, validate_usage
from .sql import T, as_utc

FIELDS = ("tenant_id", "quantity", "idempotency_key", "meter", "occurred_at")


@dataclass(frozen=True)
class Result:
    idempotency_key: Any
    status: str                   # created | duplicate | error
    id: int | None = None
    field: str | None = None
    message: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"idempotency_key": self.idempotency_key, "status": self.status}
        if self.id is not None:
            out["id"] = self.id
        if self.status == "error":
            out["error"] = {"field": self.field, "message": self.message}
        return out


@dataclass(frozen=True)
class _Valid:
    index: int
    tenant_id: str
    quantity: int
    key: str
    meter: str
    occurred_at: datetime
    given_time: bool


def _parse_time(value: Any) -> datetime:
    if not isinstance(value, str):
        raise InvalidUsage("occurred_at", "must be an RFC 3339 date-time string")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidUsage("occurred_at", "must be an RFC 3339 date-time, e.g. "
                                          "2026-12-07T09:30:00Z") from None
    if parsed.tzinfo is None:
        raise InvalidUsage("occurred_at", "must carry its offset (Z or ±hh:mm)")
    return parsed


def _check(index: int, event: Any, now: datetime, meter_default: str) -> _Valid:
    if not isinstance(event, Mapping):
        raise InvalidUsage("event", "must be a JSON object")
    unknown = sorted(k for k in event if k not in FIELDS)
    if unknown:
        raise InvalidUsage(str(unknown[0]), "is not a field of a usage event")
    given_time = event.get("occurred_at") is not None
    occurred_at = _parse_time(event["occurred_at"]) if given_time else now
    meter = event.get("meter")
    meter = meter_default if meter is None else meter
    tenant_id: Any = event.get("tenant_id")
    quantity: Any = event.get("quantity")
    key: Any = event.get("idempotency_key")
    validate_usage(tenant_id=tenant_id, quantity=quantity, idempotency_key=key, meter=meter,
                   occurred_at=occurred_at, now=now)
    return _Valid(index, tenant_id, quantity, key, meter, occurred_at, given_time)


def _differences(row: Any, v: _Valid) -> list[str]:
    out = []
    if row.tenant_id != v.tenant_id:
        out.append("tenant_id")
    if row.meter != v.meter:
        out.append("meter")
    if row.quantity != v.quantity:
        out.append("quantity")
    at = as_utc(row.occurred_at)
    if v.given_time and at is not None and int(at.timestamp()) != int(v.occurred_at.timestamp()):
        out.append("occurred_at")
    return out


_PG_BATCH = (
    "INSERT INTO stripe_usage_outbox (tenant_id, meter, quantity, idempotency_key, occurred_at, "
    "next_attempt_at, created_at, updated_at, status, attempt_count, call_count, key_generation, "
    "source) "
    f"SELECT t, m, q, k, o, %(now)s, %(now)s, %(now)s, {sql_list([PENDING])}, 0, 0, 0, %(source)s "
    "FROM unnest(%(t)s::text[], %(m)s::text[], %(q)s::bigint[], %(k)s::text[], "
    "%(o)s::timestamptz[]) AS e(t, m, q, k, o) "
    "ON CONFLICT (idempotency_key) DO NOTHING RETURNING id, idempotency_key")


@functools.cache
def _insert(dialect: str) -> Any:
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    return (insert(T).on_conflict_do_nothing(index_elements=[T.c.idempotency_key])
            .returning(T.c.id, T.c.idempotency_key))


def ingest(engine: Engine, events: Sequence[Any], *, now: datetime,
           meter_default: str | None = None, source: str | None = None) -> list[Result]:
    """Record ``events``; a result for each, in order (see the module's docstring).
    ``source``: where they came from (``http:<token name>``), kept on each event."""
    meter_default = meter_default or default_meter()
    results: list[Result | None] = [None] * len(events)
    first: dict[str, _Valid] = {}      # the first valid event of each key in the batch
    later: list[_Valid] = []           # the same key again in the batch
    for i, event in enumerate(events):
        key = event.get("idempotency_key") if isinstance(event, Mapping) else None
        try:
            v = _check(i, event, now, meter_default)
        except InvalidUsage as exc:
            results[i] = Result(key, "error", field=exc.field,
                                message=str(exc).removeprefix(f"{exc.field}: "))
            continue
        if v.key in first:
            later.append(v)
        else:
            first[v.key] = v
    ids: dict[str, int] = {}
    existing: dict[str, Any] = {}
    if first:
        with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                # One statement, five arrays: the driver sends five parameters, not 6,000.
                raw = conn.connection.driver_connection
                assert raw is not None
                vs = list(first.values())
                with raw.cursor() as cur:
                    cur.execute(_PG_BATCH, {"t": [v.tenant_id for v in vs],
                                            "m": [v.meter for v in vs],
                                            "q": [v.quantity for v in vs],
                                            "k": [v.key for v in vs],
                                            "o": [v.occurred_at for v in vs], "now": now,
                                            "source": source})
                    ids = {k: int(i) for i, k in cur.fetchall()}
            else:
                # One statement for the batch: SQLAlchemy's "insertmanyvalues" sends the rows
                # as one multi-row VALUES (up to 1,000 a statement), compiled once and cached.
                rows = [dict(tenant_id=v.tenant_id, meter=v.meter, quantity=v.quantity,
                             idempotency_key=v.key, occurred_at=v.occurred_at,
                             next_attempt_at=now, created_at=now, updated_at=now,
                             status=PENDING, attempt_count=0, call_count=0, key_generation=0,
                             source=source)
                        for v in first.values()]
                ids = {k: int(i) for i, k in conn.execute(_insert(conn.dialect.name), rows)}
            missing = [k for k in first if k not in ids]
            if missing:
                existing = {r.idempotency_key: r for r in conn.execute(
                    select(T.c.id, T.c.idempotency_key, T.c.tenant_id, T.c.meter,
                           T.c.quantity, T.c.occurred_at)
                    .where(T.c.idempotency_key.in_(missing)))}
    for key, v in first.items():
        if key in ids:
            results[v.index] = Result(key, "created", ids[key])
        else:
            results[v.index] = _against(existing.get(key), v)
    for v in later:
        row: Any
        if v.key in ids:
            f = first[v.key]
            row = _Row(ids[v.key], f.tenant_id, f.meter, f.quantity, f.occurred_at)
        else:
            row = existing.get(v.key)
        results[v.index] = _against(row, v)
    return [r for r in results if r is not None]


@dataclass(frozen=True)
class _Row:
    id: int
    tenant_id: str
    meter: str
    quantity: int
    occurred_at: datetime


def _against(row: Any, v: _Valid) -> Result:
    if row is None:  # inserted and gone between the two statements (pruned): retry it
        return Result(v.key, "error", field="idempotency_key",
                      message="was used by an event that is no longer here; send it again")
    differences = _differences(row, v)
    if differences:
        return Result(v.key, "error", row.id, field="idempotency_key",
                      message=f"already names event {row.id} with a different "
                              + ", ".join(differences))
    return Result(v.key, "duplicate", row.id)
