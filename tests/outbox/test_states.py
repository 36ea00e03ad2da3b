"""Table tests of the pure event state machine (``webapp.outbox.states``).

No database, no clock: fixed datetimes and a seeded ``random.Random`` make every expected
value exact.
"""

from __future__ import annotations

import hashlib
import random
from datetime import UTC, datetime, timedelta

import pytest

from webapp.outbox.guards import (
    CANCEL_MARGIN,
    CANCEL_WINDOW,
    REQUEUE_AGE_LIMIT,
    CancelCheck,
    RequeueCheck,
    cancel_check,
    requeue_check,
    requeue_permitted,
)
from webapp.outbox.states import (
    ALL_STATUSES,
    COUNTED,
    DEAD_EXHAUSTED,
    DEAD_PAST_WINDOW,
    EDGES,
    MAX_AGE,
    RELEASING,
    CallResult,
    EventView,
    Move,
    Outcome,
    Policy,
    Status,
    allowed,
    idempotency_key,
    identifier_of,
    past_dedupe_window,
    released_status,
    requeue_identifier,
    targets,
    transition,
)

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
ATTEMPTED = NOW - timedelta(seconds=3)
EARLIER = NOW - timedelta(hours=2)
WINDOW = 23 * 3600.0
POLICY = Policy(max_attempts=5, initial_backoff_seconds=2.0, max_backoff_seconds=60.0,
                dedupe_window_seconds=WINDOW)
SEED = 1234


def view(attempts: int = 0, calls: int | None = None, generation: int = 0,
         first_unknown: datetime | None = None, status: str = "processing") -> EventView:
    return EventView(status, attempts, attempts if calls is None else calls, generation,
                     first_unknown)


def jittered(base: float, seed: int = SEED) -> float:
    """What Policy.backoff returns for ``base`` with ``random.Random(seed)``."""
    return base * (1.0 + random.Random(seed).uniform(0.0, 0.25))


def run(ev: EventView, result: CallResult, policy: Policy = POLICY, seed: int = SEED):
    return transition(ev, result, attempted_at=ATTEMPTED, now=NOW, policy=policy,
                      rng=random.Random(seed))


def delay_of(tr) -> float:
    assert tr.next_attempt_at is not None
    return (tr.next_attempt_at - NOW).total_seconds()


# -- every edge out of ``processing`` -----------------------------------------------------------

R_OK = CallResult(Outcome.DELIVERED, http_status=200)
R_DUP = CallResult(Outcome.DELIVERED, http_status=400,
                   message="An event already exists with identifier k.")
R_PERM = CallResult(Outcome.PERMANENT, http_status=400, error_class="InvalidRequestError",
                    message="No active meter was found for event_name 'x'.")
R_PERM_NOMSG = CallResult(Outcome.PERMANENT, http_status=400)
R_TIMEOUT = CallResult(Outcome.UNKNOWN, error_class="APIConnectionError", message="timed out")
R_500 = CallResult(Outcome.UNKNOWN, http_status=500, error_class="APIError",
                   message="An unknown error occurred", fresh_key=True)
R_429 = CallResult(Outcome.NOT_EXECUTED, http_status=429, error_class="RateLimitError")
R_429_AFTER = CallResult(Outcome.NOT_EXECUTED, http_status=429, retry_after=7.0)
R_REFUSED = CallResult(Outcome.NOT_EXECUTED, error_class="APIConnectionError")

