"""Sending again what Stripe lost, as reconciliation found it.

Where the latest reconciliation that compared a customer's meter on a UTC day found that
Stripe holds none of what the outbox sent for it, a person may send that day's events again,
each under a new identifier (Stripe may still hold the old one in its dedupe set, and would
answer "already exists" without counting it). Where Stripe holds part of it, nobody can tell
from the totals which events it lacks: a person chooses them, never all in bulk, and never
more units than Stripe lacks.

Sent once: only events that were ``sent`` before that reconciliation started (so that it
compared them) are sent again, and a resend moves them out of ``sent``; once they are sent
again they were sent after it, so a second resend of the same finding sends nothing more. A
day past Stripe's 35-day limit cannot be sent again at all: it is billed by hand.

Every rule here is a read or a write in the caller's transaction (:func:`resend_day` and
:func:`resend_chosen` open their own); each refusal raises
:class:`~.operations.OperationError` with the reason, and nothing changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, select
from sqlalchemy import update as sa_update

from ..audit import write_audit
from .findings import EPSILON, TOO_OLD, Bucket, Finding, Held, number, require_finding
from .guards import REQUEUE_AGE_LIMIT
from .operations import OperationError, fresh_identifier
from .rollups import Mark, lock_sent_mark, unfold_sent
from .sql import AUDIT, AUDIT_EVENTS, SENT_AS, T, as_utc, id_in, text_in
from .states import Move, Status, allowed, requeue_identifier

#: The audit log's name for a resend.
ACTION = "resend"
#: The most events one resend of chosen events takes (a day's page lists at most these).
MAX_CHOSEN = 500


class ResendCheck(StrEnum):
    """Whether one event may be sent again for a finding."""

    OK = "ok"
    NOT_SENT = "not_sent"          # only sent events are sent again
    NOT_COMPARED = "not_compared"  # sent after the reconciliation compared the day
    TOO_OLD = "too_old"            # past Stripe's 35-day limit: billed by hand


def resend_check(*, status: str, sent_at: datetime | None, occurred_at: datetime,
                 compared_at: datetime, now: datetime) -> ResendCheck:
    """Whether an event may be sent again for a reconciliation that started at
    ``compared_at``. An event sent at or after it was not compared by it: sent again since,
    or sent late; Stripe may hold it, so sending it (again) could bill twice."""
    if not allowed(status, Move.RESEND):
        return ResendCheck.NOT_SENT
    if sent_at is None or sent_at >= compared_at:
        return ResendCheck.NOT_COMPARED
    if occurred_at < now - REQUEUE_AGE_LIMIT:
        return ResendCheck.TOO_OLD
    return ResendCheck.OK


def _refusal(check: ResendCheck, status: str, run_id: int) -> str:
    if check is ResendCheck.NOT_SENT:
        return f"is {status}: only sent events are sent again"
    if check is ResendCheck.NOT_COMPARED:
        return (f"was sent after reconciliation run {run_id} compared the day (already sent "
                "again, or sent late): it is not part of what Stripe lacks")
    return ("occurred more than 35 days ago: Stripe refuses events that old; bill it by hand "
            "(on the invoice)")


@dataclass(frozen=True)
class Resend:
    """One event sent again: as it is while sent, and the identifier it goes out under."""

    id: int
    tenant_id: str
    meter: str
    quantity: int
    occurred_at: datetime
    sent_at: datetime
    identifier: str
    new_identifier: str
    generation: int
    #: The customer it went to, and goes to again (the sent rollup's key).
    stripe_customer_id: str | None = None


@dataclass(frozen=True)
class ResendPlan:
    """What a resend sends again, for which finding; ``chosen``: events a person chose."""

    bucket: Bucket
    finding: Finding
    events: list[Resend]
    chosen: bool = False

    @property
    def ids(self) -> list[int]:
        return [e.id for e in self.events]

    @property
    def units(self) -> int:
        return sum(e.quantity for e in self.events)

    def note(self) -> str:
        """The audit entry's note: the finding, and what was sent again."""
        f = self.finding
        what = ("none" if f.held is Held.NONE
                else f"{number(f.stripe_units)} of our {number(f.local_units)}")
        how = "chosen event(s)" if self.chosen else "event(s)"
        return (f"Reconciliation run {f.run_id} found Stripe holding {what} of "
                f"{self.bucket.words()}: {len(self.events)} {how} ({self.units:,} units) sent "
                "again under new identifiers.")


_COLUMNS = (T.c.id, T.c.tenant_id, T.c.meter, T.c.status, T.c.quantity, T.c.occurred_at,
            T.c.sent_at, T.c.idempotency_key, T.c.identifier_generation, SENT_AS,
            T.c.stripe_customer_id)


def compared_events(conn: Connection, bucket: Bucket, found: Finding) -> list[Any]:
    """The bucket's events still ``sent`` as the finding's reconciliation compared them,
    oldest first."""
    return list(conn.execute(select(*_COLUMNS).where(
        *bucket.conditions(), T.c.status == Status.SENT.value,
        T.c.sent_at < found.compared_at).order_by(T.c.occurred_at, T.c.id)))


