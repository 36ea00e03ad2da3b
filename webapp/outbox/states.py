"""The event state machine: statuses, outcome classes and pure transition functions.

No database and no clock here: every function takes what it needs and returns what to write,
so the whole machine is covered by a table test.

Statuses, and what moves an event out of each:

``pending``     enqueued, never tried.             claim → ``processing``
``retrying``    tried, waiting for next_attempt_at. claim → ``processing``; requeue/resolve n/a
``processing``  claimed by one worker until processing_deadline_at.
                outcome → sent / retrying / dead; release (lane busy, claim too short, paused,
                systemic failure, graceful stop) → back to pending/retrying untouched;
                deadline passed → the rescuer returns it to pending/retrying.
``sent``        Stripe accepted it (200, or the duplicate-identifier 400). Accepted is not
                billed: Stripe's error report → ``rejected``; a person's cancel within
                Stripe's 24 hours → ``cancelled``; a person's resend of a day reconciliation
                found Stripe holding none of (``webapp.outbox.resend``) → ``pending``.
``dead``        a person must decide: permanent error, retries exhausted, or the outcome is
                unknown past Stripe's dedupe window. requeue → pending; resolve → resolved.
``rejected``    Stripe accepted the call, then reported the event invalid: nothing billed. A
                person fixes the cause and requeues it (under a new identifier), or resolves it.
``resolved``    a person closed it with a reason (billed manually, duplicate, …). Final.
``cancelled``   cancelled at Stripe by a meter event adjustment: its usage comes off the
                meter (an invoice Stripe already finalized keeps it). Final.

The same moves are :data:`EDGES`, as data: :func:`allowed` answers whether a move may start
from a status, and a table test walks every edge. Only :mod:`webapp.outbox` writes ``status``.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from ..status import ALL
from ..status import Status as Status  # the outbox's modules import it from here

#: Stripe refuses events whose timestamp is older than this …
MAX_AGE = timedelta(days=35)
#: … or further ahead than this.
MAX_AHEAD = timedelta(minutes=5)


#: Every status (``webapp.status`` spells them and their groups).
ALL_STATUSES = ALL


class Outcome(StrEnum):
    """What one call to Stripe tells us about the event (see docs/stripe.md)."""

    DELIVERED = "delivered"        # 200, or 400 "An event already exists with identifier"
    NOT_EXECUTED = "not_executed"  # 429, 409, 503, connection refused: Stripe did nothing
    UNKNOWN = "unknown"            # timeout / reset after sending, 500/502/504: maybe applied
    PERMANENT = "permanent"        # any other 400: resending cannot help
    SYSTEMIC = "systemic"          # 401/403/404 endpoint: nobody can send
    METER_MISSING = "meter_missing"  # no active meter for the event name: its events wait


#: Outcomes that never change the event: it is released untouched (and sending paused, or
#: its meter marked missing).
RELEASING = frozenset({Outcome.SYSTEMIC, Outcome.METER_MISSING})


#: Outcomes that spend one of the event's OUTBOX_MAX_ATTEMPTS.
COUNTED = frozenset({Outcome.DELIVERED, Outcome.UNKNOWN, Outcome.PERMANENT})

DEAD_PAST_WINDOW = "outcome unknown past Stripe's dedupe window"
DEAD_EXHAUSTED = "retries exhausted"


@dataclass(frozen=True)
class Policy:
    """The numbers the transitions depend on (from Settings)."""

    max_attempts: int
    initial_backoff_seconds: float
    max_backoff_seconds: float
    dedupe_window_seconds: float

    def backoff(self, attempt: int, rng: random.Random | None = None) -> float:
        """min(max, initial·2^(attempt−1)), plus up to 25% jitter so retries do not stampede."""
        base = min(self.max_backoff_seconds,
                   self.initial_backoff_seconds * (2.0 ** min(max(attempt - 1, 0), 60)))
        jitter = (rng or random).uniform(0.0, 0.25) if base > 0 else 0.0
        return base * (1.0 + jitter)


@dataclass(frozen=True)
class EventView:
    """The fields of an event that its transition depends on."""

    status: str
    attempt_count: int
    call_count: int
    key_generation: int
    first_unknown_at: datetime | None


@dataclass(frozen=True)
class CallResult:
    """The classified result of one call (made by the gateway)."""

    outcome: Outcome
    http_status: int | None = None
    error_class: str | None = None
    error_code: str | None = None
    message: str | None = None
    request_id: str | None = None
    retry_after: float | None = None
    # For UNKNOWN: True when Stripe answered 5xx (it saved that answer under the key, so the
    # next try needs a fresh key); False for timeouts and lost connections (keep the key).
    fresh_key: bool = False


@dataclass(frozen=True)
class Transition:
    """What to write for an event after one call. ``None`` fields are left unchanged."""

    status: str
    attempt_count: int
    call_count: int
    key_generation: int
    next_attempt_at: datetime | None
    first_unknown_at: datetime | None
    sent: bool = False
    dead_reason: str | None = None
    counted: bool = True


def released_status(ev: EventView) -> str:
    """Where a claimed event goes back to when it is released without a call."""
    return Status.PENDING.value if ev.call_count == 0 else Status.RETRYING.value


def past_dedupe_window(ev: EventView, now: datetime, policy: Policy) -> bool:
    """True when a resend could land outside Stripe's dedupe window: never resend then."""
    if ev.first_unknown_at is None:
        return False
    return now - ev.first_unknown_at >= timedelta(seconds=policy.dedupe_window_seconds)