# (id, event view, result, expected fields; "delay" is the exact next-attempt delay and
# "base" the un-jittered backoff it must lie within [base, 1.25·base] of)
CASES = [
    ("delivered-first-try", view(0), R_OK,
     dict(status="sent", attempt_count=1, call_count=1, key_generation=0, sent=True,
          next_attempt_at=None, first_unknown_at=None, dead_reason=None, counted=True)),
    ("delivered-duplicate-identifier", view(2, 3, 1, EARLIER), R_DUP,
     dict(status="sent", attempt_count=3, call_count=4, key_generation=1, sent=True,
          next_attempt_at=None, first_unknown_at=EARLIER, dead_reason=None)),
    ("delivered-on-last-attempt-is-sent-not-dead", view(4), R_OK,
     dict(status="sent", attempt_count=5, sent=True, dead_reason=None)),
    ("delivered-past-window-is-still-sent", view(1, first_unknown=NOW - timedelta(days=2)),
     R_OK, dict(status="sent", attempt_count=2, sent=True, dead_reason=None)),
    ("permanent-dead-with-message", view(0), R_PERM,
     dict(status="dead", attempt_count=1, call_count=1, key_generation=0, sent=False,
          next_attempt_at=None, dead_reason=R_PERM.message)),
    ("permanent-without-message", view(1), R_PERM_NOMSG,
     dict(status="dead", attempt_count=2, dead_reason="permanent error")),
    ("permanent-at-max-attempts-keeps-the-message", view(4), R_PERM,
     dict(status="dead", attempt_count=5, dead_reason=R_PERM.message)),
    ("unknown-timeout-first", view(0), R_TIMEOUT,
     dict(status="retrying", attempt_count=1, call_count=1, key_generation=0,
          first_unknown_at=ATTEMPTED, sent=False, dead_reason=None, counted=True,
          delay=jittered(2.0), base=2.0)),
    ("unknown-5xx-fresh-key", view(0), R_500,
     dict(status="retrying", attempt_count=1, key_generation=1, first_unknown_at=ATTEMPTED,
          delay=jittered(2.0), base=2.0)),
    ("unknown-5xx-bumps-existing-generation", view(2, 2, 2, EARLIER), R_500,
     dict(status="retrying", attempt_count=3, key_generation=3, first_unknown_at=EARLIER,
          delay=jittered(8.0), base=8.0)),
    ("unknown-timeout-keeps-key", view(3, 3, 1, EARLIER), R_TIMEOUT,
     dict(status="retrying", attempt_count=4, key_generation=1, first_unknown_at=EARLIER,
          delay=jittered(16.0), base=16.0)),
    ("unknown-backoff-capped-at-max",
     view(9), R_TIMEOUT,
     dict(status="retrying", attempt_count=10, delay=jittered(60.0), base=60.0,
          policy=Policy(20, 2.0, 60.0, WINDOW))),
    ("unknown-at-max-attempts-exhausted", view(4, 4, 0, EARLIER), R_TIMEOUT,
     dict(status="dead", attempt_count=5, call_count=5, next_attempt_at=None,
          dead_reason=f"{DEAD_EXHAUSTED} (last: timed out)", counted=True)),
    ("unknown-5xx-at-max-attempts-exhausted", view(4), R_500,
     dict(status="dead", attempt_count=5, key_generation=1,
          dead_reason=f"{DEAD_EXHAUSTED} (last: An unknown error occurred)")),
    ("unknown-past-window-dead",
     view(1, first_unknown=NOW - timedelta(seconds=WINDOW - 1)), R_TIMEOUT,
     dict(status="dead", attempt_count=2, next_attempt_at=None, dead_reason=DEAD_PAST_WINDOW)),
    ("not-executed-not-counted", view(2, 2), R_429,
     dict(status="retrying", attempt_count=2, call_count=3, key_generation=0, counted=False,
          first_unknown_at=None, delay=jittered(2.0), base=2.0)),
    # 6 calls, 2 counted: this is the 4th uncounted call, so 2·2^3
    ("not-executed-backoff-by-uncounted-calls", view(2, 5), R_REFUSED,
     dict(status="retrying", attempt_count=2, call_count=6, counted=False,
          delay=jittered(16.0), base=16.0)),
    ("not-executed-retry-after-honoured", view(1, 1), R_429_AFTER,
     dict(status="retrying", attempt_count=1, call_count=2, counted=False, delay=7.0)),
    ("not-executed-retry-after-capped-at-max-backoff", view(0),
     CallResult(Outcome.NOT_EXECUTED, http_status=429, retry_after=3600.0),
     dict(status="retrying", delay=60.0)),
    ("not-executed-retry-after-cap-at-least-1s", view(0),
     CallResult(Outcome.NOT_EXECUTED, http_status=429, retry_after=30.0),
     dict(status="retrying", delay=1.0, policy=Policy(5, 0.1, 0.5, WINDOW))),
    ("not-executed-keeps-generation-and-first-unknown", view(1, 1, 2, EARLIER), R_REFUSED,
     dict(status="retrying", key_generation=2, first_unknown_at=EARLIER)),
    ("not-executed-at-max-attempts-never-exhausts", view(4, 4), R_429,
     dict(status="retrying", attempt_count=4, call_count=5, dead_reason=None)),
    ("not-executed-beyond-max-attempts-never-exhausts", view(5, 40), R_429_AFTER,
     dict(status="retrying", attempt_count=5, call_count=41, delay=7.0)),
    ("not-executed-landing-exactly-on-window-is-dead",
     view(1, first_unknown=NOW - timedelta(seconds=WINDOW - 7)), R_429_AFTER,
     dict(status="dead", attempt_count=1, dead_reason=DEAD_PAST_WINDOW, counted=False,
          next_attempt_at=None)),
    ("not-executed-landing-just-inside-window-retries",
     view(1, first_unknown=NOW - timedelta(seconds=WINDOW - 7.001)), R_429_AFTER,
     dict(status="retrying", attempt_count=1, delay=7.0)),
]