def sent_again_since(conn: Connection, bucket: Bucket, found: Finding
                     ) -> list[tuple[int, int, int]]:
    """The bucket's events sent again since the finding's reconciliation: (event id,
    quantity, audit entry id) each, oldest resend first."""
    rows = conn.execute(
        select(T.c.id, T.c.quantity, AUDIT.c.id.label("audit_id"))
        .select_from(T.join(AUDIT_EVENTS, AUDIT_EVENTS.c.event_id == T.c.id)
                     .join(AUDIT, AUDIT.c.id == AUDIT_EVENTS.c.audit_id))
        .where(*bucket.conditions(), AUDIT.c.action == ACTION,
               AUDIT.c.at >= found.compared_at).order_by(AUDIT.c.id, T.c.id)).all()
    seen: dict[int, tuple[int, int, int]] = {}
    for r in rows:
        seen.setdefault(int(r.id), (int(r.id), int(r.quantity), int(r.audit_id)))
    return list(seen.values())


def _plan(conn: Connection, bucket: Bucket, found: Finding, rows: Sequence[Any], *,
          chosen: bool) -> ResendPlan:
    # Each event's next identifier, checked free in bulk; the few taken ones one by one.
    first = {int(r.id): requeue_identifier(r.idempotency_key, int(r.identifier_generation) + 1)
             for r in rows}
    wanted = list(first.values())
    taken = {*conn.execute(select(T.c.idempotency_key).where(
        text_in(conn, T.c.idempotency_key, wanted))).scalars(),
        *conn.execute(select(T.c.stripe_identifier).where(
            text_in(conn, T.c.stripe_identifier, wanted))).scalars()}
    events = []
    for r in rows:
        generation = int(r.identifier_generation) + 1
        identifier = first[int(r.id)]
        if identifier in taken:
            identifier, generation = fresh_identifier(conn, r.idempotency_key, generation + 1)
        occurred, sent = as_utc(r.occurred_at), as_utc(r.sent_at)
        assert occurred is not None and sent is not None
        events.append(Resend(int(r.id), r.tenant_id, r.meter, int(r.quantity), occurred, sent,
                             r.sent_as, identifier, generation, r.stripe_customer_id))
    return ResendPlan(bucket, found, events, chosen)


def plan_day(conn: Connection, bucket: Bucket, *, now: datetime) -> ResendPlan:
    """Every event of a day Stripe holds none of, to be sent again; a read. Refused where
    the latest reconciliation did not find Stripe holding none of it, where it was sent
    again already, and past Stripe's 35-day limit."""
    found = require_finding(conn, bucket, now=now)
    if found.held is Held.PART:
        raise OperationError(
            f"Reconciliation run {found.run_id} found Stripe holding {number(found.stripe_units)} "
            f"of our {number(found.local_units)} for {bucket.words()}: part of the day, so its "
            "events are never sent again in bulk. Choose the ones Stripe lacks on the "
            "Reconciliation page, cancel some at Stripe within 24 hours, or bill the "
            "difference by hand.")
    rows = compared_events(conn, bucket, found)
    if not rows:
        again = sent_again_since(conn, bucket, found)
        if again:
            raise OperationError(
                f"Already sent again: {len(again)} event(s) ({sum(q for _, q, _ in again):,} "
                f"units) of {bucket.words()} went out again under new identifiers after "
                f"reconciliation run {found.run_id} found them missing; nothing more is "
                "sent. Reconcile again to see whether Stripe has them now.")
        raise OperationError(
            f"No event of {bucket.words()} is still sent as reconciliation run "
            f"{found.run_id} compared it: nothing to send again.")
    old = [r for r in rows if _check(r, found, now) is ResendCheck.TOO_OLD]
    if old:
        raise OperationError(TOO_OLD.format(day=bucket.day.isoformat()))
    return _plan(conn, bucket, found, rows, chosen=False)