def transition(ev: EventView, result: CallResult, *, attempted_at: datetime,
               now: datetime, policy: Policy, rng: random.Random | None = None) -> Transition:
    """The event's next state after ``result``, a call started at ``attempted_at``.

    Raises ``ValueError`` for a SYSTEMIC or METER_MISSING result: those never change the
    event (the caller releases it and pauses sending, or marks the meter missing).
    """
    if ev.status != Status.PROCESSING:
        raise ValueError(f"only a processing event has an outcome, not {ev.status!r}")
    if result.outcome in RELEASING:
        raise ValueError(f"{result.outcome.value} does not change the event; release it")
    counted = result.outcome in COUNTED
    attempts = ev.attempt_count + (1 if counted else 0)
    calls = ev.call_count + 1
    first_unknown = ev.first_unknown_at
    generation = ev.key_generation

    if result.outcome is Outcome.DELIVERED:
        return Transition(Status.SENT.value, attempts, calls, generation, None, first_unknown,
                          sent=True)
    if result.outcome is Outcome.PERMANENT:
        reason = result.message or "permanent error"
        return Transition(Status.DEAD.value, attempts, calls, generation, None, first_unknown,
                          dead_reason=reason)

    if result.outcome is Outcome.UNKNOWN:
        first_unknown = first_unknown or attempted_at
        if result.fresh_key:
            generation += 1
        delay = policy.backoff(attempts, rng)
    else:  # NOT_EXECUTED: Stripe did nothing; wait as told, without spending the budget.
        uncounted = calls - attempts
        delay = result.retry_after if result.retry_after else policy.backoff(uncounted, rng)
        delay = min(max(delay, 0.0), max(policy.max_backoff_seconds, 1.0))

    if counted and attempts >= policy.max_attempts:
        return Transition(Status.DEAD.value, attempts, calls, generation, None, first_unknown,
                          dead_reason=_exhausted_reason(result), counted=counted)
    next_at = now + timedelta(seconds=delay)
    probe = EventView(Status.RETRYING.value, attempts, calls, generation, first_unknown)
    if past_dedupe_window(probe, next_at, policy):
        return Transition(Status.DEAD.value, attempts, calls, generation, None, first_unknown,
                          dead_reason=DEAD_PAST_WINDOW, counted=counted)
    return Transition(Status.RETRYING.value, attempts, calls, generation, next_at, first_unknown,
                      counted=counted)


def _exhausted_reason(result: CallResult) -> str:
    detail = result.message or result.error_class or result.outcome.value
    return f"{DEAD_EXHAUSTED} (last: {detail})"