@pytest.mark.parametrize(("ev", "result", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_transition_from_processing(ev: EventView, result: CallResult,
                                    expected: dict) -> None:
    expected = dict(expected)
    policy = expected.pop("policy", POLICY)
    delay = expected.pop("delay", None)
    base = expected.pop("base", None)
    tr = run(ev, result, policy)
    for name, value in expected.items():
        assert getattr(tr, name) == value, name
    if delay is not None:
        assert tr.next_attempt_at is not None
        assert delay_of(tr) == pytest.approx(delay, abs=1e-6)
    if base is not None:
        assert base <= delay_of(tr) <= 1.25 * base
    if tr.status in ("sent", "dead"):
        assert tr.next_attempt_at is None
    else:
        assert tr.next_attempt_at is not None
    assert tr.counted == (result.outcome in COUNTED)


@pytest.mark.parametrize("attempts", range(1, 12))
@pytest.mark.parametrize("outcome_result", [R_TIMEOUT, R_500], ids=["timeout", "5xx"])
def test_unknown_backoff_doubles_within_jitter_bounds(attempts: int,
                                                       outcome_result: CallResult) -> None:
    policy = Policy(max_attempts=100, initial_backoff_seconds=0.5, max_backoff_seconds=300.0,
                    dedupe_window_seconds=WINDOW)
    base = min(300.0, 0.5 * 2 ** (attempts - 1))
    seen = set()
    for seed in range(60):
        tr = run(view(attempts - 1), outcome_result, policy, seed)
        assert tr.status == "retrying"
        assert tr.attempt_count == attempts
        d = delay_of(tr)
        assert base <= d <= 1.25 * base + 1e-9
        assert d == pytest.approx(jittered(base, seed), abs=1e-6)
        seen.add(round(d, 9))
    assert len(seen) > 30  # jitter really varies with the rng


def test_zero_backoff_has_no_jitter() -> None:
    policy = Policy(3, 0.0, 0.0, WINDOW)
    assert policy.backoff(1, random.Random(1)) == 0.0
    tr = run(view(0), R_TIMEOUT, policy)
    assert tr.status == "retrying"
    assert tr.next_attempt_at == NOW


def test_same_seed_same_transition() -> None:
    a = run(view(2), R_500, seed=99)
    b = run(view(2), R_500, seed=99)
    c = run(view(2), R_500, seed=100)
    assert a == b
    assert a.next_attempt_at != c.next_attempt_at


def test_max_attempts_one_means_one_try() -> None:
    policy = Policy(1, 2.0, 60.0, WINDOW)
    assert run(view(0), R_TIMEOUT, policy).status == "dead"
    assert run(view(0), R_429, policy).status == "retrying"
    assert run(view(0), R_OK, policy).status == "sent"


# -- what has no outcome ---------------------------------------------------------------------------

@pytest.mark.parametrize("ev", [view(0), view(3, 5, 1, EARLIER)])
def test_systemic_raises(ev: EventView) -> None:
    result = CallResult(Outcome.SYSTEMIC, http_status=401, error_class="AuthenticationError")
    with pytest.raises(ValueError, match="systemic"):
        run(ev, result)


def test_a_missing_meter_raises_too() -> None:
    """No active meter for the event name: the event is released untouched, and waits."""
    result = CallResult(Outcome.METER_MISSING, http_status=400, error_class="InvalidRequestError")
    with pytest.raises(ValueError, match="meter_missing"):
        run(view(1), result)
    assert Outcome.METER_MISSING not in COUNTED


@pytest.mark.parametrize("status", [s for s in ALL_STATUSES if s != "processing"])
@pytest.mark.parametrize("result", [R_OK, R_PERM, R_TIMEOUT, R_429,
                                    CallResult(Outcome.SYSTEMIC, http_status=403)],
                         ids=["delivered", "permanent", "unknown", "not_executed", "systemic"])
def test_only_processing_has_an_outcome(status: str, result: CallResult) -> None:
    with pytest.raises(ValueError, match="processing"):
        run(view(1, status=status), result)


# -- helpers ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("calls", "expected"), [(0, "pending"), (1, "retrying"),
                                                  (7, "retrying")])
