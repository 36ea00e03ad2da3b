"""Late usage: events of a period whose invoice Stripe finalized before it took them, judged
from their calls (:mod:`.evidence`, :mod:`.judge`): no call that may have reached Stripe began
before the finalization (``after_finalization``), or none has reached it yet (``unsent``). An
event whose calls straddle the finalization is *uncertain*: it is never billed or written off
alone; its line settles it. A line that holds fewer units than Stripe took before it
finalized is late usage too, as one amount (``short_line``: Stripe has those events, so they
are never sent again as meter events). Stripe counts late usage on its meter but on no
invoice (``docs/stripe.md``, "What an invoice line proves").

A person bills each late event on the customer's next invoice (:func:`bill_next`: a new
event, timestamped now, inside the open period, under a new identifier linked to the
original) or writes it off (:func:`write_off`). Either is audited and recorded once per event
in ``late_usage``; a handled event is not late any more, so a second run does nothing more.
An event that is not late is refused, and then nothing of the request is applied.

Reconciliation stays exact: the original stays as it was (sent, counted by Stripe in its own
day), and the new event is an ordinary one, counted in the day it is sent for.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, and_, func, insert, literal, or_, select, union_all
from sqlalchemy import update as sa_update

from ..audit import write_audit
from ..status import NOT_AT_STRIPE, NOT_AT_STRIPE_IDLE, PENDING, SENT
from .enqueue import validate_usage
from .evidence import (
    AFTER_FINALIZATION,
    CLOSED,
    LATE,
    UNCERTAIN,
)
from .evidence import UNSENT as UNSENT_WHY
from .judge import judge, judging_line
from .operations import RESOLVE_REASONS, OperationError
from .sql import (
    IDLE_UNSENT,
    IN_FLIGHT_WHERE,
    INVOICE_PERIODS,
    LATE_USAGE,
    LINE_EVENTS,
    SUBSCRIPTION_ITEMS,
    TENANTS,
    T,
    as_utc,
    insert_for,
    sql_str,
    status_in,
)

#: The statuses of events Stripe has not accepted (cancelled and resolved ones are closed).
UNSENT = NOT_AT_STRIPE    # the name the periods reads know it by


def unsent_parts() -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """"Not accepted by Stripe" as two WHERE clauses to query apart and add up: the idle
    statuses with ``ix_outbox_unsent``'s predicate repeated (so the planner reads that index,
    not the table), and the events in flight (``ix_outbox_processing_deadline``)."""
    return (status_in(NOT_AT_STRIPE_IDLE), IDLE_UNSENT), (IN_FLIGHT_WHERE,)


#: The subscription statuses whose open period bills.
BILLING_STATUSES = ("active", "trialing", "past_due", "unpaid")
#: The audit log's names, and ``late_usage.action``.
BILLED_NEXT, WRITTEN_OFF = "billed_next", "written_off"
AUDIT_BILL_NEXT, AUDIT_WRITE_OFF = "late_bill_next", "late_write_off"


@dataclass(frozen=True)
class LateEvent:
    """A late event: on no invoice. ``why``: ``after_finalization`` or ``unsent``."""

    id: int
    tenant_id: str
    stripe_customer_id: str
    meter: str
    quantity: int
    occurred_at: datetime
    sent_at: datetime | None
    status: str
    idempotency_key: str
    period_start: datetime
    period_end: datetime
    invoice_id: str
    finalized_at: datetime

    @property
    def why(self) -> str:
        return AFTER_FINALIZATION if self.status == SENT else UNSENT_WHY

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "tenant_id": self.tenant_id,
                "stripe_customer_id": self.stripe_customer_id, "meter": self.meter,
                "quantity": self.quantity, "occurred_at": self.occurred_at.isoformat(),
                "sent_at": None if self.sent_at is None else self.sent_at.isoformat(),
                "status": self.status, "period_start": self.period_start.isoformat(),
                "period_end": self.period_end.isoformat(), "invoice_id": self.invoice_id,
                "finalized_at": self.finalized_at.isoformat(), "why": self.why}


def _utc(value: Any) -> datetime:
    found = as_utc(value)
    assert found is not None
    return found


def find_late(engine: Engine, *, now: datetime, revisit: bool = False) -> int:
    """Judge what changed since the last look (:func:`.judge.judge`): the finalized lines not
    judged yet, and those whose period had an event sent since (with ``revisit``, the lines
    still open to question too: the scheduled pass). How many lines were judged. Run after
    each read of Stripe's invoices and before late usage is listed."""
    return judge(engine, now=now, revisit=revisit).lines


def _handled() -> Any:
    return select(LATE_USAGE.c.event_id).where(LATE_USAGE.c.event_id == T.c.id).exists()


def _judged() -> Any:
    return select(LINE_EVENTS.c.event_id).where(LINE_EVENTS.c.event_id == T.c.id).exists()


