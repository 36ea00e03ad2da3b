"""The per-process ceiling on calls to Stripe (``STRIPE_MAX_REQUESTS_PER_SECOND``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class RateLimiter:
    """A token bucket: at most ``rate`` calls per second in this process, in every second.

    The bucket holds one token, so calls are spaced ``1/rate`` apart: a bucket a second deep
    would let a full bucket's burst and a second's refill land in the same second (twice the
    ceiling, which Stripe's per-second limit answers with 429s).
    """

    def __init__(self, rate: float, *, monotonic: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.rate = rate
        self.capacity = 1.0
        self._monotonic = monotonic
        self._sleep = sleep
        self._tokens = self.capacity
        self._at = monotonic()
        self._lock = threading.Lock()

    def acquire(self, stop: threading.Event | None = None) -> bool:
        """Wait for a token; False if ``stop`` was set while waiting."""
        while True:
            with self._lock:
                now = self._monotonic()
                self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.rate)
                self._at = now
                if self._tokens >= 1.0:
                    self._tokens -= 1.0
                    return True
                wait = (1.0 - self._tokens) / self.rate
            if stop is not None:
                if stop.wait(wait):
                    return False
            else:
                self._sleep(wait)


_shared: dict[float, RateLimiter] = {}
_shared_lock = threading.Lock()


def process_limiter(rate: float) -> RateLimiter:
    """The process's one limiter for ``rate``: sending, reading Stripe's reports and
    reconciling all draw on it, so together they stay within the per-process ceiling."""
    with _shared_lock:
        limiter = _shared.get(rate)
        if limiter is None:
            limiter = _shared[rate] = RateLimiter(rate)
        return limiter
