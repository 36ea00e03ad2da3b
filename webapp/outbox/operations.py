"""What people do to the outbox, each rule written once and called alike from the CLI and
the web: map a tenant to its Stripe customer, requeue and resolve dead or rejected events,
check and record a cancel (the call to Stripe is ``webapp.worker.cancelling``'s), pause and
resume sending. Every action is audited in its own transaction; every refusal raises
:class:`OperationError` with the reason and changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, func, insert, select
from sqlalchemy import update as sa_update
from sqlalchemy.exc import IntegrityError

from ..audit import AUDIT, write_audit
from ..db import reading as reading_conn
from ..models import fit
from .adjustments import CancelAnswer, KeptAdjustment, kept
from .control import OPERATOR, set_paused_in
from .customers import CustomerVerdicts
from .deferred import undefer_sendable
from .guards import (
    CANCEL_REFUSALS,
    REQUEUE_REFUSALS,
    CancelCheck,
    RequeueCheck,
    cancel_check,
    requeue_check,
    requeue_permitted,
)
from .ids import customer_id_problem, tenant_id_problem
from .rollups import lock_sent_mark, unfold_sent
from .sendable import NEEDS_A_PERSON
from .sql import SENT_AS, TENANTS, T, as_utc, id_in
from .states import Move, Status, allowed, requeue_identifier

RESOLVE_REASONS = {
    "billed_manually": "Billed manually",
    "duplicate": "Duplicate of another event",
    "customer_churned": "Customer churned",
    "written_off": "Written off",
    "other": "Other",
}


class OperationError(ValueError):
    """A person's request cannot be carried out; the message says why. Nothing changed."""


@dataclass(frozen=True)
class ActionResult:
    """What an action changed: its audit entry and the events it moved."""

    audit_id: int
    event_ids: list[int]


# -- tenants ---------------------------------------------------------------------------------

def set_tenant(engine: Engine, tenant_id: str, *, stripe_customer_id: str | None,
               name: str | None, now: datetime, actor: str | None = None,
               customers: CustomerVerdicts | None = None) -> None:
    """Create or update a tenant's Stripe customer mapping (audited when ``actor`` is given).
    Events already attempted keep the customer fixed at their first attempt.

    ``customers`` is what Stripe said of the customer just before (every door passes it:
    ``webapp.worker.check_customers``): a customer it refuses (Stripe does not have it, has
    it deleted, or could not be asked) raises :class:`OperationError` with one line naming
    it, and the audit entry says whether the customer was checked. Removing a mapping needs
    no check.

    Raises :class:`OperationError` as :func:`mapping_problem` says.
    A name longer than its column is cut.
    """
    problem = mapping_problem(tenant_id, stripe_customer_id)
    if problem:
        raise OperationError(problem)
    how = None
    if customers is not None and stripe_customer_id is not None:
        refused = customers.explained(stripe_customer_id)
        if refused:
            raise OperationError(refused)
        how = customers.how
    name = fit(TENANTS.c.name, name)
    try:
        _save_tenant(engine, tenant_id, stripe_customer_id=stripe_customer_id, name=name,
                     now=now, actor=actor, how=how)
    except IntegrityError:
        # Two people (or a double click) mapping a new tenant at once: the other one won.
        raise OperationError(f"tenant {tenant_id} was mapped by someone else at the same "
                             "moment; reload the page to see its mapping") from None


def mapping_problem(tenant_id: str, stripe_customer_id: str | None) -> str | None:
    """Why this tenant id or customer id cannot be a mapping, before anyone asks Stripe
    (:mod:`webapp.outbox.ids`: the tenant id enqueue takes, a customer id Stripe could
    have). None when both can."""
    return tenant_id_problem(tenant_id) or (
        customer_id_problem(stripe_customer_id) if stripe_customer_id is not None else None)


def _save_tenant(engine: Engine, tenant_id: str, *, stripe_customer_id: str | None,
                 name: str | None, now: datetime, actor: str | None,
                 how: str | None) -> None:
    with engine.begin() as conn:
        current = conn.execute(select(TENANTS.c.tenant_id)
                               .where(TENANTS.c.tenant_id == tenant_id)).first()
        values: dict[str, object] = {"stripe_customer_id": stripe_customer_id, "updated_at": now}
        if name is not None:
            values["name"] = name
        if current is None:
            conn.execute(insert(TENANTS).values(tenant_id=tenant_id, created_at=now, **values))
        else:
            conn.execute(sa_update(TENANTS).where(TENANTS.c.tenant_id == tenant_id)
                         .values(**values))
        if stripe_customer_id is not None:
            # Its events put off while it had no customer are due now.
            undefer_sendable(conn, now=now)
        if actor is not None:
            write_audit(conn, actor=actor, action="tenant_map", now=now,
                        note=f"{tenant_id} -> {stripe_customer_id}"
                        + (f" ({name})" if name else "") + (f"; customer {how}" if how else ""))