def idempotency_key(identifier: str, generation: int) -> str:
    """The transport key for a call: stable across timeouts, fresh after each 5xx.

    Generation 0 is the identifier itself. Later ones carry a digest of the identifier, so a
    retry key cannot equal another event's identifier by accident (``usage:1`` retried must
    not reuse the key of an event whose identifier is ``usage:1:1``: Stripe would answer
    idempotency_error). Keys stay well under Stripe's 255 characters.
    """
    if not generation:
        return identifier
    digest = hashlib.blake2b(identifier.encode(), digest_size=6).hexdigest()
    return f"{identifier}:r{generation}:{digest}"


class Move(StrEnum):
    """What moves an event from one status to another."""

    CLAIM = "claim"          # a worker takes it (drainer)
    SEND = "send"            # a call's outcome is recorded (drainer)
    RELEASE = "release"      # claimed, not called: back untouched (drainer)
    RESCUE = "rescue"        # its claim expired: back to the queue (rescuer)
    REQUEUE = "requeue"      # a person sends it again
    RESOLVE = "resolve"      # a person closes it with a reason
    REJECT = "reject"        # Stripe's error report names it (the events poll, the webhook)
    CANCEL = "cancel"        # a person cancels it at Stripe (a meter event adjustment)
    RESEND = "resend"        # a person sends again what Stripe lost (a new identifier)


@dataclass(frozen=True)
class Edge:
    source: str
    move: Move
    target: str


_P, _R, _W = Status.PENDING.value, Status.PROCESSING.value, Status.RETRYING.value
#: Every move an event can make. Nothing else may change ``status``.
EDGES: tuple[Edge, ...] = (
    Edge(_P, Move.CLAIM, _R),
    Edge(_W, Move.CLAIM, _R),
    Edge(_R, Move.SEND, Status.SENT.value),
    Edge(_R, Move.SEND, _W),
    Edge(_R, Move.SEND, Status.DEAD.value),
    Edge(_R, Move.RELEASE, _P),
    Edge(_R, Move.RELEASE, _W),
    Edge(_R, Move.RESCUE, _P),
    Edge(_R, Move.RESCUE, _W),
    Edge(Status.DEAD.value, Move.REQUEUE, _P),
    Edge(Status.DEAD.value, Move.RESOLVE, Status.RESOLVED.value),
    Edge(Status.SENT.value, Move.REJECT, Status.REJECTED.value),
    Edge(Status.SENT.value, Move.CANCEL, Status.CANCELLED.value),
    Edge(Status.SENT.value, Move.RESEND, _P),
    Edge(Status.REJECTED.value, Move.REQUEUE, _P),
    Edge(Status.REJECTED.value, Move.RESOLVE, Status.RESOLVED.value),
)


def allowed(status: str, move: Move) -> bool:
    """Whether ``move`` may start from ``status`` (see :data:`EDGES`)."""
    return any(e.source == status and e.move is move for e in EDGES)


def targets(status: str, move: Move) -> frozenset[str]:
    """The statuses ``move`` can lead to from ``status`` (empty when not allowed)."""
    return frozenset(e.target for e in EDGES if e.source == status and e.move is move)


def requeue_identifier(key: str, generation: int) -> str:
    """The identifier a rejected event is sent under after its ``generation``-th requeue:
    ``<key>~r<n>``. Stripe may still hold the rejected identifier in its dedupe set, so the
    same one could be answered "already exists" and never billed; nothing was billed under
    it, so a new one cannot bill twice. A key too long for the suffix within Stripe's 100
    characters is cut, and a digest of the whole key keeps the result unique."""
    if generation < 1:
        raise ValueError("a requeued identifier has a generation of at least 1")
    plain = f"{key}~r{generation}"
    if len(plain) <= 100:
        return plain
    digest = hashlib.blake2b(key.encode(), digest_size=6).hexdigest()
    tail = f"~{digest}~r{generation}"
    return key[:100 - len(tail)] + tail


_RETRY_KEY = re.compile(r":r[0-9]+:[0-9a-f]{12}$")


def identifier_of(requested: str) -> str:
    """The identifier a Stripe error sample names: ``request.identifier`` is the identifier
    itself or, by the SDK's account of it, the request's idempotency key, which after a 5xx
    is ``<identifier>:rN:<digest>`` (:func:`idempotency_key`): that suffix is dropped."""
    return _RETRY_KEY.sub("", requested)
