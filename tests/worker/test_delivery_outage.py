"""Issue 3, outages and the rate limit, on SQLite and PostgreSQL.

A Stripe outage of 60 s runs in simulated time: the drainer's clock and the circuit breaker's
monotonic clock run ten times faster than real time, so six real seconds are sixty simulated
ones, with the breaker's production defaults (2 s cool-down doubling to 60 s). The drainer runs
in a thread of this process (``run_drainer``), driving the real SDK against the fake.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from conftest import make_settings, wait_for
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session
from support.fake_stripe import FakeStripe

from webapp.models import DeliveryAttempt, OutboxEvent, utcnow
from webapp.outbox import enqueue_usage, operations
from webapp.worker import Drainer, gateway_from, run_drainer
from webapp.worker.breaker import CircuitBreaker

T = OutboxEvent.__table__
A = DeliveryAttempt.__table__
SPEED = 10.0
N_CUSTOMERS = 10


class SimTime:
    """Simulated time running ``speed`` times faster than the real clock."""

    def __init__(self, speed: float) -> None:
        self.speed = speed
        self._t0 = time.monotonic()
        self._w0 = utcnow()

    def monotonic(self) -> float:
        return (time.monotonic() - self._t0) * self.speed

    def now(self) -> datetime:
        return self._w0 + timedelta(seconds=self.monotonic())

    def sleep(self, simulated_seconds: float) -> None:
        """The outage itself lasts this long; nothing else in these tests sleeps."""
        time.sleep(simulated_seconds / self.speed)


class Running:
    """A drainer looping in a thread until stopped."""

    def __init__(self, drainer: Drainer) -> None:
        self.drainer = drainer
        self.thread = threading.Thread(target=run_drainer, args=(drainer,), name="drainer",
                                       daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.drainer.request_stop()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()


@pytest.fixture
def running() -> Iterator[list[Running]]:
    made: list[Running] = []
    yield made
    for r in made:
        if r.thread.is_alive():
            r.stop()


def setup_customers(engine: Engine) -> None:
    for i in range(N_CUSTOMERS):
        operations.set_tenant(engine, f"t{i}", stripe_customer_id=f"cus_{i}",
                              name=None, now=utcnow())


def enqueue_many(engine: Engine, prefix: str, n: int) -> dict[str, int]:
    out: dict[str, int] = {}
    with Session(engine) as db, db.begin():
        for i in range(n):
            key = f"{prefix}-{i}"
            enqueue_usage(db, tenant_id=f"t{i % N_CUSTOMERS}", quantity=i + 1,
                          idempotency_key=key)
            out[key] = i + 1
    return out


def status_counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return dict(conn.execute(select(T.c.status, func.count()).group_by(T.c.status)).all())


def attempts_since(engine: Engine, since: datetime) -> list[tuple[int, str, bool]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(  # type: ignore[misc]
            select(A.c.event_id, A.c.outcome, A.c.counted).where(A.c.attempted_at >= since))]


def sim_drainer(engine: Engine, fake: FakeStripe, sim: SimTime) -> Drainer:
    settings = make_settings(engine.url.render_as_string(hide_password=False),
                             stripe_api_base=fake.base_url)
    breaker = CircuitBreaker(monotonic=sim.monotonic)  # production defaults: 2 s … 60 s
    drainer = Drainer(engine, settings, gateway_from(settings), clock=sim.now, breaker=breaker)
    assert drainer.meters is not None
    drainer.meters.active()  # a worker reads Stripe's meters as it starts
    return drainer


def assert_all_sent_once(engine: Engine, fake: FakeStripe, values: dict[str, int]) -> None:
    wait_for(lambda: status_counts(engine) == {"sent": len(values)}, 60,
             message="every event sent")
    accepted = fake.accepted()
    assert {k: int(v.value) for k, v in accepted.items()} == values
    assert fake.accept_count() == len(values)


@pytest.mark.slow  # seconds of wall time: out of `make check`
def test_a_60s_outage_costs_a_handful_of_calls_and_loses_nothing(
        engine: Engine, fake_stripe: FakeStripe, running: list[Running]) -> None:
    setup_customers(engine)
    sim = SimTime(SPEED)
    drainer = sim_drainer(engine, fake_stripe, sim)
    values = enqueue_many(engine, "before", 30)
    running.append(Running(drainer))
    wait_for(lambda: fake_stripe.accept_count() == 30, 30, message="warm-up sent")

    fake_stripe.set_outage(True)  # connections refused
    outage_start = sim.now()
    values |= enqueue_many(engine, "during", 100)
    sim.sleep(60)
    outage_end = sim.now()
    during = attempts_since(engine, outage_start)
    fake_stripe.set_outage(False)

    per_event = Counter(event_id for event_id, _, _ in during)
    # Without the breaker each of the 100 events would be tried about once per simulated second
    # (backoff capped at 1 s): thousands of calls. With it: one burst, then probes.
    assert during, "the drainer should have tried during the outage"
    assert max(per_event.values()) <= 3, per_event
    assert len(during) <= 30, len(during)
    assert {(outcome, counted) for _, outcome, counted in during} == {("not_executed", False)}
    assert status_counts(engine).get("dead", 0) == 0
    assert drainer.breaker.state in ("open", "half_open")
    assert outage_end - outage_start >= timedelta(seconds=59)

    assert_all_sent_once(engine, fake_stripe, values)
    with engine.connect() as conn:
        worst = conn.execute(select(func.max(T.c.attempt_count))).scalar_one()
    assert worst == 1  # not-executed calls never spent the budget
    assert status_counts(engine).get("dead", 0) == 0


@pytest.mark.slow  # seconds of wall time: out of `make check`
def test_a_60s_storm_of_500s_keeps_attempts_far_below_the_budget(
        engine: Engine, fake_stripe: FakeStripe, running: list[Running]) -> None:
    setup_customers(engine)
    sim = SimTime(SPEED)
    drainer = sim_drainer(engine, fake_stripe, sim)
    assert drainer.settings.max_attempts == 12
    fake_stripe.set_faults(error_5xx_rate=1.0, apply_before_5xx_rate=0.5)
    storm_start = sim.now()
    values = enqueue_many(engine, "storm", 100)
    running.append(Running(drainer))
    sim.sleep(60)
    during = attempts_since(engine, storm_start)
    fake_stripe.set_faults()  # Stripe recovers

    assert {(outcome, counted) for _, outcome, counted in during} == {("unknown", True)}
    per_event = Counter(event_id for event_id, _, _ in during)
    assert max(per_event.values()) <= 3, per_event
    assert len(during) <= 30, len(during)
    with engine.connect() as conn:
        worst = conn.execute(select(func.max(T.c.attempt_count))).scalar_one()
    assert worst <= 3
    assert status_counts(engine).get("dead", 0) == 0

    assert_all_sent_once(engine, fake_stripe, values)
    assert status_counts(engine).get("dead", 0) == 0
    with engine.connect() as conn:
        worst = conn.execute(select(func.max(T.c.attempt_count))).scalar_one()
    assert worst <= 4  # far below OUTBOX_MAX_ATTEMPTS (12)


@pytest.mark.slow  # seconds of wall time: out of `make check`
def test_rate_limit_caps_calls_in_every_second(
        engine: Engine, fake_stripe: FakeStripe, db_url: str) -> None:
    setup_customers(engine)
    settings = make_settings(db_url, stripe_api_base=fake_stripe.base_url,
                             stripe_max_requests_per_second=20, concurrency=8)
    drainer = Drainer(engine, settings, gateway_from(settings))
    try:
        values = enqueue_many(engine, "rate", 60)
        wait_for(lambda: drainer.drain_once() is not None
                 and status_counts(engine) == {"sent": 60}, 30, interval=0.01,
                 message="all sent")
    finally:
        drainer.close()
    starts = sorted(e["started"] for e in fake_stripe.request_log())
    assert len(starts) == len(values) == 60
    assert starts[-1] - starts[0] >= 2.5  # 60 calls at 20/s: 59 gaps of 50 ms
    busiest = max(sum(1 for s in starts[i:] if s < t + 1.0) for i, t in enumerate(starts))
    assert busiest <= 21, busiest
    assert fake_stripe.max_in_flight() >= 1