# -- dead letters ----------------------------------------------------------------------------

def _unique_ids(ids: Sequence[int]) -> list[int]:
    unique = list(dict.fromkeys(int(i) for i in ids))
    if not unique:
        raise OperationError("no event ids given")
    return unique


def _load(conn: Connection, ids: Sequence[int]) -> dict[int, Any]:
    rows = conn.execute(select(T.c.id, T.c.status, T.c.occurred_at, T.c.dead_reason,
                               T.c.first_unknown_at, T.c.idempotency_key,
                               T.c.identifier_generation).where(id_in(conn, T.c.id, ids))).all()
    return {r.id: r for r in rows}


def requeue_checks(conn: Connection, ids: Sequence[int], *, now: datetime,
                   window_seconds: float) -> dict[int, RequeueCheck | None]:
    """What a requeue may do with each event (:func:`~.guards.requeue_check`); None for an id
    that names no event."""
    return _checks(_load(conn, ids), ids, now, window_seconds)


def _checks(rows: dict[int, Any], ids: Sequence[int], now: datetime,
            window_seconds: float) -> dict[int, RequeueCheck | None]:
    return {i: None if (r := rows.get(i)) is None else requeue_check(
        status=r.status, occurred_at=r.occurred_at, dead_reason=r.dead_reason,
        first_unknown_at=r.first_unknown_at, now=now, window_seconds=window_seconds)
        for i in ids}


def requeue(engine: Engine, ids: Sequence[int], *, actor: str, now: datetime,
            force: bool = False, window_seconds: float, note: str | None = None
            ) -> ActionResult:
    """Send dead or rejected events again. All or nothing: any refused id refuses the whole
    request.

    A dead event keeps its identifier, customer and timestamp, with a fresh attempt budget
    and transport key. A rejected one (Stripe refused it after accepting the call; nothing
    was billed) goes out under a new identifier (``<key>~r<n>``: Stripe may still hold the
    old one), to the customer its tenant is mapped to *now* — the usual fix of its cause.

    Refused (:class:`OperationError`): events neither dead nor rejected; events past Stripe's
    35-day limit; dead events whose outcome was unknown past the dedupe window, unless
    ``force`` (a resend could then bill twice).
    """
    ids = _unique_ids(ids)
    with engine.begin() as conn:
        rows = _load(conn, ids)
        checks = _checks(rows, ids, now, window_seconds)
        problems = []
        for i in ids:
            check = checks[i]
            if check is None:
                problems.append(f"{i}: no such event")
            elif check is RequeueCheck.WRONG_STATUS:
                problems.append(f"{i}: is {rows[i].status}, {REQUEUE_REFUSALS[check]}")
            elif not requeue_permitted(check, force=force):
                problems.append(f"{i}: {REQUEUE_REFUSALS[check]}")
        if problems:
            raise OperationError("; ".join(problems))
        dead = [i for i in ids if rows[i].status == Status.DEAD.value]
        rejected = [i for i in ids if rows[i].status == Status.REJECTED.value]
        changed = _requeue_dead(conn, dead, force, now) + _requeue_rejected(
            conn, [rows[i] for i in rejected], now)
        if changed != len(ids):
            raise OperationError("some events changed while requeueing; nothing was done")
        audit_id = write_audit(conn, actor=actor, action="force_requeue" if force else "requeue",
                               event_ids=ids, note=note, now=now)
    return ActionResult(audit_id, ids)


def _requeue_dead(conn: Connection, ids: list[int], force: bool, now: datetime) -> int:
    if not ids:
        return 0
    values: dict[str, object] = dict(
        status=Status.PENDING.value, attempt_count=0, next_attempt_at=now,
        key_generation=T.c.key_generation + 1, dead_reason=None, dead_at=None,
        claim_token=None, processing_deadline_at=None, updated_at=now)
    if force:
        values["first_unknown_at"] = None
    done = conn.execute(sa_update(T).where(id_in(conn, T.c.id, ids),
                                           T.c.status == Status.DEAD.value).values(**values))
    return done.rowcount