def test_released_status(calls: int, expected: str) -> None:
    assert released_status(view(0, calls)) == expected
    # attempts do not matter, only whether a call was ever made
    assert released_status(view(min(calls, 3), calls, 2, EARLIER)) == expected


DIGEST = hashlib.blake2b(b"usage_log:1", digest_size=6).hexdigest()


@pytest.mark.parametrize(("identifier", "generation", "expected"), [
    ("usage_log:1", 0, "usage_log:1"),
    ("usage_log:1", 1, "usage_log:1:r1:" + DIGEST),
    ("usage_log:1", 12, "usage_log:1:r12:" + DIGEST),
])
def test_idempotency_key(identifier: str, generation: int, expected: str) -> None:
    assert idempotency_key(identifier, generation) == expected


def test_retry_keys_never_equal_another_events_identifier() -> None:
    # "x:1" is a plausible identifier; the retry key of "x" must not be it.
    keys = {idempotency_key(i, g) for i in ("x", "x:1", "x:r1", "x:1:1") for g in range(4)}
    assert len(keys) == 16
    assert idempotency_key("x", 1) not in {"x:1", "x:r1"}
    assert len(idempotency_key("k" * 100, 999_999)) <= 255


# -- every edge of the machine, as data ------------------------------------------------------

#: The whole machine, written out once more by hand: (from, move) -> the statuses it may
#: lead to. Any pair not here must be refused.
EXPECTED_EDGES = {
    ("pending", Move.CLAIM): {"processing"},
    ("retrying", Move.CLAIM): {"processing"},
    ("processing", Move.SEND): {"sent", "retrying", "dead"},
    ("processing", Move.RELEASE): {"pending", "retrying"},
    ("processing", Move.RESCUE): {"pending", "retrying"},
    ("dead", Move.REQUEUE): {"pending"},
    ("dead", Move.RESOLVE): {"resolved"},
    ("sent", Move.REJECT): {"rejected"},
    ("sent", Move.CANCEL): {"cancelled"},
    ("sent", Move.RESEND): {"pending"},
    ("rejected", Move.REQUEUE): {"pending"},
    ("rejected", Move.RESOLVE): {"resolved"},
}


@pytest.mark.parametrize("status", ALL_STATUSES)
@pytest.mark.parametrize("move", list(Move))
def test_every_edge_and_only_those(status: str, move: Move) -> None:
    expected = EXPECTED_EDGES.get((status, move), set())
    assert allowed(status, move) is bool(expected)
    assert targets(status, move) == expected


def test_edges_name_only_known_statuses_and_final_ones_lead_nowhere() -> None:
    assert {e.source for e in EDGES} | {e.target for e in EDGES} <= set(ALL_STATUSES)
    for final in ("resolved", "cancelled"):
        assert not any(e.source == final for e in EDGES)


@pytest.mark.parametrize("outcome", [o for o in Outcome if o not in RELEASING])
@pytest.mark.parametrize("attempts", [0, 4])
def test_every_transition_is_an_edge(outcome: Outcome, attempts: int) -> None:
    """What ``transition`` writes after a call is always a SEND edge out of processing."""
    result = CallResult(outcome, fresh_key=outcome is Outcome.UNKNOWN)
    tr = transition(view(attempts), result, attempted_at=ATTEMPTED, now=NOW, policy=POLICY,
                    rng=random.Random(SEED))
    assert tr.status in targets("processing", Move.SEND)


@pytest.mark.parametrize("calls", [0, 1])
def test_released_status_is_a_release_edge(calls: int) -> None:
    v = EventView("processing", 0, calls, 0, None)
    assert released_status(v) in targets("processing", Move.RELEASE)


# -- the requeue rule --------------------------------------------------------------------------

