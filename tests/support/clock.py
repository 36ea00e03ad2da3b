"""A clock a test sets by hand, for the fake's timestamp checks (``FakeStripe(clock=…)``)."""

from __future__ import annotations


class SettableClock:
    """Epoch seconds that move only when the test sets ``now``."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
