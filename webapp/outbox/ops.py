"""What people do to the outbox: map tenants, requeue and resolve dead events (audited),
pause and resume sending, and read the numbers ``stats`` prints."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import cast

from sqlalchemy import Connection, Engine, Table, func, insert, select, text
from sqlalchemy import update as sa_update

from ..models import (
    IN_FLIGHT_SQL,
    WAITING_IDLE_SQL,
    AuditEntry,
    AuditEvent,
    OutboxEvent,
    Tenant,
)
from . import store
from .enqueue import MAX_AGE
from .states import ALL_STATUSES, DEAD_PAST_WINDOW, Status

T = cast(Table, OutboxEvent.__table__)
TENANTS = cast(Table, Tenant.__table__)
AUDIT = cast(Table, AuditEntry.__table__)
AUDIT_EVENTS = cast(Table, AuditEvent.__table__)

RESOLVE_REASONS = {
    "billed_manually": "Billed manually",
    "duplicate": "Duplicate of another event",
    "customer_churned": "Customer churned",
    "written_off": "Written off",
    "other": "Other",
}
# Requeue refuses events this close to Stripe's 35-day limit: they would be rejected on arrival.
REQUEUE_AGE_LIMIT = MAX_AGE - timedelta(minutes=10)


class OperationError(ValueError):
    """A person's request cannot be carried out; the message says why. Nothing changed."""


# -- tenants ---------------------------------------------------------------------------------

def set_tenant(engine: Engine, tenant_id: str, *, stripe_customer_id: str | None,
               name: str | None, now: datetime) -> None:
    """Create or update a tenant's Stripe customer mapping. Events already attempted keep the
    customer fixed at their first attempt."""
    if not tenant_id or len(tenant_id) > 100 or not tenant_id.isprintable():
        raise OperationError("tenant id must be 1–100 printable characters")
    if stripe_customer_id is not None and not stripe_customer_id.startswith("cus_"):
        raise OperationError(f"Stripe customer ids start with cus_, got {stripe_customer_id!r}")
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


def list_tenants(conn: Connection) -> list[dict[str, object]]:
    rows = conn.execute(select(TENANTS.c.tenant_id, TENANTS.c.name, TENANTS.c.stripe_customer_id)
                        .order_by(TENANTS.c.tenant_id)).all()
    return [dict(r._mapping) for r in rows]


# -- dead-letter actions ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ActionResult:
    audit_id: int
    event_ids: list[int]


def _load(conn: Connection, ids: Sequence[int]) -> dict[int, object]:
    rows = conn.execute(select(T.c.id, T.c.status, T.c.occurred_at, T.c.dead_reason,
                               T.c.first_unknown_at).where(T.c.id.in_(list(ids)))).all()
    return {r.id: r for r in rows}


def _check_ids(ids: Sequence[int]) -> list[int]:
    unique = list(dict.fromkeys(int(i) for i in ids))
    if not unique:
        raise OperationError("no event ids given")
    return unique


def requeue(engine: Engine, ids: Sequence[int], *, actor: str, now: datetime,
            force: bool = False, window_seconds: float, note: str | None = None
            ) -> ActionResult:
    """Send dead events again: a fresh attempt budget and transport key, the same identifier,
    customer and timestamp. All or nothing: any refused id refuses the whole request.

    Refused: events that are not dead; events past Stripe's 35-day limit; events whose outcome
    was unknown past the dedupe window, unless ``force`` (a resend could then bill twice).
    """
    ids = _check_ids(ids)
    with engine.begin() as conn:
        rows = _load(conn, ids)
        problems = []
        for i in ids:
            row = rows.get(i)
            if row is None:
                problems.append(f"{i}: no such event")
            elif row.status != Status.DEAD.value:  # type: ignore[attr-defined]
                problems.append(f"{i}: is {row.status}, only dead events can be requeued")  # type: ignore[attr-defined]
            elif row.occurred_at < now - REQUEUE_AGE_LIMIT:  # type: ignore[attr-defined]
                problems.append(f"{i}: occurred more than 35 days ago; Stripe would reject it "
                                "(resolve it instead, e.g. billed manually)")
            elif not force and _unknown_past_window(row, now, window_seconds):
                problems.append(f"{i}: its outcome is unknown and older than Stripe's dedupe "
                                "window; Stripe may already have it, so a resend could bill "
                                "twice (check Stripe, then use --force)")
        if problems:
            raise OperationError("; ".join(problems))
        values: dict[str, object] = dict(
            status=Status.PENDING.value, attempt_count=0, next_attempt_at=now,
            key_generation=T.c.key_generation + 1, dead_reason=None, dead_at=None,
            claim_token=None, processing_deadline_at=None, updated_at=now)
        if force:
            values["first_unknown_at"] = None
        done = conn.execute(sa_update(T).where(T.c.id.in_(ids), T.c.status == Status.DEAD.value)
                            .values(**values))
        if done.rowcount != len(ids):
            raise OperationError("some events changed while requeueing; nothing was done")
        audit_id = write_audit(conn, actor=actor, action="force_requeue" if force else "requeue",
                               event_ids=ids, reason_code=None, note=note, now=now)
    return ActionResult(audit_id, ids)