def _requeue_rejected(conn: Connection, rows: list[Any], now: datetime) -> int:
    """Each under an identifier of its own that no event goes by yet."""
    changed = 0
    for r in rows:
        identifier, generation = fresh_identifier(conn, r.idempotency_key,
                                                  int(r.identifier_generation) + 1)
        done = conn.execute(sa_update(T).where(T.c.id == r.id,
                                               T.c.status == Status.REJECTED.value).values(
            status=Status.PENDING.value, stripe_identifier=identifier,
            identifier_generation=generation, attempt_count=0, call_count=0,
            key_generation=0, next_attempt_at=now, stripe_customer_id=None,
            first_attempt_at=None, first_unknown_at=None, sent_at=None, rejected_at=None,
            reject_code=None, reject_message=None, reject_event_id=None,
            reject_found_by=None, claim_token=None, processing_deadline_at=None,
            updated_at=now))
        changed += done.rowcount
    return changed


def fresh_identifier(conn: Connection, key: str, generation: int) -> tuple[str, int]:
    """The first identifier from ``generation`` on (:func:`~.states.requeue_identifier` of
    ``key``) that no event goes by yet, as its key or its Stripe identifier; and its
    generation. A read: the caller writes it in the same transaction."""
    identifier = requeue_identifier(key, generation)
    while conn.execute(select(T.c.id).where(
            (T.c.idempotency_key == identifier) | (T.c.stripe_identifier == identifier))
            .limit(1)).first() is not None:
        generation += 1
        identifier = requeue_identifier(key, generation)
    return identifier, generation


def _check_reason(reason: str, note: str | None, verb: str) -> None:
    """A person's reason code and note, required to resolve or cancel events."""
    if reason not in RESOLVE_REASONS:
        raise OperationError(f"reason must be one of {', '.join(RESOLVE_REASONS)}, "
                             f"got {reason!r}")
    if not note or not note.strip():
        raise OperationError(f"a note is required to {verb} events")


def resolve(engine: Engine, ids: Sequence[int], *, actor: str, reason: str, note: str,
            now: datetime) -> ActionResult:
    """Close dead or rejected events by hand with a reason code and a note; they stay in
    history.

    Refused (:class:`OperationError`): an unknown reason, an empty note, any event that is
    neither dead nor rejected.
    """
    ids = _unique_ids(ids)
    _check_reason(reason, note, "resolve")
    with engine.begin() as conn:
        rows = _load(conn, ids)
        problems = [f"{i}: no such event" if i not in rows else
                    f"{i}: is {rows[i].status}, only dead or rejected events can be resolved"
                    for i in ids
                    if i not in rows or not allowed(rows[i].status, Move.RESOLVE)]
        if problems:
            raise OperationError("; ".join(problems))
        done = conn.execute(sa_update(T).where(id_in(conn, T.c.id, ids),
                                               T.c.status.in_(NEEDS_A_PERSON))
                            .values(status=Status.RESOLVED.value, resolved_at=now,
                                    resolved_by=actor, resolve_reason=reason,
                                    resolve_note=note.strip(), updated_at=now,
                                    # the resolved history is ordered by when the event
                                    # started needing a person
                                    dead_at=func.coalesce(T.c.dead_at, T.c.rejected_at, now)))
        if done.rowcount != len(ids):
            raise OperationError("some events changed while resolving; nothing was done")
        audit_id = write_audit(conn, actor=actor, action="resolve", event_ids=ids,
                               reason_code=reason, note=note.strip(), now=now)
    return ActionResult(audit_id, ids)


# -- cancelling at Stripe --------------------------------------------------------------------

@dataclass(frozen=True)
class Cancellable:
    """What a cancel sends Stripe for one event."""

    id: int
    meter: str
    identifier: str