@pytest.mark.parametrize(("status", "occurred", "reason", "unknown_since", "expected"), [
    ("dead", NOW - timedelta(days=1), "No such customer", None, RequeueCheck.OK),
    ("dead", NOW, DEAD_PAST_WINDOW, None, RequeueCheck.FORCE),
    ("dead", NOW, "x", NOW - timedelta(seconds=WINDOW), RequeueCheck.FORCE),
    ("dead", NOW, "x", NOW - timedelta(seconds=WINDOW - 1), RequeueCheck.OK),
    ("dead", NOW - REQUEUE_AGE_LIMIT + timedelta(seconds=1), "x", None, RequeueCheck.OK),
    ("dead", NOW - REQUEUE_AGE_LIMIT - timedelta(seconds=1), "x", None, RequeueCheck.TOO_OLD),
    # No force makes Stripe take a timestamp past 35 days: too old wins.
    ("dead", NOW - MAX_AGE, DEAD_PAST_WINDOW, EARLIER, RequeueCheck.TOO_OLD),
    *[(s, NOW, "x", None, RequeueCheck.WRONG_STATUS) for s in ALL_STATUSES
      if s not in ("dead", "rejected")],
])
def test_requeue_check(status: str, occurred: datetime, reason: str,
                       unknown_since: datetime | None, expected: RequeueCheck) -> None:
    assert requeue_check(status=status, occurred_at=occurred, dead_reason=reason,
                         first_unknown_at=unknown_since, now=NOW,
                         window_seconds=WINDOW) is expected


@pytest.mark.parametrize(("check", "force", "expected"), [
    (RequeueCheck.OK, False, True), (RequeueCheck.OK, True, True),
    (RequeueCheck.FORCE, False, False), (RequeueCheck.FORCE, True, True),
    (RequeueCheck.TOO_OLD, True, False), (RequeueCheck.WRONG_STATUS, True, False),
])
def test_requeue_permitted(check: RequeueCheck, force: bool, expected: bool) -> None:
    assert requeue_permitted(check, force=force) is expected


def test_statuses_are_the_contracts() -> None:
    assert set(ALL_STATUSES) == {"pending", "processing", "retrying", "sent", "dead",
                                 "resolved", "rejected", "cancelled"}
    assert Status.DEAD == "dead"
    assert {Outcome.DELIVERED, Outcome.UNKNOWN, Outcome.PERMANENT} == COUNTED


@pytest.mark.parametrize(("first_unknown", "expected"), [
    (None, False),
    (NOW - timedelta(seconds=WINDOW - 1), False),
    (NOW - timedelta(seconds=WINDOW), True),
    (NOW - timedelta(days=3), True),
])
def test_past_dedupe_window(first_unknown: datetime | None, expected: bool) -> None:
    assert past_dedupe_window(view(1, first_unknown=first_unknown), NOW, POLICY) is expected


@pytest.mark.parametrize(("key", "generation", "expected"), [
    ("usage:1", 1, "usage:1~r1"),
    ("usage:1", 12, "usage:1~r12"),
    ("k" * 97, 1, "k" * 97 + "~r1"),
])
def test_requeue_identifier(key: str, generation: int, expected: str) -> None:
    assert requeue_identifier(key, generation) == expected


def test_a_long_key_is_shortened_and_stays_unique() -> None:
    a, b = "a" * 99 + "x", "a" * 99 + "y"
    ids = {requeue_identifier(k, g) for k in (a, b) for g in (1, 2, 99)}
    assert len(ids) == 6 and all(len(i) <= 100 for i in ids)
    assert requeue_identifier(a, 1).endswith("~r1")
    with pytest.raises(ValueError):
        requeue_identifier("k", 0)


@pytest.mark.parametrize(("named", "expected"), [
    ("usage:1", "usage:1"),
    ("usage:1~r2", "usage:1~r2"),
    (idempotency_key("usage:1", 3), "usage:1"),
    (idempotency_key("usage:1~r2", 1), "usage:1~r2"),
    ("usage:1:r1:nothex", "usage:1:r1:nothex"),
])
def test_identifier_of_a_sample(named: str, expected: str) -> None:
    assert identifier_of(named) == expected


@pytest.mark.parametrize(("status", "sent_ago", "expected"), [
    ("sent", timedelta(hours=1), CancelCheck.OK),
    ("sent", CANCEL_WINDOW - CANCEL_MARGIN - timedelta(seconds=1), CancelCheck.OK),
    ("sent", CANCEL_WINDOW - CANCEL_MARGIN, CancelCheck.TOO_LATE),
    ("sent", timedelta(days=3), CancelCheck.TOO_LATE),
    ("sent", None, CancelCheck.TOO_LATE),
    *[(s, timedelta(hours=1), CancelCheck.NOT_SENT) for s in ALL_STATUSES if s != "sent"],
])
def test_cancel_check(status: str, sent_ago: timedelta | None, expected: CancelCheck) -> None:
    sent_at = None if sent_ago is None else NOW - sent_ago
    assert cancel_check(status=status, sent_at=sent_at, now=NOW) is expected
