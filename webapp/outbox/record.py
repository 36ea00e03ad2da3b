"""Recording what came of a batch's calls: each event's new state, guarded by its claim
(fencing), and one attempt row per call. One short transaction per batch."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from sqlalchemy import Connection, Engine, insert
from sqlalchemy import update as sa_update

from ..models import fit
from .claims import Claim, ClaimedEvent, held, release_claimed
from .sql import ATTEMPTS, STREAM_REQUESTS, T
from .states import (
    COUNTED,
    RELEASING,
    CallResult,
    Outcome,
    Policy,
    Status,
    Transition,
    idempotency_key,
    transition,
)
from .tracing import identifier_tag


class AttemptRecord(NamedTuple):
    """One call made under a claim, with its classified result. ``request_key``: the
    ``Idempotency-Key`` of the meter event stream request that carried the event (None for a
    v1 call, whose key follows from the event)."""

    event: ClaimedEvent
    result: CallResult
    attempted_at: datetime
    duration_ms: int
    request_key: str | None = None


@dataclass
class RecordSummary:
    """What recording a batch changed."""

    sent: int = 0
    retrying: int = 0
    dead: int = 0
    released: int = 0
    fenced: int = 0           # outcomes not applied: the claim had been taken over


def record_outcomes(engine: Engine, claim: Claim, attempts: Sequence[AttemptRecord], *,
                    release_ids: Sequence[int] = (), dead_without_call: Sequence[tuple[int, str]]
                    = (), now: datetime, policy: Policy, release_delay_seconds: float = 0.0,
                    rng: random.Random | None = None) -> RecordSummary:
    """Apply a batch's results in one transaction, each write guarded by the claim's token.

    ``attempts``: the calls made. ``release_ids``: claimed events not called (lane busy, claim
    too short, stopping, paused); they return to the queue untouched. ``dead_without_call``:
    (id, reason) for events that must not be sent (past the dedupe window). An outcome whose
    claim was taken over is not applied (counted as ``fenced``); its attempt row is still
    written, marked not applied.
    """
    summary = RecordSummary()
    delivered = [a for a in attempts if a.result.outcome is Outcome.DELIVERED]
    others = [a for a in attempts if a.result.outcome is not Outcome.DELIVERED]
    applied_ids: set[int] = set()
    with engine.begin() as conn:
        if delivered:
            got = _mark_sent(conn, claim, [a.event.id for a in delivered], now)
            applied_ids |= got
            summary.sent += len(got)
            summary.fenced += len({a.event.id for a in delivered}) - len(got)
        for a in others:
            if a.result.outcome in RELEASING:
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
                .values(status=Status.DEAD.value, dead_reason=fit(T.c.dead_reason, reason),
                        dead_at=now, updated_at=now, claim_token=None,
                        processing_deadline_at=None))
            summary.dead += done.rowcount
        release = list(release_ids) + [a.event.id for a in attempts
                                        if a.result.outcome in RELEASING]
        if release:
            summary.released += release_claimed(conn, claim.token, release, now=now,
                                                delay_seconds=release_delay_seconds)
        if attempts:
            insert_attempts(conn, [_attempt_row(claim, a, a.event.id in applied_ids)
                                   for a in attempts])
            requests = stream_requests(attempts)
            if requests:
                conn.execute(insert(STREAM_REQUESTS), requests)
    return summary


#: What a stream request's outcome may leave at Stripe: its events (a 200), or perhaps its
#: events (a timeout, a 5xx). A request refused whole, or never answered, applied none.
_MAY_HAVE_LANDED = (Outcome.DELIVERED, Outcome.UNKNOWN)


def stream_requests(attempts: Sequence[AttemptRecord]) -> list[dict[str, object]]:
    """The rows of ``stripe_stream_requests`` for the stream requests among ``attempts`` that
    may have left their events at Stripe: one per request key, listing its events as
    ``<id>:<tag>`` (:func:`identifier_tag`) in the request's order. Attempts whose outcome
    was not applied (the claim had been taken over) count too: the request went out."""
    by_key: dict[str, list[AttemptRecord]] = {}
    for a in attempts:
        if a.request_key is not None and a.result.outcome in _MAY_HAVE_LANDED:
            by_key.setdefault(a.request_key, []).append(a)
    return [dict(idempotency_key=key, stripe_request_id=fit(STREAM_REQUESTS.c.stripe_request_id,
                                                            group[0].result.request_id),
                 sent_at=group[0].attempted_at, events=len(group),
                 event_ids=",".join(f"{a.event.id}:{identifier_tag(a.event.identifier)}"
                                    for a in group))
            for key, group in by_key.items()]


def _mark_sent(conn: Connection, claim: Claim, ids: list[int], now: datetime) -> set[int]:
    """Every delivered event still held by the claim → ``sent``; the ids changed."""
    stmt = (sa_update(T)
            .where(held(conn, ids, claim.token))
            .values(status=Status.SENT.value, sent_at=now, updated_at=now,
                    attempt_count=T.c.attempt_count + 1, call_count=T.c.call_count + 1,
                    claim_token=None, processing_deadline_at=None,
                    last_outcome=Outcome.DELIVERED.value,
                    # The event's error fields describe why it is not sent yet; once it is,
                    # they go (every attempt keeps its own in the attempts table).
                    last_error_class=None, last_error_code=None,
                    last_http_status=None, last_error_message=None,
                    last_request_id=None)
            .returning(T.c.id))
    return set(conn.execute(stmt).scalars().all())  # one fetchall, not a fetch per row


def _apply_transition(conn: Connection, claim: Claim, a: AttemptRecord, tr: Transition,
                      now: datetime) -> bool:
    r = a.result
    # What Stripe answered is cut to its columns (``fit``): recording an outcome must never
    # fail on Stripe's data, or the event would stay in flight and be sent again and again.
    values = dict(status=tr.status, attempt_count=tr.attempt_count, call_count=tr.call_count,
                  key_generation=tr.key_generation, first_unknown_at=tr.first_unknown_at,
                  claim_token=None, processing_deadline_at=None, updated_at=now,
                  last_outcome=r.outcome.value,
                  last_error_class=fit(T.c.last_error_class, r.error_class),
                  last_error_code=fit(T.c.last_error_code, r.error_code),
                  last_http_status=fit(T.c.last_http_status, r.http_status),
                  last_error_message=fit(T.c.last_error_message, r.message),
                  last_request_id=fit(T.c.last_request_id, r.request_id))
    if tr.next_attempt_at is not None:
        values["next_attempt_at"] = tr.next_attempt_at
    if tr.status == Status.DEAD.value:
        values.update(dead_reason=fit(T.c.dead_reason, tr.dead_reason), dead_at=now)
    done = conn.execute(sa_update(T).where(T.c.id == a.event.id,
                                           T.c.claim_token == claim.token).values(**values))
    return done.rowcount == 1


A = ATTEMPTS.c
_ATTEMPT_COLUMNS = ("event_id", "attempted_at", "duration_ms", "worker", "claim_token",
                    "idempotency_key", "outcome", "counted", "http_status", "stripe_request_id",
                    "error_class", "error_code", "error_message", "applied")
#: The columns' PostgreSQL types, for binary COPY (which must match them exactly).
_ATTEMPT_PG_TYPES = ("int8", "timestamptz", "int4", "varchar", "varchar", "varchar", "varchar",
                     "bool", "int4", "varchar", "varchar", "varchar", "text", "bool")
_PG_COPY_ATTEMPTS = (f"COPY stripe_usage_attempts ({', '.join(_ATTEMPT_COLUMNS)}) "
                     "FROM STDIN (FORMAT BINARY)")


def insert_attempts(conn: Connection, rows: list[tuple[object, ...]]) -> None:
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
            a.request_key or idempotency_key(ev.identifier, ev.key_generation), r.outcome.value,
            r.outcome in COUNTED, fit(A.http_status, r.http_status),
            fit(A.stripe_request_id, r.request_id), fit(A.error_class, r.error_class),
            fit(A.error_code, r.error_code), fit(A.error_message, r.message), applied)
