"""What an invoice line proves, as pure functions: where each event of a line's period stands
(:func:`place_of`, from its calls), how the finalized line settles the events whose calls
straddle its finalization (:func:`settle`), and the line's verdict (:func:`verdict_of`). No
database and no clock: :mod:`.judge` feeds them; a table test walks every case.

Stripe's facts they rest on (``docs/stripe.md``, "What an invoice line proves"):

- What bills is a finalized invoice's metered line (``quantity_decimal``). Stripe aggregates
  asynchronously: an event accepted moments before the finalization can miss the line.
- The time the outbox records a send is when the answer came, not when Stripe took the event.
  A retry of an event Stripe already took is answered "already exists" (or, with the same
  idempotency key, the first answer again), so only the calls tell: an event is *late* only
  when no call that may have reached Stripe began before the finalization; one whose calls
  straddle it is *uncertain* until its line settles it.
- A call may have reached Stripe when it was answered (200, or "already exists") or when its
  outcome is unknown (a timeout, a reset, a 5xx, a worker that died holding the event). A
  refusal before Stripe did anything (429, 409, 503, connection refused) did not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from .states import Outcome, Status

#: Where an event stands against its finalized line.
OURS, LATE, UNCERTAIN = "ours", "late", "uncertain"
#: Why an event (or an amount) is late usage: it reached Stripe after the finalization, it
#: has not reached it, or the line holds fewer units than Stripe took before (one amount:
#: Stripe has the events, so they are never sent again).
AFTER_FINALIZATION, UNSENT, SHORT_LINE = "after_finalization", "unsent", "short_line"
LATE_WHY = (AFTER_FINALIZATION, UNSENT, SHORT_LINE)
#: How a line settled an uncertain event.
BILLED = "billed"
#: A line's verdict.
MATCHES, SHORT, OVER, FREE, VOID, UNCOLLECTIBLE, NOT_COMPARED = (
    "matches", "short", "over", "free", "void", "uncollectible", "not_compared")
VERDICTS = (MATCHES, LATE, SHORT, OVER, FREE, VOID, UNCOLLECTIBLE, NOT_COMPARED)
#: The verdicts of a line that judges its period's events (a free, voided or uncompared line
#: makes none of them late).
JUDGING = (MATCHES, LATE, SHORT, OVER, UNCOLLECTIBLE)
#: Meter formulas a line is compared on: units for ``sum``, events for ``count``. A ``last``
#: meter's line is listed, not compared.
COMPARED_FORMULAS = ("sum", "count")
#: Statuses closed by a person or Stripe before billing: on no line, never late.
CLOSED = (Status.RESOLVED.value, Status.CANCELLED.value)
#: The outcomes of a call that may have left the event at Stripe.
_REACHING = (Outcome.DELIVERED.value, Outcome.UNKNOWN.value)
#: The HTTP status of Stripe's "An event already exists with identifier" answer.
_DUPLICATE_STATUS = 400
#: Uncertain events a line is searched for an exact settlement among, at most.
SETTLE_SEARCH_LIMIT = 16


@dataclass(frozen=True)
class Call:
    """One call made for an event (an attempt row)."""

    at: datetime
    outcome: str
    http_status: int | None
    applied: bool


@dataclass(frozen=True)
class Calls:
    """What the outbox knows of an event's calls: its status, its first claim
    (``first_attempt_at``, no later than any call for its identifier), the first moment its
    outcome was unknown (a worker died holding it, or a call timed out), when its send was
    recorded, and, when asked for, its attempt rows."""

    status: str
    first_claim: datetime | None
    first_unknown: datetime | None
    sent_at: datetime | None
    calls: tuple[Call, ...] | None = None


def needs_calls(ev: Calls, finalized_at: datetime) -> bool:
    """Whether :func:`place_of` needs the event's attempt rows: only when its first claim
    came before the finalization and nothing simpler settles it."""
    if ev.status in CLOSED or ev.status == Status.REJECTED.value:
        return False
    if ev.status == Status.SENT.value and ev.sent_at is not None and ev.sent_at < finalized_at:
        return False
    first = ev.first_claim if ev.first_claim is not None else ev.sent_at
    return first is not None and first < finalized_at


def place_of(ev: Calls, finalized_at: datetime) -> tuple[str, str | None] | None:
    """Where the event stands against a line finalized at ``finalized_at``: ``(OURS, None)``
    (Stripe took it before), ``(LATE, why)`` (no call that may have reached Stripe began
    before), ``(UNCERTAIN, None)`` (its calls straddle the finalization); None for an event
    closed unbilled (resolved, cancelled). Raises ``ValueError`` when the attempt rows are
    needed (:func:`needs_calls`) and were not given."""
    if ev.status in CLOSED:
        return None
    if ev.status == Status.REJECTED.value:
        return LATE, UNSENT          # Stripe refused it: on no line, a person's to send
    sent = ev.status == Status.SENT.value
    if sent and ev.sent_at is not None and ev.sent_at < finalized_at:
        return OURS, None
    if not needs_calls(ev, finalized_at):
        return (LATE, AFTER_FINALIZATION) if sent else (LATE, UNSENT)
    if ev.calls is None:
        raise ValueError("the event's calls are needed to place it")
    calls = [c for c in ev.calls if ev.first_claim is None or c.at >= ev.first_claim]
    reached = sorted([c.at for c in calls if c.outcome in _REACHING]
                     + ([ev.first_unknown] if ev.first_unknown is not None else []))
    if not sent:
        if ev.status == Status.PROCESSING.value:
            return UNCERTAIN, None   # a call begun after a claim before the finalization
        return (UNCERTAIN, None) if reached and reached[0] < finalized_at else (LATE, UNSENT)
    taken = _taken_at(calls, ev.first_unknown)
    if taken is not None and taken < finalized_at:
        return OURS, None
    if reached and reached[0] < finalized_at:
        return UNCERTAIN, None
    return LATE, AFTER_FINALIZATION


def _taken_at(calls: Sequence[Call], first_unknown: datetime | None) -> datetime | None:
    """When Stripe took a sent event, at the latest: the start of the call answered 200; for
    an "already exists" answer, the latest call before it that may have reached Stripe (it
    took the event from one of those); None when that cannot be told."""
    delivered = [c for c in calls if c.outcome == Outcome.DELIVERED.value and c.applied]
    if not delivered:
        return None
    answer = max(delivered, key=lambda c: c.at)
    if answer.http_status != _DUPLICATE_STATUS:
        return answer.at
    before = [c.at for c in calls if c.outcome in _REACHING and c.at < answer.at]
    if first_unknown is not None and first_unknown < answer.at:
        before.append(first_unknown)
    return max(before) if before else None


@dataclass(frozen=True)
class Placed:
    """An event of a line's period, placed: its units on the line (its quantity for a
    ``sum`` meter, 1 for ``count``)."""

    event_id: int
    units: int
    place: str
    why: str | None = None


@dataclass(frozen=True)
class Settlement:
    """What a line holds against what the project counts for it.

    ``ours``: units Stripe took before the finalization, with the uncertain ones the line
    settled as on it; ``late``: units that reached Stripe after it or have not reached it,
    with the uncertain ones settled as not on it; ``uncertain``: units the line could not
    settle; ``difference``: Stripe's quantity less ``ours`` and ``uncertain`` (below zero:
    the line is short by that much; above: it is over). ``settled``: event id -> ``billed`` or
    ``late`` for each uncertain event the line settled."""

    ours: int
    ours_events: int
    late: int
    late_events: int
    uncertain: int
    uncertain_events: int
    difference: Decimal
    settled: dict[int, str]


def settle(invoiced: Decimal, placed: Sequence[Placed]) -> Settlement:
    """Settle a finalized line's uncertain events by its quantity ``invoiced``:

    - it holds at least every sure and uncertain unit: every uncertain event is billed;
    - it holds no more than the sure units: every uncertain event is late (the line holds
      exactly the rest, or is short);
    - in between, the uncertain events whose units make up exactly what the line holds
      beyond the sure ones are billed and the rest late, when exactly one such set exists
      (among :data:`SETTLE_SEARCH_LIMIT` events at most); otherwise none is settled, and what
      the line lacks is one amount (a short line).
    """
    ours = [p for p in placed if p.place == OURS]
    late = [p for p in placed if p.place == LATE]
    uncertain = [p for p in placed if p.place == UNCERTAIN]
    sure = sum(p.units for p in ours)
    doubt = sum(p.units for p in uncertain)
    settled: dict[int, str] = {}
    if invoiced >= sure + doubt:
        settled = {p.event_id: BILLED for p in uncertain}
    elif invoiced <= sure:
        settled = {p.event_id: LATE for p in uncertain}
    else:
        billed = _unique_subset(uncertain, invoiced - sure)
        if billed is not None:
            settled = {p.event_id: BILLED if p.event_id in billed else LATE for p in uncertain}
    on_line = [p for p in uncertain if settled.get(p.event_id) == BILLED]
    off_line = [p for p in uncertain if settled.get(p.event_id) == LATE]
    left = [p for p in uncertain if p.event_id not in settled]
    held = sure + sum(p.units for p in on_line)
    return Settlement(
        ours=held, ours_events=len(ours) + len(on_line),
        late=sum(p.units for p in late + off_line), late_events=len(late) + len(off_line),
        uncertain=sum(p.units for p in left), uncertain_events=len(left),
        difference=invoiced - held - sum(p.units for p in left), settled=settled)


def _unique_subset(events: Sequence[Placed], target: Decimal) -> set[int] | None:
    """The one set of ``events`` whose units add up to ``target``; None when there is none,
    more than one, or too many events to look."""
    if len(events) > SETTLE_SEARCH_LIMIT or target != target.to_integral_value():
        return None
    goal = int(target)
    # Sums reachable so far -> the sets reaching them (two or more: ambiguous).
    ways: dict[int, list[frozenset[int]]] = {0: [frozenset()]}
    for p in events:
        for total, sets in [(t, list(v)) for t, v in ways.items()]:
            reach = total + p.units
            if reach > goal:
                continue
            more = ways.setdefault(reach, [])
            for one in sets:
                if len(more) < 2:
                    more.append(one | {p.event_id})
    found = ways.get(goal, [])
    return set(found[0]) if len(found) == 1 else None


def is_free(*, billing_reason: str | None, amount: int | None, period_start: datetime,
            period_end: datetime, trials: Sequence[tuple[datetime, datetime]]) -> bool:
    """Whether a line bills no usage: a new subscription's first invoice (finalized at once,
    ``subscription_create``) with a $0 line, or a $0 line of a period within a trial (usage in
    a trial is not billed). Its period's usage is judged by another line, or is unbilled."""
    if amount not in (0, None):
        return False
    if billing_reason == "subscription_create":
        return True
    return amount == 0 and any(start <= period_start and period_end <= end
                               for start, end in trials)


def verdict_of(*, invoice_status: str, free: bool, compared: bool,
               settlement: Settlement | None) -> str:
    """The line's verdict: its invoice's ``void`` or ``uncollectible`` first, then ``free``,
    ``not_compared`` (a ``last`` meter, an unknown one), then by the figures: ``short``
    (Stripe holds less than it took before the finalization), ``over`` (more), ``late``
    (the line is right, and late usage exists), ``matches``."""
    if invoice_status in (VOID, UNCOLLECTIBLE):
        return invoice_status
    if free:
        return FREE
    if not compared or settlement is None:
        return NOT_COMPARED
    if settlement.difference < 0:
        return SHORT
    if settlement.difference > 0:
        return OVER
    return LATE if settlement.late else MATCHES


def as_number(value: Decimal | int | str | None) -> int | float | None:
    """A quantity for JSON: an integer when whole."""
    if value is None:
        return None
    found = Decimal(value)
    return int(found) if found == found.to_integral_value() else float(found)
