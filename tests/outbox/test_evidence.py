"""What an invoice line proves, as a table: where each event stands from its calls, how a line
settles its uncertain events, and the line's verdict. Pure functions: no database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from webapp.outbox import evidence
from webapp.outbox.evidence import (
    AFTER_FINALIZATION,
    BILLED,
    LATE,
    OURS,
    UNCERTAIN,
    UNSENT,
    Call,
    Calls,
    Placed,
    is_free,
    place_of,
    settle,
    verdict_of,
)

F = datetime(2026, 11, 1, 1, 0, tzinfo=UTC)     # the invoice finalized
BEFORE, AFTER = F - timedelta(minutes=3), F + timedelta(minutes=3)
LATER = F + timedelta(minutes=30)


def ok(at: datetime) -> Call:
    return Call(at, "delivered", 200, True)


def exists(at: datetime) -> Call:
    """Stripe's "An event already exists with identifier" answer."""
    return Call(at, "delivered", 400, True)


def lost(at: datetime) -> Call:
    """A timeout or a 5xx: the outcome is unknown."""
    return Call(at, "unknown", None, True)


def refused(at: datetime) -> Call:
    """A 429: Stripe did nothing."""
    return Call(at, "not_executed", 429, True)


PLACES = [
    # (label, event, place)
    ("sent before the finalization", Calls("sent", BEFORE, None, BEFORE), (OURS, None)),
    ("claimed after, sent after", Calls("sent", AFTER, None, AFTER),
     (LATE, AFTER_FINALIZATION)),
    ("never claimed: recorded sent after (rows written by hand)",
     Calls("sent", None, None, AFTER), (LATE, AFTER_FINALIZATION)),
    ("one call begun before, answered after", Calls("sent", BEFORE, None, AFTER,
                                                    (ok(BEFORE),)), (OURS, None)),
    ("lost answer before, 'already exists' after: Stripe took it before",
     Calls("sent", BEFORE, BEFORE, AFTER, (lost(BEFORE), exists(AFTER))), (OURS, None)),
    ("lost answer before, 200 after (the same key's replay, or a new take): uncertain",
     Calls("sent", BEFORE, BEFORE, AFTER, (lost(BEFORE), ok(AFTER))), (UNCERTAIN, None)),
    ("lost before and after, then 'already exists': uncertain",
     Calls("sent", BEFORE, BEFORE, LATER, (lost(BEFORE), lost(AFTER), exists(LATER))),
     (UNCERTAIN, None)),
    ("a 429 before, 200 after: nothing reached Stripe before",
     Calls("sent", BEFORE, None, AFTER, (refused(BEFORE), ok(AFTER))),
     (LATE, AFTER_FINALIZATION)),
    ("a worker died holding it before, 200 after: uncertain",
     Calls("sent", BEFORE, BEFORE, AFTER, (ok(AFTER),)), (UNCERTAIN, None)),
    ("calls of an identifier before a requeue do not count",
     Calls("sent", AFTER, None, LATER, (lost(BEFORE), ok(LATER))),
     (LATE, AFTER_FINALIZATION)),
    ("a fenced 200 (not applied) does not say when it was taken",
     Calls("sent", BEFORE, BEFORE, AFTER, (Call(BEFORE, "delivered", 200, False),
                                           ok(AFTER))), (UNCERTAIN, None)),
    ("pending, never claimed", Calls("pending", None, None, None), (LATE, UNSENT)),
    ("retrying after a 429 before", Calls("retrying", BEFORE, None, None, (refused(BEFORE),)),
     (LATE, UNSENT)),
    ("retrying after a lost answer before", Calls("retrying", BEFORE, BEFORE, None,
                                                  (lost(BEFORE),)), (UNCERTAIN, None)),
    ("dead, its outcome unknown since before",
     Calls("dead", BEFORE, BEFORE, None, (lost(BEFORE),)), (UNCERTAIN, None)),
    ("dead, refused by Stripe (a 400)", Calls("dead", BEFORE, None, None,
                                             (Call(BEFORE, "permanent", 400, True),)),
     (LATE, UNSENT)),
    ("in flight, first claimed before", Calls("processing", BEFORE, None, None, ()),
     (UNCERTAIN, None)),
    ("in flight, claimed after", Calls("processing", AFTER, None, None), (LATE, UNSENT)),
    ("rejected by Stripe's report", Calls("rejected", BEFORE, None, BEFORE), (LATE, UNSENT)),
    ("resolved", Calls("resolved", BEFORE, None, None), None),
    ("cancelled", Calls("cancelled", BEFORE, None, BEFORE), None),
]


@pytest.mark.parametrize(("label", "event", "place"), PLACES, ids=[p[0] for p in PLACES])
def test_place_of(label: str, event: Calls, place: tuple[str, str | None] | None) -> None:
    assert place_of(event, F) == place


def test_calls_are_asked_for_only_when_they_decide() -> None:
    needed = [p[0] for p in PLACES if evidence.needs_calls(p[1], F)]
    assert "sent before the finalization" not in needed
    assert "claimed after, sent after" not in needed
    assert "rejected by Stripe's report" not in needed
    assert "lost answer before, 200 after (the same key's replay, or a new take): uncertain" \
        in needed
    with pytest.raises(ValueError, match="calls are needed"):
        place_of(Calls("sent", BEFORE, BEFORE, AFTER), F)


