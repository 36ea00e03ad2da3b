"""Recording outcomes under a claim (``webapp.outbox.record``) on SQLite and PostgreSQL: each
result's transition, a fresh transport key after a 5xx, events dead without a call, and
fencing: a worker whose claim was taken over cannot overwrite the newer claim's outcome.
"""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from sqlalchemy import Engine, select

from webapp.models import DeliveryAttempt
from webapp.outbox.claims import release, rescue_expired
from webapp.outbox.record import record_outcomes
from webapp.outbox.states import DEAD_PAST_WINDOW, CallResult, idempotency_key

from .helpers import (
    E401,
    E429,
    E500,
    OK,
    PERM,
    POLICY,
    TIMEOUT,
    add,
    at,
    attempt,
    claim,
    map_tenant,
    row,
    rows,
)

# -- recording outcomes ----------------------------------------------------------------------------

def test_record_outcomes_writes_each_result(engine: Engine) -> None:
    map_tenant(engine, "acme", "cus_A")
    ids = add(engine, 6)
    c = claim(engine, at(1))
    rng = random.Random(7)
    results = [OK, PERM, TIMEOUT, E500, E429, E401]
    summary = record_outcomes(engine, c, [attempt(c, i, r, at(2)) for i, r in
                                          enumerate(results)], now=at(3), policy=POLICY,
                              rng=rng)
    assert (summary.sent, summary.dead, summary.retrying, summary.released, summary.fenced) == (
        1, 1, 3, 1, 0)
    got = rows(engine)
    ok, perm, timeout, e500, e429, e401 = (got[i] for i in ids)
    assert (ok.status, ok.attempt_count, ok.call_count, ok.sent_at) == ("sent", 1, 1, at(3))
    assert ok.claim_token is None and ok.processing_deadline_at is None
    assert (perm.status, perm.dead_reason, perm.dead_at, perm.last_http_status,
            perm.last_request_id) == ("dead", PERM.message, at(3), 400, "req_1")
    assert (timeout.status, timeout.attempt_count, timeout.key_generation,
            timeout.first_unknown_at) == ("retrying", 1, 0, at(2))
    assert at(3) + timedelta(seconds=0.05) <= timeout.next_attempt_at <= at(3) + timedelta(
        seconds=0.0625)
    assert (e500.status, e500.key_generation, e500.last_http_status) == ("retrying", 1, 500)
    # Retry-After 2 s, capped at max(OUTBOX_MAX_BACKOFF_SECONDS, 1 s) = 1 s
    assert (e429.status, e429.attempt_count, e429.call_count, e429.next_attempt_at,
            e429.first_unknown_at) == ("retrying", 0, 1, at(4), None)
    # systemic: released untouched, no attempt spent, never called pending→retrying
    assert (e401.status, e401.attempt_count, e401.call_count, e401.claim_token) == (
        "pending", 0, 0, None)
    with engine.connect() as conn:
        attempts = {a.event_id: a for a in conn.execute(select(DeliveryAttempt.__table__))}
    assert set(attempts) == set(ids)
    assert all(a.claim_token == c.token and a.worker == "w1" for a in attempts.values())
    assert all(attempts[i].applied for i in ids[:5])
    assert {i for i, a in attempts.items() if a.counted} == set(ids[:4])
    assert attempts[ids[3]].idempotency_key == "k3"  # the key the call used (generation 0)


def test_next_claim_uses_fresh_key_after_5xx(engine: Engine) -> None:
    map_tenant(engine, "acme", "cus_A")
    add(engine, 1)
    c = claim(engine, at(1))
    record_outcomes(engine, c, [attempt(c, 0, E500, at(1))], now=at(2), policy=POLICY)
    (ev,) = claim(engine, at(10)).events
    assert ev.key_generation == 1
    assert ev.idempotency_key == idempotency_key("k0", 1) != "k0"
    assert ev.identifier == "k0"


def test_dead_without_call(engine: Engine) -> None:
    map_tenant(engine, "acme", "cus_A")
    (i,) = add(engine, 1)
    c = claim(engine, at(1))
    s = record_outcomes(engine, c, [], dead_without_call=[(i, DEAD_PAST_WINDOW)], now=at(2),
                        policy=POLICY)
    assert s.dead == 1
    r = row(engine, i)
    assert (r.status, r.dead_reason, r.attempt_count, r.call_count) == (
        "dead", DEAD_PAST_WINDOW, 0, 0)


# -- fencing ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("a_result", "b_result", "b_status"), [
    (OK, PERM, "dead"),
    (PERM, OK, "sent"),
    (TIMEOUT, OK, "sent"),
    (E429, PERM, "dead"),
], ids=["A-sent-B-dead", "A-dead-B-sent", "A-retrying-B-sent", "A-notexec-B-dead"])
def test_fencing_a_taken_over_claim(engine: Engine, a_result: CallResult,
                                    b_result: CallResult, b_status: str) -> None:
    map_tenant(engine, "acme", "cus_A")
    (i,) = add(engine, 1)
    a = claim(engine, at(0), worker="A", timeout=1.0)
    assert [e.id for e in a.events] == [i]
    assert rescue_expired(engine, now=at(0.5)) == 0      # not expired yet
    assert claim(engine, at(0.5), worker="B").events == []
    assert rescue_expired(engine, now=at(2)) == 1
    r = row(engine, i)
    assert (r.status, r.claim_token, r.last_outcome) == ("pending", None, "claim_expired")
    b = claim(engine, at(2), worker="B", timeout=30)
    assert [e.id for e in b.events] == [i]
    # A comes back from its (long) call and reports: nothing of it is applied
    sa = record_outcomes(engine, a, [attempt(a, 0, a_result, at(0.1))], now=at(3),
                         policy=POLICY)
    assert sa.fenced == 1
    assert (sa.sent, sa.dead, sa.retrying) == (0, 0, 0)
    r = row(engine, i)
    assert (r.status, r.claim_token, r.claimed_by, r.attempt_count, r.call_count) == (
        "processing", b.token, "B", 0, 0)
    # A's release and dead-letter are fenced as well
    assert release(engine, a.token, [i], now=at(3)) == 0
    sd = record_outcomes(engine, a, [], dead_without_call=[(i, "x")], now=at(3), policy=POLICY)
    assert sd.dead == 0
    assert row(engine, i).status == "processing"
    # B's outcome stands
    sb = record_outcomes(engine, b, [attempt(b, 0, b_result, at(3))], now=at(4), policy=POLICY)
    assert sb.fenced == 0
    r = row(engine, i)
    assert r.status == b_status
    assert r.attempt_count == 1 and r.call_count == 1
    with engine.connect() as conn:
        atts = conn.execute(select(DeliveryAttempt.__table__)
                            .order_by(DeliveryAttempt.__table__.c.id)).all()
    assert [(x.worker, x.claim_token, x.applied, x.outcome) for x in atts] == [
        ("A", a.token, False, a_result.outcome.value),
        ("B", b.token, True, b_result.outcome.value)]


def test_late_outcome_after_rescue_is_fenced_even_unclaimed(engine: Engine) -> None:
    map_tenant(engine, "acme", "cus_A")
    (i,) = add(engine, 1)
    a = claim(engine, at(0), worker="A", timeout=1.0)
    assert rescue_expired(engine, now=at(5)) == 1
    s = record_outcomes(engine, a, [attempt(a, 0, OK, at(0.2))], now=at(6), policy=POLICY)
    assert s.fenced == 1 and s.sent == 0
    assert row(engine, i).status == "pending"