def late_events(conn: Connection, ids: Sequence[int] | None = None) -> list[LateEvent]:
    """The late events not handled yet (of ``ids`` when given), oldest first: those the judge
    found late, or uncertain and settled by their line as not on it; and the unsent events of
    a finalized line's period never claimed before it finalized that the judge has not seen
    yet (read through the unsent events' index: few)."""
    customer = func.coalesce(T.c.stripe_customer_id, TENANTS.c.stripe_customer_id)
    cols = (T.c.id, T.c.tenant_id, customer.label("customer"), T.c.meter, T.c.quantity,
            T.c.occurred_at, T.c.sent_at, T.c.status, T.c.idempotency_key)
    judged = (select(*cols, LINE_EVENTS.c.period_start.label("period_start"),
                     LINE_EVENTS.c.period_end.label("period_end"),
                     LINE_EVENTS.c.invoice_id.label("invoice_id"),
                     LINE_EVENTS.c.finalized_at.label("finalized_at"))
              .select_from(LINE_EVENTS)
              .join(T, T.c.id == LINE_EVENTS.c.event_id)
              .outerjoin(TENANTS, TENANTS.c.tenant_id == T.c.tenant_id)
              .where(or_(LINE_EVENTS.c.place == sql_str(LATE),
                         LINE_EVENTS.c.settled == sql_str(LATE)),
                     T.c.status.not_in([sql_str(c) for c in CLOSED]), ~_handled()))

    def unsent(where: tuple[Any, ...]) -> Any:
        lp = INVOICE_PERIODS
        part = (select(*cols, lp.c.period_start.label("period_start"),
                       lp.c.period_end.label("period_end"),
                       lp.c.invoice_id.label("invoice_id"),
                       lp.c.finalized_at.label("finalized_at"))
                .select_from(T)
                .outerjoin(TENANTS, TENANTS.c.tenant_id == T.c.tenant_id)
                .join(lp, and_(
                    lp.c.stripe_customer_id == customer, lp.c.meter == T.c.meter,
                    lp.c.period_start <= T.c.occurred_at, T.c.occurred_at < lp.c.period_end))
                .where(*where, judging_line(),
                       or_(T.c.first_attempt_at.is_(None),
                           T.c.first_attempt_at >= lp.c.finalized_at),
                       ~_judged(), ~_handled()))
        return part if ids is None else part.where(T.c.id.in_(list(ids)))

    if ids is not None:
        judged = judged.where(T.c.id.in_(list(ids)))
    idle, in_flight = unsent_parts()
    both = union_all(judged, unsent(idle), unsent(in_flight)).subquery("late")
    found: dict[int, LateEvent] = {}
    for r in conn.execute(select(both).order_by(both.c.occurred_at, both.c.id,
                                                both.c.finalized_at)):
        found.setdefault(int(r.id), LateEvent(
            int(r.id), str(r.tenant_id), str(r.customer), str(r.meter), int(r.quantity),
            _utc(r.occurred_at), as_utc(r.sent_at), str(r.status), str(r.idempotency_key),
            _utc(r.period_start), _utc(r.period_end), str(r.invoice_id),
            _utc(r.finalized_at)))
    return list(found.values())


def uncertain_events(conn: Connection, ids: Sequence[int]) -> dict[int, tuple[str, str | None]]:
    """Of ``ids``, the events whose calls straddle their invoice's finalization that their
    line did not settle as late: id -> (invoice, ``billed`` or None when not settled)."""
    if not ids:
        return {}
    return {int(r.event_id): (str(r.invoice_id), r.settled) for r in conn.execute(
        select(LINE_EVENTS.c.event_id, LINE_EVENTS.c.invoice_id, LINE_EVENTS.c.settled).where(
            LINE_EVENTS.c.event_id.in_(list(ids)), LINE_EVENTS.c.place == literal(UNCERTAIN),
            or_(LINE_EVENTS.c.settled.is_(None), LINE_EVENTS.c.settled != literal(LATE))))}


def _not_late(event_id: int, doubt: tuple[str, str | None] | None) -> str:
    """Why an event cannot be billed again or written off, in one line."""
    if doubt is None:
        return (f"event {event_id} is not late: it is not in a period whose invoice Stripe "
                f"finalized before accepting it")
    invoice, settled = doubt
    if settled is not None:
        return (f"event {event_id} is billed on invoice {invoice}: Stripe's answer came after "
                f"the invoice finalized, but its line holds the event; it is not late")
    return (f"event {event_id} may be on invoice {invoice}: a call that may have reached "
            f"Stripe began before it finalized and the answer came after, so the invoice's "
            f"line decides; it is never billed or written off alone")


@dataclass(frozen=True)
class LateResult:
    """What one action did: its audit entry (None when nothing was left to do), the events it
    handled, and those handled before (left as they were)."""

    audit_id: int | None
    handled: list[int]
    already: dict[int, str]
    #: Billed next: original id -> the new event's id.
    new_events: dict[int, int]


