"""An outbox event's statuses and every named group of them: the one place a status is
spelled. Standard library only, so the models, the SQL predicates, the state machine
(``webapp.outbox.states``) and the templates all read it without an import cycle.
``tests/test_architecture.py`` fails on a quoted status name anywhere else in the product
(migrations keep theirs: they are history).

What each status means, and what moves an event out of it, is told in
``webapp.outbox.states``; the groups here are named for what they mean, and each is written
once. A notification's delivery has statuses of its own (:class:`Delivery`), spelled here too
because two of its words are the same.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class Status(StrEnum):
    """An outbox event's status (``stripe_usage_outbox.status``)."""

    PENDING = "pending"
    PROCESSING = "processing"
    RETRYING = "retrying"
    SENT = "sent"
    DEAD = "dead"
    RESOLVED = "resolved"
    REJECTED = "rejected"
    CANCELLED = "cancelled"


#: Each status as a plain string (what a row holds, what SQL and JSON carry).
PENDING, PROCESSING, RETRYING = (Status.PENDING.value, Status.PROCESSING.value,
                                 Status.RETRYING.value)
SENT, DEAD, RESOLVED = Status.SENT.value, Status.DEAD.value, Status.RESOLVED.value
REJECTED, CANCELLED = Status.REJECTED.value, Status.CANCELLED.value

#: Every status, in the state machine's order.
ALL: tuple[str, ...] = tuple(s.value for s in Status)
#: Waiting for a claim: never tried, or tried and due again at ``next_attempt_at``.
WAITING: tuple[str, ...] = (PENDING, RETRYING)
#: Held by one worker's claim until its deadline.
IN_FLIGHT: tuple[str, ...] = (PROCESSING,)
#: On its way to Stripe: waiting or in flight (Stripe has not answered for it yet).
ON_ITS_WAY: tuple[str, ...] = (PENDING, PROCESSING, RETRYING)
#: Waiting for a person: dead (not delivered) or rejected (delivered, then refused).
NEEDS_A_PERSON: tuple[str, ...] = (DEAD, REJECTED)
#: Closed for good: nothing moves them again.
FINAL: tuple[str, ...] = (RESOLVED, CANCELLED)
#: Not at Stripe as usage: on its way, or a person's to decide (late usage and unbilled
#: usage count these as not billed).
NOT_AT_STRIPE: tuple[str, ...] = (PENDING, RETRYING, PROCESSING, DEAD, REJECTED)
#: :data:`NOT_AT_STRIPE` less what a worker holds right now.
NOT_AT_STRIPE_IDLE: tuple[str, ...] = (PENDING, RETRYING, DEAD, REJECTED)
#: To be sent, or given up on and not yet decided: the dashboard's "unsent" counts.
UNSENT_OPEN: tuple[str, ...] = (PENDING, RETRYING, DEAD)
#: Sent, or held by a worker: what the unsent indexes leave out (their predicate is
#: ``status NOT IN`` these).
SENT_OR_CLAIMED: tuple[str, ...] = (SENT, PROCESSING)
#: Every status but the waiting ones, in the order ``ix_outbox_waiting_created``'s predicate
#: spells them (``status NOT IN (…)``: so SQLite never takes that index for the claim's).
NOT_WAITING: tuple[str, ...] = (SENT, PROCESSING, DEAD, RESOLVED, REJECTED, CANCELLED)
#: Answered by Stripe as accepted at least once (``sent_at`` set): sent, then maybe refused
#: by an error report or cancelled by an adjustment.
REACHED_STRIPE: tuple[str, ...] = (SENT, REJECTED, CANCELLED)
#: What the retention pruner may delete once old: sent (kept in the rollup) or final.
PRUNABLE: tuple[str, ...] = (SENT, RESOLVED, CANCELLED)
#: The statuses usage pages and reports keep figures for, in the pages' order (``processing``
#: is counted with ``pending`` there).
USAGE_ORDER: tuple[str, ...] = (SENT, PENDING, RETRYING, REJECTED, DEAD, CANCELLED,
                                   RESOLVED)


def others(group: Iterable[str]) -> tuple[str, ...]:
    """Every status not in ``group``, in the state machine's order."""
    kept = set(group)
    return tuple(s for s in ALL if s not in kept)


#: Neither sent nor held by a worker: the rows the unsent indexes hold.
RESTING: tuple[str, ...] = others(SENT_OR_CLAIMED)


def sql_list(group: Iterable[str], known: Iterable[str] = ALL) -> str:
    """``'a', 'b'``: a group as SQL literals, for predicates written as text (the values are
    this module's own words, never input; ``known``: the statuses they must be among)."""
    words = set(known)
    found = []
    for s in group:
        if s not in words:
            raise ValueError(f"unknown status {s!r}")
        found.append(f"'{s}'")
    return ", ".join(found)


def sql_in(group: Iterable[str], column: str = "status", known: Iterable[str] = ALL) -> str:
    """``status IN ('a', 'b')`` (``=`` for one) as SQL text."""
    listed = list(group)
    if len(listed) == 1:
        return f"{column} = {sql_list(listed, known)}"
    return f"{column} IN ({sql_list(listed, known)})"


def sql_not_in(group: Iterable[str], column: str = "status") -> str:
    """``status NOT IN ('a', 'b')`` (``<>`` for one) as SQL text."""
    listed = list(group)
    if len(listed) == 1:
        return f"{column} <> {sql_list(listed)}"
    return f"{column} NOT IN ({sql_list(listed)})"


class Delivery(StrEnum):
    """A notification delivery's status (``notify_deliveries.status``)."""

    PENDING = "pending"
    SENT = "sent"
    FAILED = "failed"


#: Each delivery status as a plain string, and those still to go or given up.
DELIVERY_PENDING, DELIVERY_SENT, DELIVERY_FAILED = (Delivery.PENDING.value,
                                                    Delivery.SENT.value, Delivery.FAILED.value)
DELIVERY_ALL: tuple[str, ...] = tuple(d.value for d in Delivery)


#: The words templates read, as one namespace (``S.DEAD``, ``S.WAITING``).
TEMPLATE_NAMES = {
    **{s.name: s.value for s in Status},
    "ALL": ALL, "WAITING": WAITING, "ON_ITS_WAY": ON_ITS_WAY, "NEEDS_A_PERSON": NEEDS_A_PERSON,
    "FINAL": FINAL, "REACHED_STRIPE": REACHED_STRIPE, "USAGE_ORDER": USAGE_ORDER,
}