def plan_chosen(conn: Connection, bucket: Bucket, ids: Sequence[int], *,
                now: datetime) -> ResendPlan:
    """The events a person chose of a day Stripe holds none or part of, to be sent again; a
    read. All or nothing: refused for any event not of the bucket or not compared by the
    latest reconciliation, and when they hold more than Stripe lacks (with what was sent
    again since)."""
    wanted = list(dict.fromkeys(int(i) for i in ids))
    if not wanted:
        raise OperationError("Choose at least one event to send again.")
    if len(wanted) > MAX_CHOSEN:
        raise OperationError(f"Choose at most {MAX_CHOSEN} events at a time.")
    found = require_finding(conn, bucket, now=now)
    rows = {int(r.id): r for r in conn.execute(select(*_COLUMNS)
                                               .where(id_in(conn, T.c.id, wanted)))}
    inside = {int(i) for i in conn.execute(select(T.c.id).where(
        id_in(conn, T.c.id, wanted), *bucket.conditions())).scalars()}
    problems = []
    for i in wanted:
        r = rows.get(i)
        if r is None:
            problems.append(f"{i}: no such event")
        elif i not in inside:
            problems.append(f"{i}: is not usage of {bucket.words()}")
        elif (check := _check(r, found, now)) is not ResendCheck.OK:
            problems.append(f"{i}: {_refusal(check, r.status, found.run_id)}")
    if problems:
        raise OperationError("; ".join(problems))
    chosen = [rows[i] for i in wanted]
    again = sent_again_since(conn, bucket, found)
    counted = found.formula == "count"
    asked = len(chosen) if counted else sum(int(r.quantity) for r in chosen)
    before = len(again) if counted else sum(q for _, q, _ in again)
    if asked + before > found.lacking + EPSILON:
        measure = "events" if counted else "units"
        since = f" after the {number(before)} sent again since" if before else ""
        raise OperationError(
            f"These {len(chosen)} events hold {number(asked)} {measure}, but Stripe lacks only "
            f"{number(max(found.lacking - before, 0))}{since} (reconciliation run "
            f"{found.run_id}: ours {number(found.local_units)}, Stripe's "
            f"{number(found.stripe_units)}): choose fewer, or Stripe would count some twice.")
    return _plan(conn, bucket, found, sorted(chosen, key=lambda r: (r.occurred_at, r.id)),
                 chosen=True)


def _check(row: Any, found: Finding, now: datetime) -> ResendCheck:
    occurred = as_utc(row.occurred_at)
    assert occurred is not None
    return resend_check(status=row.status, sent_at=as_utc(row.sent_at), occurred_at=occurred,
                        compared_at=found.compared_at, now=now)


@dataclass(frozen=True)
class ResendResult:
    """What a resend did: its audit entry and the plan it carried out."""

    audit_id: int
    plan: ResendPlan


def resend_day(engine: Engine, bucket: Bucket, *, actor: str, now: datetime,
               expected: Sequence[int] | None = None) -> ResendResult:
    """Send again every event of a day Stripe holds none of (:func:`plan_day`), audited.
    ``expected``: the ids a preview showed; refused if they are no longer exactly those."""
    with engine.begin() as conn:
        mark = lock_sent_mark(conn)
        plan = plan_day(conn, bucket, now=now)
        if expected is not None and sorted(set(expected)) != sorted(plan.ids):
            raise OperationError(
                f"The events of {bucket.words()} changed since the preview ({len(plan.ids)} "
                "would be sent again now): look at the preview again.")
        return ResendResult(_apply(conn, mark, plan, actor=actor, now=now), plan)


def resend_chosen(engine: Engine, bucket: Bucket, ids: Sequence[int], *, actor: str,
                  now: datetime) -> ResendResult:
    """Send again the events a person chose (:func:`plan_chosen`), audited."""
    with engine.begin() as conn:
        mark = lock_sent_mark(conn)
        plan = plan_chosen(conn, bucket, ids, now=now)
        return ResendResult(_apply(conn, mark, plan, actor=actor, now=now), plan)


def _apply(conn: Connection, mark: Mark, plan: ResendPlan, *, actor: str,
           now: datetime) -> int:
    """The move (``sent`` → ``pending``, a new identifier, a fresh attempt budget), out of
    the sent rollup, and one audit entry; under the rollup's lock (:func:`lock_sent_mark`),
    which also makes two resends of one finding wait for each other."""
    # The event keeps the Stripe customer it was sent to: the usage is that customer's, and
    # the finding was about that customer's meter, whatever the tenant is mapped to now (a
    # requeue after a rejection re-reads the mapping, since its fix is usually a new mapping;
    # nothing was wrong with this one's).
    moved = conn.execute(sa_update(T).where(
        id_in(conn, T.c.id, plan.ids), T.c.status == Status.SENT.value,
        T.c.sent_at < plan.finding.compared_at).values(
        status=Status.PENDING.value, attempt_count=0, call_count=0, key_generation=0,
        next_attempt_at=now, first_attempt_at=None, first_unknown_at=None, sent_at=None,
        claim_token=None, processing_deadline_at=None, updated_at=now)).rowcount
    if moved != len(plan.events):
        raise OperationError("Some of these events changed while they were being sent again; "
                             "nothing was done. Look again.")
    conn.execute(sa_update(T).where(T.c.id == bindparam("event_id")).values(
        stripe_identifier=bindparam("identifier"), identifier_generation=bindparam("generation")),
        [{"event_id": e.id, "identifier": e.new_identifier, "generation": e.generation}
         for e in plan.events])
    unfold_sent(conn, mark, plan.events)
    return write_audit(conn, actor=actor, action=ACTION, event_ids=plan.ids,
                       reason_code="stripe_holds_none" if plan.finding.held is Held.NONE
                       else "stripe_holds_part", note=plan.note(), now=now)