def _unknown_past_window(row: object, now: datetime, window_seconds: float) -> bool:
    if getattr(row, "dead_reason", None) == DEAD_PAST_WINDOW:
        return True
    first = getattr(row, "first_unknown_at", None)
    return first is not None and now - first >= timedelta(seconds=window_seconds)


def resolve(engine: Engine, ids: Sequence[int], *, actor: str, reason: str, note: str,
            now: datetime) -> ActionResult:
    """Close dead events by hand with a reason code and a note; they stay in history."""
    ids = _check_ids(ids)
    if reason not in RESOLVE_REASONS:
        raise OperationError(f"reason must be one of {', '.join(RESOLVE_REASONS)}, "
                             f"got {reason!r}")
    if not note or not note.strip():
        raise OperationError("a note is required to resolve events")
    with engine.begin() as conn:
        rows = _load(conn, ids)
        problems = [f"{i}: no such event" if i not in rows else
                    f"{i}: is {rows[i].status}, only dead events can be resolved"  # type: ignore[attr-defined]
                    for i in ids
                    if i not in rows or rows[i].status != Status.DEAD.value]  # type: ignore[attr-defined]
        if problems:
            raise OperationError("; ".join(problems))
        done = conn.execute(sa_update(T).where(T.c.id.in_(ids), T.c.status == Status.DEAD.value)
                            .values(status=Status.RESOLVED.value, resolved_at=now,
                                    resolved_by=actor, resolve_reason=reason,
                                    resolve_note=note.strip(), updated_at=now))
        if done.rowcount != len(ids):
            raise OperationError("some events changed while resolving; nothing was done")
        audit_id = write_audit(conn, actor=actor, action="resolve", event_ids=ids,
                               reason_code=reason, note=note.strip(), now=now)
    return ActionResult(audit_id, ids)


def write_audit(conn: Connection, *, actor: str, action: str, event_ids: Sequence[int],
                reason_code: str | None, note: str | None, now: datetime) -> int:
    """Append one audit entry (and its event links) in the caller's transaction."""
    audit_id = conn.execute(insert(AUDIT).values(
        at=now, actor=actor, action=action, event_ids=",".join(str(i) for i in event_ids),
        event_count=len(event_ids), reason_code=reason_code, note=note)
        .returning(AUDIT.c.id)).scalar_one()
    if event_ids:
        conn.execute(insert(AUDIT_EVENTS),
                     [{"audit_id": audit_id, "event_id": i} for i in event_ids])
    return int(audit_id)


def pause(engine: Engine, *, actor: str, reason: str | None, now: datetime) -> bool:
    """Stop sending for every worker until ``resume``."""
    changed = store.set_paused(engine, paused=True, reason=reason or f"paused by {actor}",
                               kind="operator", by=actor, now=now)
    with engine.begin() as conn:
        write_audit(conn, actor=actor, action="pause", event_ids=[], reason_code=None,
                    note=reason, now=now)
    return changed


def resume(engine: Engine, *, actor: str, now: datetime) -> bool:
    """Restart sending (after a person's pause, or a systemic one once its cause is fixed)."""
    changed = store.set_paused(engine, paused=False, reason=None, kind="operator", by=actor,
                               now=now)
    with engine.begin() as conn:
        write_audit(conn, actor=actor, action="resume", event_ids=[], reason_code=None,
                    note=None, now=now)
    return changed


# -- numbers --------------------------------------------------------------------------------------

def stats(engine: Engine, *, now: datetime) -> dict[str, object]:
    """The numbers ``stats --json`` prints (see CONTRACT.md)."""
    with engine.connect() as conn:
        counts = dict.fromkeys(ALL_STATUSES, 0)
        for status, n in conn.execute(select(T.c.status, func.count()).group_by(T.c.status)):
            counts[status] = int(n)
        # Waiting: pending or retrying (ix_outbox_waiting_created's predicate), or in flight
        # (ix_outbox_processing_deadline); literal predicates, so each finds its index.
        found = [conn.execute(select(func.min(T.c.created_at)).where(text(where))).scalar()
                 for where in (WAITING_IDLE_SQL, IN_FLIGHT_SQL)]
        oldest = min((at for at in found if at is not None), default=None)
        unmapped = conn.execute(
            select(func.count()).select_from(T)
            .where(T.c.status.in_([Status.PENDING.value, Status.RETRYING.value]),
                   T.c.stripe_customer_id.is_(None),
                   ~select(TENANTS.c.tenant_id).where(
                       TENANTS.c.tenant_id == T.c.tenant_id,
                       TENANTS.c.stripe_customer_id.is_not(None)).exists())).scalar_one()
        pause_state = store.pause_state(conn)
    if oldest is not None and oldest.tzinfo is None:
        oldest = oldest.replace(tzinfo=now.tzinfo)
    return {
        "counts": counts,
        "oldest_pending_age_seconds": (round((now - oldest).total_seconds(), 3)
                                       if oldest is not None else None),
        "paused": pause_state.paused,
        "pause_reason": pause_state.reason,
        "pause_kind": pause_state.kind,
        "waiting_for_customer_mapping": int(unmapped),
    }