def test_a_send_time_judge_would_call_the_retried_event_late() -> None:
    """The double billing the evidence prevents: recorded after the finalization, taken
    before it."""
    event = Calls("sent", BEFORE, BEFORE, AFTER, (lost(BEFORE), exists(AFTER)))
    assert event.sent_at is not None and event.sent_at > F       # a send-time judge: late
    assert place_of(event, F) == (OURS, None)


def _p(event_id: int, units: int, place: str) -> Placed:
    return Placed(event_id, units, place)


SETTLE = [
    # (label, invoiced, placed, settled, ours, late, uncertain, difference)
    ("everything on the line", 10, [_p(1, 4, OURS), _p(2, 6, OURS)], {}, 10, 0, 0, 0),
    ("late usage beside a right line", 10, [_p(1, 10, OURS), _p(2, 5, LATE)], {}, 10, 5, 0, 0),
    ("the line holds the uncertain event", 15, [_p(1, 10, OURS), _p(2, 5, UNCERTAIN)],
     {2: BILLED}, 15, 0, 0, 0),
    ("the line holds exactly the rest: the uncertain event is late", 10,
     [_p(1, 10, OURS), _p(2, 5, UNCERTAIN)], {2: LATE}, 10, 5, 0, 0),
    ("short: Stripe missed units it took (aggregation)", 7, [_p(1, 10, OURS)], {}, 10, 0, 0, -3),
    ("over: more than anything sent", 12, [_p(1, 10, OURS)], {}, 10, 0, 0, 2),
    ("one set of uncertain events makes up the line", 13,
     [_p(1, 10, OURS), _p(2, 3, UNCERTAIN), _p(3, 5, UNCERTAIN)], {2: BILLED, 3: LATE},
     13, 5, 0, 0),
    ("two sets would: none is settled, the line is short", 14,
     [_p(1, 10, OURS), _p(2, 2, UNCERTAIN), _p(3, 2, UNCERTAIN), _p(4, 4, UNCERTAIN)],
     {}, 10, 0, 8, -4),
    ("of three uncertain events, the one set that makes up the line", 14,
     [_p(1, 10, OURS), _p(2, 2, UNCERTAIN), _p(3, 2, UNCERTAIN), _p(4, 5, UNCERTAIN)],
     {2: BILLED, 3: BILLED, 4: LATE}, 14, 5, 0, 0),
    ("short and uncertain: the uncertain are late, the rest one amount", 8,
     [_p(1, 10, OURS), _p(2, 5, UNCERTAIN)], {2: LATE}, 10, 5, 0, -2),
]


@pytest.mark.parametrize(
    ("label", "invoiced", "placed", "settled", "ours", "late", "uncertain", "difference"),
    SETTLE, ids=[s[0] for s in SETTLE])
def test_settle(label: str, invoiced: int, placed: list[Placed], settled: dict[int, str],
                ours: int, late: int, uncertain: int, difference: int) -> None:
    got = settle(Decimal(invoiced), placed)
    assert got.settled == settled
    assert (got.ours, got.late, got.uncertain, got.difference) == \
        (ours, late, uncertain, Decimal(difference))
    # Every unit the project counts is in one figure, and the line's difference explains
    # Stripe's quantity.
    assert got.ours + got.late + got.uncertain == sum(p.units for p in placed)
    assert Decimal(invoiced) == got.ours + got.uncertain + got.difference


def test_settlement_search_is_bounded() -> None:
    many = [_p(i, 1, UNCERTAIN) for i in range(evidence.SETTLE_SEARCH_LIMIT + 1)]
    got = settle(Decimal(3), many)
    assert got.settled == {} and got.uncertain == len(many)


def test_a_decimal_quantity_is_compared_exactly() -> None:
    got = settle(Decimal("10.5"), [_p(1, 10, OURS)])
    assert got.difference == Decimal("0.5")


TRIAL = (F - timedelta(days=14), F)


@pytest.mark.parametrize(("reason", "amount", "start", "end", "free"), [
    ("subscription_create", 0, F, F + timedelta(days=30), True),
    ("subscription_create", 500, F, F + timedelta(days=30), False),
    ("subscription_cycle", 0, TRIAL[0], TRIAL[1], True),            # a $0 line of the trial
    ("subscription_cycle", 0, F, F + timedelta(days=30), False),    # $0 after the trial
    ("subscription_cycle", 1200, TRIAL[0], TRIAL[1], False),
])
def test_free_lines(reason: str, amount: int, start: datetime, end: datetime,
                    free: bool) -> None:
    assert is_free(billing_reason=reason, amount=amount, period_start=start, period_end=end,
                   trials=[TRIAL]) is free


@pytest.mark.parametrize(("status", "free", "compared", "invoiced", "placed", "verdict"), [
    ("paid", False, True, 10, [_p(1, 10, OURS)], "matches"),
    ("open", False, True, 10, [_p(1, 10, OURS), _p(2, 1, LATE)], "late"),
    ("paid", False, True, 9, [_p(1, 10, OURS)], "short"),
    ("paid", False, True, 11, [_p(1, 10, OURS)], "over"),
    ("void", False, True, 10, [_p(1, 10, OURS)], "void"),
    ("uncollectible", False, True, 9, [_p(1, 10, OURS)], "uncollectible"),
    ("paid", True, True, 0, [], "free"),
    ("paid", False, False, 3, [], "not_compared"),
])
def test_verdicts(status: str, free: bool, compared: bool, invoiced: int,
                  placed: list[Placed], verdict: str) -> None:
    settlement = settle(Decimal(invoiced), placed) if compared else None
    assert verdict_of(invoice_status=status, free=free, compared=compared,
                      settlement=settlement) == verdict
    assert verdict in evidence.VERDICTS