def cancel_targets(engine: Engine, ids: Sequence[int], *, reason: str, note: str,
                   now: datetime) -> list[Cancellable]:
    """The events a cancel would ask Stripe to cancel. All or nothing: raises
    :class:`OperationError` naming every event that cannot be cancelled (not sent, or
    accepted by Stripe more than 24 hours ago), an unknown reason or an empty note."""
    ids = _unique_ids(ids)
    _check_reason(reason, note, "cancel")
    with reading_conn(engine) as conn:
        rows = {r.id: r for r in conn.execute(
            select(T.c.id, T.c.status, T.c.sent_at, T.c.meter, SENT_AS)
            .where(id_in(conn, T.c.id, ids)))}
    problems = []
    for i in ids:
        r = rows.get(i)
        if r is None:
            problems.append(f"{i}: no such event")
            continue
        check = cancel_check(status=r.status, sent_at=as_utc(r.sent_at), now=now)
        if check is not CancelCheck.OK:
            problems.append(f"{i}: is {r.status}, {CANCEL_REFUSALS[check]}"
                            if check is CancelCheck.NOT_SENT
                            else f"{i}: {CANCEL_REFUSALS[check]}")
    if problems:
        raise OperationError("; ".join(problems))
    return [Cancellable(i, rows[i].meter, rows[i].sent_as) for i in ids]


@dataclass(frozen=True)
class CancelRecord(ActionResult):
    """The events recorded ``cancelled``, and Stripe's answer for each as it keeps it."""

    adjustments: dict[int, KeptAdjustment]


def record_cancelled(engine: Engine, answers: Mapping[int, CancelAnswer], *, actor: str,
                     reason: str, note: str, now: datetime) -> CancelRecord:
    """Stripe took these cancels (a meter event adjustment each; its answer by event id): the
    events become ``cancelled``, out of the usage rollup, each keeping Stripe's answer as
    :func:`~.adjustments.kept` says (whatever Stripe sent, never refused), and one audit
    entry keeps the note and every answer. Events that left ``sent`` meanwhile are left
    alone."""
    answered = {i: kept(a) for i, a in answers.items()}
    with engine.begin() as conn:
        mark = lock_sent_mark(conn)
        moved = conn.execute(
            select(T.c.id, T.c.sent_at, T.c.occurred_at, T.c.tenant_id, T.c.stripe_customer_id,
                   T.c.meter, T.c.quantity)
            .where(id_in(conn, T.c.id, list(answered)), T.c.status == Status.SENT.value)).all()
        still_sent = {int(r.id) for r in moved}
        done = [i for i in answered if i in still_sent]
        if done:
            conn.execute(sa_update(T).where(T.c.id == bindparam("event_id"),
                                            T.c.status == Status.SENT.value)
                         .values(status=Status.CANCELLED.value, cancelled_at=now,
                                 cancelled_by=actor, cancel_reason=reason,
                                 cancel_note=note.strip(), updated_at=now,
                                 cancel_adjustment_status=bindparam("adjustment_status"),
                                 cancel_adjustment_id=bindparam("adjustment_reference")),
                         [{"event_id": i, "adjustment_status": answered[i].status,
                           "adjustment_reference": answered[i].reference} for i in done])
            unfold_sent(conn, mark, moved)
        adjustments = {i: answered[i] for i in done}
        audit_id = write_audit(conn, actor=actor, action="cancel", event_ids=done,
                               reason_code=reason, now=now,
                               note=_with_answers(note.strip(), adjustments))
    return CancelRecord(audit_id, done, adjustments)


def _with_answers(note: str, adjustments: Mapping[int, KeptAdjustment]) -> str:
    """A cancel's note for its audit entry, followed by Stripe's answer for each event (that
    part cut to the note's column, so a long list never fails the record)."""
    if not adjustments:
        return note
    answers = "; ".join(f"event {i}: {a.words()}" for i, a in adjustments.items())
    said: str = fit(AUDIT.c.note, f"Stripe answered: {answers}")
    return f"{note}\n{said}"


# -- the sending switch ----------------------------------------------------------------------

def pause(engine: Engine, *, actor: str, reason: str | None, now: datetime) -> bool:
    """Stop sending for every worker until :func:`resume` (audited); whether it changed."""
    with engine.begin() as conn:  # the switch and its audit entry: both or neither
        changed = set_paused_in(conn, paused=True, reason=reason or f"paused by {actor}",
                                kind=OPERATOR, by=actor, now=now)
        write_audit(conn, actor=actor, action="pause", note=reason, now=now)
    return changed


def resume(engine: Engine, *, actor: str, now: datetime) -> bool:
    """Restart sending, after a person's pause or a systemic one once its cause is fixed
    (audited); whether it changed."""
    with engine.begin() as conn:
        changed = set_paused_in(conn, paused=False, reason=None, kind=OPERATOR, by=actor,
                                now=now)
        write_audit(conn, actor=actor, action="resume", now=now)
    return changed
