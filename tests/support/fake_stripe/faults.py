"""Faults on demand: queued ones (:meth:`FaultsMixin.fail_next`), random ones from a seeded
RNG (:meth:`FaultsMixin.set_faults`), each applied to one request."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

#: Every kind :meth:`FakeStripe.fail_next` accepts.
FAULT_KINDS = frozenset(
    {"500", "502", "504", "503", "409", "429", "drop", "drop_before", "slow", "401", "403",
     "400"}
)
OUTCOME_UNKNOWN_STATUSES = frozenset({500, 502, 504})
FRONT_FAULTS = frozenset({"401", "403", "429", "503", "409", "drop_before", "400"})
_FAULT_KWARGS: dict[str, frozenset[str]] = {
    "500": frozenset({"apply"}),
    "502": frozenset({"apply"}),
    "504": frozenset({"apply"}),
    "429": frozenset({"retry_after"}),
    "slow": frozenset({"seconds"}),
}


@dataclass(frozen=True)
class Fault:
    """One fault to apply to one request."""

    kind: str
    apply: bool = False
    retry_after: float | None = None
    seconds: float = 0.0


@dataclass(frozen=True)
class RandomFaults:
    """Configuration of the random faults (see :meth:`FakeStripe.set_faults`)."""

    error_5xx_rate: float
    error_5xx_statuses: tuple[int, ...]
    apply_before_5xx_rate: float
    drop_response_rate: float
    rate_limit_rate: float
    retry_after: float | None
    unavailable_rate: float
    slow_rate: float
    slow_seconds: float


def fault_name(fault: Fault | None) -> str | None:
    return None if fault is None else fault.kind


class FaultsMixin:
    """The fault queue and the random faults of :class:`FakeStripe` (which holds the state:
    ``_lock``, ``_queued``, ``_random``, ``_rng``)."""

    _lock: Any
    _queued: deque[Fault]
    _random: RandomFaults | None
    _rng: random.Random
    _targeted: dict[str, Fault]

    def fail_for(self, identifier: str, kind: str, **kw: Any) -> None:
        """Every request for the event ``identifier`` meets a fault of ``kind`` (before the
        queued and random ones), until :meth:`reset`; ``"400"`` is a validation refusal."""
        self.fail_next(kind, 0, **kw)  # validates kind and arguments
        fault = Fault(kind=kind, apply=bool(kw.get("apply", False)),
                      retry_after=kw.get("retry_after"), seconds=float(kw.get("seconds", 0.0)))
        with self._lock:
            self._targeted[identifier] = fault

    def set_faults(
        self,
        *,
        error_5xx_rate: float = 0.0,
        error_5xx_statuses: Iterable[int] = (500, 502, 504),
        apply_before_5xx_rate: float = 0.5,
        drop_response_rate: float = 0.0,
        rate_limit_rate: float = 0.0,
        retry_after: float | None = None,
        unavailable_rate: float = 0.0,
        slow_rate: float = 0.0,
        slow_seconds: float = 0.0,
    ) -> None:
        """Random faults from the seeded RNG, drawn in request order (queued faults win).

        Per request at most one of: 429 (``rate_limit_rate``, with ``Retry-After`` if
        ``retry_after`` is set), 503 (``unavailable_rate``), a 5xx from ``error_5xx_statuses``
        (``error_5xx_rate``; the event is applied first with probability
        ``apply_before_5xx_rate``), a dropped response after the event was applied
        (``drop_response_rate``); otherwise, with ``slow_rate``, a ``slow_seconds`` sleep.
        Calling it with no arguments turns random faults off.
        """
        statuses = tuple(int(s) for s in error_5xx_statuses)
        rates = {
            "error_5xx_rate": error_5xx_rate,
            "apply_before_5xx_rate": apply_before_5xx_rate,
            "drop_response_rate": drop_response_rate,
            "rate_limit_rate": rate_limit_rate,
            "unavailable_rate": unavailable_rate,
            "slow_rate": slow_rate,
        }
        for name, rate in rates.items():
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{name} must be within [0, 1]")
        if error_5xx_rate + drop_response_rate + rate_limit_rate + unavailable_rate > 1.0:
            raise ValueError("the exclusive fault rates add up to more than 1")
        if not statuses or not set(statuses) <= OUTCOME_UNKNOWN_STATUSES:
            raise ValueError("error_5xx_statuses must be a non-empty subset of (500, 502, 504)")
        if slow_seconds < 0 or (retry_after is not None and retry_after < 0):
            raise ValueError("durations must be >= 0")
        config = RandomFaults(
            error_5xx_rate=error_5xx_rate,
            error_5xx_statuses=statuses,
            apply_before_5xx_rate=apply_before_5xx_rate,
            drop_response_rate=drop_response_rate,
            rate_limit_rate=rate_limit_rate,
            retry_after=retry_after,
            unavailable_rate=unavailable_rate,
            slow_rate=slow_rate,
            slow_seconds=slow_seconds,
        )
        active = any(
            (error_5xx_rate, drop_response_rate, rate_limit_rate, unavailable_rate, slow_rate)
        )
        with self._lock:
            self._random = config if active else None

    def fail_next(self, kind: str, count: int = 1, **kw: Any) -> None:
        """Queue ``count`` faults of ``kind`` for the next meter-event requests, in order.

        Kinds: ``"500"``, ``"502"``, ``"504"`` (outcome unknown; ``apply=True`` applies the event
        first, default ``False``; saved under the idempotency key), ``"503"`` (not executed),
        ``"409"`` (idempotency key in use), ``"429"`` (``retry_after=seconds`` sets
        ``Retry-After``), ``"drop"`` (the event is applied, then the connection is closed with
        no response), ``"drop_before"`` (closed before anything is applied), ``"slow"``
        (``seconds=``, default 1.0: sleep before answering; the event is applied), ``"401"``,
        ``"403"``.

        Every request consumes one queued fault. A 500/502/504 only takes effect on a request
        that reaches execution: on an idempotent replay or a validation 400 it is spent unused
        (``fault_applied`` is ``False`` in the request log).
        """
        kind = str(kind)
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; expected one of {sorted(FAULT_KINDS)}")
        unknown = set(kw) - _FAULT_KWARGS.get(kind, frozenset())
        if unknown:
            raise TypeError(f"fault {kind!r} takes no argument(s) {sorted(unknown)}")
        if count < 0:
            raise ValueError("count must be >= 0")
        retry_after = kw.get("retry_after")
        seconds = float(kw.get("seconds", 1.0 if kind == "slow" else 0.0))
        if seconds < 0 or (retry_after is not None and retry_after < 0):
            raise ValueError("durations must be >= 0")
        fault = Fault(
            kind=kind,
            apply=bool(kw.get("apply", False)),
            retry_after=None if retry_after is None else float(retry_after),
            seconds=seconds,
        )
        with self._lock:
            self._queued.extend([fault] * count)

    def stop_failing_for(self, identifier: str) -> None:
        """Requests for ``identifier`` are answered normally again."""
        with self._lock:
            self._targeted.pop(identifier, None)

    def _next_fault_locked(self, identifier: str | None = None) -> Fault | None:
        """A fault aimed at ``identifier``, else a queued one, else a random one. Call with
        ``self._lock`` held."""
        if identifier is not None and identifier in self._targeted:
            return self._targeted[identifier]
        if self._queued:
            return self._queued.popleft()
        cfg = self._random
        if cfg is None:
            return None
        rng = self._rng
        # Always four draws per request, so the sequence depends only on the request order.
        pick, status_draw, apply_draw, slow_draw = (
            rng.random(),
            rng.random(),
            rng.random(),
            rng.random(),
        )
        edge = cfg.rate_limit_rate
        if pick < edge:
            return Fault("429", retry_after=cfg.retry_after)
        edge += cfg.unavailable_rate
        if pick < edge:
            return Fault("503")
        edge += cfg.error_5xx_rate
        if pick < edge:
            statuses = cfg.error_5xx_statuses
            status = statuses[min(int(status_draw * len(statuses)), len(statuses) - 1)]
            return Fault(str(status), apply=apply_draw < cfg.apply_before_5xx_rate)
        edge += cfg.drop_response_rate
        if pick < edge:
            return Fault("drop")
        if slow_draw < cfg.slow_rate:
            return Fault("slow", seconds=cfg.slow_seconds)
        return None
