"""What a person's requeue or cancel may do to an event: each rule once, with the words that
explain a refusal. The CLI, the web pages and the bulk previews all ask these functions (a
bulk preview compiles the same rule to SQL: :func:`webapp.outbox.sql.rule_sql`).

Pure, like :mod:`webapp.outbox.states`: no database and no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from .states import DEAD_PAST_WINDOW, EDGES, MAX_AGE, Move, Status, allowed

#: A requeue refuses events this close to the 35-day limit: they would be rejected on arrival.
REQUEUE_AGE_LIMIT = MAX_AGE - timedelta(minutes=10)

#: Stripe accepts a meter event adjustment only this long after it received the event; a
#: cancel is refused a little earlier, so a call made at the edge is not refused by Stripe.
CANCEL_WINDOW = timedelta(hours=24)
CANCEL_MARGIN = timedelta(minutes=10)


class RequeueCheck(StrEnum):
    """What a requeue may do with one event: the one rule the CLI, the web pages and the
    bulk preview all apply (through :func:`requeue_check`)."""

    OK = "ok"              # sent again (dead: same identifier; rejected: a new one)
    FORCE = "force"        # outcome unknown past Stripe's dedupe window: only when forced
    TOO_OLD = "too_old"    # past Stripe's 35-day limit: Stripe would refuse it; resolve it
    WRONG_STATUS = "wrong_status"  # only dead and rejected events are requeued


#: Why a requeue refuses an event, in words a person acts on.
REQUEUE_REFUSALS = {
    RequeueCheck.WRONG_STATUS: "only dead or rejected events can be requeued",
    RequeueCheck.TOO_OLD: "occurred more than 35 days ago; Stripe would reject it (resolve it "
                          "instead, e.g. billed manually)",
    RequeueCheck.FORCE: "its outcome is unknown and older than Stripe's dedupe window; Stripe "
                        "may already have it, so a resend could bill twice (check Stripe, "
                        "then use --force)",
}

#: The same refusals as a page says them: under a list of the events refused in bulk, and on
#: an event's own page (its alert).
REQUEUE_BULK_WORDS = {
    RequeueCheck.WRONG_STATUS: "neither dead nor rejected (any more)",
    RequeueCheck.TOO_OLD: "past Stripe's 35-day limit, resolve them instead",
}
REQUEUE_PAGE_WORDS = {
    RequeueCheck.TOO_OLD: "Older than Stripe's 35-day limit: it cannot be sent any more. Bill it "
                          "by hand and resolve it.",
    RequeueCheck.FORCE: "The outcome is unknown past Stripe's 24-hour dedupe window: Stripe may "
                        "already have it. Check Stripe before a forced requeue.",
}


# -- rules as data: the same rule runs in Python (one event) and in SQL (a bulk preview) --

@dataclass(frozen=True)
class StatusIn:
    """The event's status is one of ``statuses``."""

    statuses: tuple[str, ...]


@dataclass(frozen=True)
class Equals:
    """``field`` holds exactly ``value`` (an empty field does not)."""

    field: str
    value: str


@dataclass(frozen=True)
class OlderThan:
    """``field`` is set and lies ``age`` or more before now (``age`` None: the dedupe window
    of the settings); ``strict``: more than ``age``."""

    field: str
    age: timedelta | None
    strict: bool = False


@dataclass(frozen=True)
class AnyOf:
    parts: tuple[Condition, ...]


@dataclass(frozen=True)
class Not:
    """The opposite of ``part``; only over fields that are never empty (SQL's NULL is not
    false)."""

    part: Condition


Condition = StatusIn | Equals | OlderThan | AnyOf | Not

#: The requeue rule, as data: the first condition that holds gives the verdict, else ``OK``.
#: ``TOO_OLD`` comes before ``FORCE``: no force makes Stripe accept a timestamp over 35 days
#: old. ``webapp.outbox.sql.rule_sql`` compiles the same rule for a bulk preview.
#: A rejected event goes out under a new identifier, so no dedupe window can make it bill
#: twice: only its age matters.
REQUEUE_RULE: tuple[tuple[Condition, RequeueCheck], ...] = (
    (Not(StatusIn(tuple(e.source for e in EDGES if e.move is Move.REQUEUE))),
     RequeueCheck.WRONG_STATUS),
    (OlderThan("occurred_at", REQUEUE_AGE_LIMIT, strict=True), RequeueCheck.TOO_OLD),
    (StatusIn((Status.REJECTED.value,)), RequeueCheck.OK),
    (AnyOf((Equals("dead_reason", DEAD_PAST_WINDOW), OlderThan("first_unknown_at", None))),
     RequeueCheck.FORCE),
)


def holds(cond: Condition, row: Mapping[str, Any], *, now: datetime,
          window_seconds: float) -> bool:
    """Whether ``cond`` holds for ``row`` (field name -> value) at ``now``."""
    if isinstance(cond, StatusIn):
        return row["status"] in cond.statuses
    if isinstance(cond, Equals):
        return bool(row.get(cond.field) == cond.value)
    if isinstance(cond, OlderThan):
        value = row.get(cond.field)
        age = cond.age if cond.age is not None else timedelta(seconds=window_seconds)
        if value is None:
            return False
        return bool(value < now - age) if cond.strict else bool(value <= now - age)
    if isinstance(cond, AnyOf):
        return any(holds(p, row, now=now, window_seconds=window_seconds) for p in cond.parts)
    assert isinstance(cond, Not)
    return not holds(cond.part, row, now=now, window_seconds=window_seconds)


def requeue_check(*, status: str, occurred_at: datetime, dead_reason: str | None,
                  first_unknown_at: datetime | None, now: datetime,
                  window_seconds: float) -> RequeueCheck:
    """Whether a requeue may send this event again, and how (:data:`REQUEUE_RULE`)."""
    row = {"status": status, "occurred_at": occurred_at, "dead_reason": dead_reason,
           "first_unknown_at": first_unknown_at}
    for cond, verdict in REQUEUE_RULE:
        if holds(cond, row, now=now, window_seconds=window_seconds):
            return verdict
    return RequeueCheck.OK


def requeue_permitted(check: RequeueCheck, *, force: bool) -> bool:
    """Whether a requeue (forced or not) goes ahead for an event of this check."""
    return check is RequeueCheck.OK or (check is RequeueCheck.FORCE and force)


class CancelCheck(StrEnum):
    """Whether a cancel (a meter event adjustment) may be asked of Stripe for an event."""

    OK = "ok"
    NOT_SENT = "not_sent"      # only events Stripe accepted can be cancelled
    TOO_LATE = "too_late"      # Stripe accepts adjustments only within 24 hours


#: Why a cancel refuses an event, in words a person acts on.
CANCEL_REFUSALS = {
    CancelCheck.NOT_SENT: "only sent events can be cancelled",
    CancelCheck.TOO_LATE: "Stripe accepted it more than 24 hours ago, and accepts a "
                          "cancellation only within 24 hours; correct it on the invoice "
                          "instead (or with a negative event)",
}


def cancel_check(*, status: str, sent_at: datetime | None, now: datetime) -> CancelCheck:
    """Whether the event can still be cancelled at Stripe."""
    if not allowed(status, Move.CANCEL):
        return CancelCheck.NOT_SENT
    if sent_at is None or now - sent_at >= CANCEL_WINDOW - CANCEL_MARGIN:
        return CancelCheck.TOO_LATE
    return CancelCheck.OK
