"""The circuit breaker: a Stripe outage costs a handful of calls, not every event's budget."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from ..outbox.states import Outcome

log = logging.getLogger(__name__)

_FAILURE_WORDS = {
    Outcome.NOT_EXECUTED: "Stripe could not be reached or turned the calls away "
                          "(connection refused, rate limited, unavailable)",
    Outcome.UNKNOWN: "calls to Stripe timed out or got server errors",
}


class CircuitBreaker:
    """Holds claims back when most recent calls found Stripe unreachable or failing.

    Closed: normal. Open: no claims until the cool-down ends. Half-open: one event is claimed
    as a probe; a definite answer closes the breaker, another failure re-opens it with twice
    the cool-down (up to ``max_cooldown``).
    """

    FAILING = (Outcome.NOT_EXECUTED, Outcome.UNKNOWN)

    def __init__(self, *, window: int = 20, threshold: float = 0.6, min_calls: int = 10,
                 cooldown: float = 2.0, max_cooldown: float = 60.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.window, self.threshold, self.min_calls = window, threshold, min_calls
        self.base_cooldown, self.max_cooldown = cooldown, max_cooldown
        self._recent: deque[bool] = deque(maxlen=window)
        self._failures = 0  # True values in _recent, kept as they come and go
        self._cooldown = cooldown
        self._open_until: float | None = None
        #: When the breaker first opened since it was last closed (monotonic).
        self._opened_at: float | None = None
        #: What the last failing call got, in words (no data from Stripe).
        self.last_failure: str | None = None
        self._monotonic = monotonic
        self._lock = threading.Lock()

    @property
    def state(self) -> str:
        with self._lock:
            if self._open_until is None:
                return "closed"
            return "open" if self._monotonic() < self._open_until else "half_open"

    def allow_batch(self) -> int | None:
        """How many events may be claimed now: None = no limit, 0 = none, 1 = a probe."""
        if self._open_until is None:  # closed: the common case, read without the lock
            return None
        state = self.state
        return None if state == "closed" else (0 if state == "open" else 1)

    def record(self, outcome: Outcome) -> None:
        """Count one call's outcome. While open, any definite answer (Stripe is reachable)
        closes the breaker; a failure after the cool-down (the probe's) re-opens it for twice
        as long."""
        failing = outcome in self.FAILING
        if failing:
            self.last_failure = _FAILURE_WORDS[outcome]
        with self._lock:
            if self._open_until is not None:
                now = self._monotonic()
                if not failing:
                    self._open_until, self._cooldown = None, self.base_cooldown
                    self._opened_at = None
                    self._recent.clear()
                    self._failures = 0
                elif now >= self._open_until:
                    self._cooldown = min(self.max_cooldown, self._cooldown * 2)
                    self._open_until = now + self._cooldown
                return
            recent = self._recent
            if len(recent) == self.window:
                self._failures -= recent[0]  # about to drop out of the window
            recent.append(failing)
            if not failing:
                return
            self._failures += 1
            if (len(recent) >= self.min_calls
                    and self._failures / len(recent) >= self.threshold):
                self._opened_at = self._monotonic()
                self._open_until = self._opened_at + self._cooldown
                log.warning("circuit breaker open: %d of the last %d calls failed; holding "
                            "claims for %.1fs", self._failures, len(recent), self._cooldown)

    def snapshot(self) -> tuple[str, float | None, float | None]:
        """(state, seconds since it opened, seconds until the next probe may go): the
        last two None while closed; the wait is 0 once a probe may go."""
        with self._lock:
            if self._open_until is None or self._opened_at is None:
                return "closed", None, None
            now = self._monotonic()
            state = "open" if now < self._open_until else "half_open"
            return state, now - self._opened_at, max(0.0, self._open_until - now)
