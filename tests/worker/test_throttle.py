"""``STRIPE_MAX_REQUESTS_PER_SECOND`` is per process: sending, reading Stripe's reports and
reconciling draw on one bucket, and the bucket never lets two calls closer than 1/rate."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine

from webapp.worker import Drainer, EventPoller, gateway_from
from webapp.worker.throttle import RateLimiter, process_limiter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_calls_are_spaced_one_over_the_rate_apart() -> None:
    clock = Clock()
    limiter = RateLimiter(4.0, monotonic=clock.monotonic, sleep=clock.sleep)
    times = []
    for _ in range(5):
        assert limiter.acquire()
        times.append(clock.now)
    gaps = [round(b - a, 6) for a, b in zip(times, times[1:], strict=False)]
    assert gaps == [0.25, 0.25, 0.25, 0.25]       # no burst, even after an idle start


def test_one_bucket_per_process_and_rate() -> None:
    assert process_limiter(7.0) is process_limiter(7.0)
    assert process_limiter(7.0) is not process_limiter(8.0)


def test_sending_polling_and_reconciling_share_the_process_bucket(
        engine: Engine, settings: Any) -> None:
    rate = settings.stripe_max_requests_per_second
    drainer = Drainer(engine, settings, gateway_from(settings))
    try:
        poller = EventPoller(engine, object(),  # type: ignore[arg-type]
                             max_requests_per_second=rate)
        assert drainer.sender.limiter is process_limiter(rate)
        assert poller.limiter is process_limiter(rate)
    finally:
        drainer.close()