def _check(conn: Connection, ids: Sequence[int], note: str) -> tuple[list[LateEvent],
                                                                  dict[int, str]]:
    """The late events of ``ids``, and those handled before (id -> what was done); refuses
    the whole request if any other is not late."""
    if not note or not note.strip():
        raise OperationError("a note is required")
    wanted = list(dict.fromkeys(int(i) for i in ids))
    if not wanted:
        raise OperationError("no event given")
    already = {int(r.event_id): str(r.action) for r in conn.execute(
        select(LATE_USAGE.c.event_id, LATE_USAGE.c.action)
        .where(LATE_USAGE.c.event_id.in_(wanted)))}
    late = late_events(conn, [i for i in wanted if i not in already])
    found = {e.id for e in late}
    refused = [i for i in wanted if i not in found and i not in already]
    if refused:
        doubt = uncertain_events(conn, refused)
        raise OperationError("; ".join(_not_late(i, doubt.get(i)) for i in refused))
    return late, already


def new_identifier(event: LateEvent) -> str:
    """The identifier the late event is billed again under: ``late:<id>:<digest>`` (at most
    100 characters), unique to the original."""
    digest = hashlib.sha256(event.idempotency_key.encode()).hexdigest()[:16]
    return f"late:{event.id}:{digest}"


def _open_period(conn: Connection, event: LateEvent, now: datetime) -> bool:
    return conn.execute(select(SUBSCRIPTION_ITEMS.c.id).where(
        SUBSCRIPTION_ITEMS.c.stripe_customer_id == event.stripe_customer_id,
        SUBSCRIPTION_ITEMS.c.meter == event.meter,
        SUBSCRIPTION_ITEMS.c.current_period_start <= now,
        SUBSCRIPTION_ITEMS.c.current_period_end > now,
        SUBSCRIPTION_ITEMS.c.subscription_status.in_(BILLING_STATUSES)).limit(1)).first() \
        is not None


def bill_next(engine: Engine, ids: Sequence[int], *, actor: str, note: str,
              now: datetime) -> LateResult:
    """Bill each late event on the customer's next invoice: a new event with the same tenant,
    customer, meter and quantity, timestamped ``now`` (inside the open period), sent like
    any other. Refused when an event is not late, or its customer has no open period for its
    meter (nothing is applied then)."""
    with engine.begin() as conn:
        late, already = _check(conn, ids, note)
        closed = [e for e in late if not _open_period(conn, e, now)]
        if closed:
            raise OperationError("; ".join(
                f"event {e.id}: customer {e.stripe_customer_id} has no open billing period "
                f"for meter {e.meter} to bill it in" for e in closed))
        new_events: dict[int, int] = {}
        for e in late:
            if not _take(conn, e, BILLED_NEXT, actor=actor, note=note, reason=None, now=now):
                already[e.id] = BILLED_NEXT
                continue
            key = new_identifier(e)
            validate_usage(tenant_id=e.tenant_id, quantity=e.quantity, idempotency_key=key,
                           meter=e.meter, occurred_at=now, now=now)
            new_id = conn.execute(insert(T).values(
                tenant_id=e.tenant_id, meter=e.meter, quantity=e.quantity,
                idempotency_key=key, occurred_at=now, status=PENDING, attempt_count=0,
                call_count=0, key_generation=0, next_attempt_at=now, created_at=now,
                updated_at=now, stripe_customer_id=e.stripe_customer_id)
                .returning(T.c.id)).scalar_one()
            conn.execute(sa_update(LATE_USAGE).where(LATE_USAGE.c.event_id == e.id)
                         .values(new_event_id=int(new_id)))
            new_events[e.id] = int(new_id)
        audit_id = (write_audit(conn, actor=actor, action=AUDIT_BILL_NEXT,
                                event_ids=[*new_events, *new_events.values()], note=note,
                                now=now) if new_events else None)
    return LateResult(audit_id, list(new_events), already, new_events)


def write_off(engine: Engine, ids: Sequence[int], *, actor: str, reason: str, note: str,
              now: datetime) -> LateResult:
    """Close late events unbilled, with a reason code (as for ``resolve``) and a note. The
    events keep their status; they are no longer listed as late."""
    if reason not in RESOLVE_REASONS:
        raise OperationError(f"reason must be one of {', '.join(RESOLVE_REASONS)}, "
                             f"got {reason!r}")
    with engine.begin() as conn:
        late, already = _check(conn, ids, note)
        done = []
        for e in late:
            if _take(conn, e, WRITTEN_OFF, actor=actor, note=note, reason=reason, now=now):
                done.append(e.id)
            else:
                already[e.id] = WRITTEN_OFF
        audit_id = (write_audit(conn, actor=actor, action=AUDIT_WRITE_OFF, event_ids=done,
                                reason_code=reason, note=note, now=now) if done else None)
    return LateResult(audit_id, done, already, {})


def _take(conn: Connection, event: LateEvent, action: str, *, actor: str, note: str,
          reason: str | None, now: datetime) -> bool:
    """Record that ``event`` is handled; False when another request did it first."""
    done = conn.execute(insert_for(conn, LATE_USAGE).values(
        event_id=event.id, action=action, invoice_id=event.invoice_id, reason=reason,
        note=note, actor=actor, at=now).on_conflict_do_nothing(
        index_elements=[LATE_USAGE.c.event_id]))
    return bool(done.rowcount)
