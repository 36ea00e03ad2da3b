"""Sending one claimed batch: one call at a time per lane, lanes in parallel, no transaction
open. What each lane did comes back for the drainer to record."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ..outbox.claims import Claim, ClaimedEvent
from ..outbox.meters import DEFAULT_CUSTOMER_KEY, DEFAULT_VALUE_KEY, MeterInfo
from ..outbox.record import AttemptRecord
from ..outbox.states import DEAD_PAST_WINDOW, CallResult, Outcome, Policy, past_dedupe_window
from ..stripe_gateway import Gateway, MeterEvent
from .breaker import CircuitBreaker
from .lanes import Lane, LaneLocks
from .throttle import RateLimiter

log = logging.getLogger(__name__)

#: With shards, a lane found busy in another process is left out of this process's claims
#: this long, so that a worker whose own shards ran dry does not claim and release the same
#: events of another's lane pass after pass. (Without shards, that would leave every lane to
#: whichever worker took it first.)
BUSY_ELSEWHERE_SECONDS = 1.0


@dataclass
class LaneResult:
    """What sending one lane's events did."""

    attempts: list[AttemptRecord] = field(default_factory=list)
    release: list[int] = field(default_factory=list)        # back now, untouched
    release_later: list[int] = field(default_factory=list)  # back after a poll interval
    dead: list[tuple[int, str]] = field(default_factory=list)  # never to be sent


@dataclass
class Sent:
    """What sending a batch did: each lane's result, the events whose lane another process
    held, and whether a systemic answer stopped the batch."""

    results: list[LaneResult] = field(default_factory=list)
    busy_ids: list[int] = field(default_factory=list)
    aborted: bool = False

    def released_any(self) -> bool:
        return bool(self.busy_ids) or any(r.release or r.release_later for r in self.results)


@dataclass
class Sender:
    """Sends claimed batches through ``gateway``; one per drainer."""

    gateway: Gateway | None  # None: the drainer sends nothing (no STRIPE_API_KEY)
    lanes: LaneLocks
    limiter: RateLimiter
    breaker: CircuitBreaker
    policy: Policy
    concurrency: int
    safety_margin_seconds: float
    clock: Callable[[], datetime]
    monotonic: Callable[[], float]
    stopping: threading.Event
    #: Called with a systemic answer (401/403/…): the drainer pauses sending for everyone.
    on_systemic: Callable[[CallResult], None]
    #: Called with an event name Stripe has no active meter for: its events wait.
    on_meter_missing: Callable[[str], None]
    #: ``STRIPE_METER_EVENT_API=v2_stream``: events go in stream requests of up to 100
    #: (:mod:`webapp.worker.streaming`); otherwise one v1 call per event.
    stream: bool = False
    _pool: ThreadPoolExecutor | None = None
    _busy_elsewhere: dict[Lane, float] = field(default_factory=dict)  # lane -> until
    _busy_lock: threading.Lock = field(default_factory=threading.Lock)

    def busy_elsewhere(self) -> set[Lane]:
        """Lanes another process held when this one last tried them, until they are due to be
        tried again (``BUSY_ELSEWHERE_SECONDS``)."""
        with self._busy_lock:
            if not self._busy_elsewhere:
                return set()
            now = self.monotonic()
            for lane in [lane for lane, until in self._busy_elsewhere.items() if until <= now]:
                del self._busy_elsewhere[lane]
            return set(self._busy_elsewhere)

    def send(self, claim: Claim, meters: dict[str, MeterInfo] | None = None) -> Sent:
        """Send the claim's events, one call at a time per lane, holding the lanes (in this
        process and, through the lane locks, in every other) until all returned. ``meters``:
        each meter's payload keys (None: Stripe's default keys)."""
        by_lane: dict[Lane, list[ClaimedEvent]] = {}
        for ev in claim.events:
            by_lane.setdefault(ev.lane, []).append(ev)
        held = self.lanes.acquire(by_lane)
        out = Sent(busy_ids=[ev.id for lane, evs in by_lane.items() if lane not in held
                             for ev in evs])
        if out.busy_ids and self.lanes.sharded:
            until = self.monotonic() + BUSY_ELSEWHERE_SECONDS
            with self._busy_lock:
                for lane in by_lane:
                    if lane not in held:
                        self._busy_elsewhere[lane] = until
        abort = threading.Event()
        try:
            lanes = [evs for lane, evs in by_lane.items() if lane in held]
            if self.stream:
                from .streaming import send_streams

                out.results = send_streams(self, claim, lanes, abort, meters or {})
            else:
                out.results = self._run_lanes(claim, lanes, abort, meters or {})
        finally:
            out.aborted = abort.is_set()
            self.lanes.release(held)
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def pool(self) -> ThreadPoolExecutor:
        """The send threads (``concurrency`` of them), started on first use."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.concurrency,
                                            thread_name_prefix="outbox-send")
        return self._pool

    def _run_lanes(self, claim: Claim, lanes: list[list[ClaimedEvent]],
                   abort: threading.Event, meters: dict[str, MeterInfo]) -> list[LaneResult]:
        if len(lanes) <= 1 or self.concurrency == 1:
            return [self._send_lane(claim, evs, abort, meters) for evs in lanes]
        futures = [self.pool().submit(self._send_lane, claim, evs, abort, meters)
                   for evs in lanes]
        return [f.result() for f in futures]

    def _send_lane(self, claim: Claim, events: list[ClaimedEvent], abort: threading.Event,
                   meters: dict[str, MeterInfo]) -> LaneResult:
        """Send one lane's events in order, one call at a time."""
        out = LaneResult()
        meter = meters.get(events[0].meter) if events else None
        keys = ((meter.customer_key, meter.value_key) if meter is not None
                else (DEFAULT_CUSTOMER_KEY, DEFAULT_VALUE_KEY))
        # The last moment a call may start: later, the claim could expire while it runs.
        latest = claim.deadline - timedelta(seconds=self.safety_margin_seconds)
        # Bound once: this loop runs for every event the drainer sends.
        clock, monotonic, call, gateway = self.clock, self.monotonic, _call, self.gateway
        assert gateway is not None
        stopping, aborted = self.stopping.is_set, abort.is_set
        breaker, limiter, record = self.breaker, self.limiter, out.attempts.append

        def rest(i: int) -> list[int]:
            return [e.id for e in events[i:]]

        for i, ev in enumerate(events):
            now = clock()
            if stopping() or aborted() or now > latest:
                out.release.extend(rest(i))
                break
            if breaker.allow_batch() == 0:
                out.release_later.extend(rest(i))
                break
            if ev.first_unknown_at is not None and past_dedupe_window(ev.view(), now,
                                                                      self.policy):
                out.dead.append((ev.id, DEAD_PAST_WINDOW))
                log.error("event %d: %s; not resent", ev.id, DEAD_PAST_WINDOW)
                continue
            if not limiter.acquire(self.stopping):
                out.release.extend(rest(i))
                break
            t0 = monotonic()
            result = call(gateway, ev, keys)
            record(AttemptRecord(ev, result, now, int((monotonic() - t0) * 1000)))
            breaker.record(result.outcome)
            if result.outcome is Outcome.DELIVERED:
                continue
            log.warning("event %d: %s (HTTP %s, %s %s, request %s)", ev.id,
                        result.outcome.value, result.http_status, result.error_class,
                        result.error_code or "", result.request_id)
            if result.outcome is Outcome.SYSTEMIC:
                abort.set()
                self.on_systemic(result)
                out.release.extend(rest(i + 1))
                break
            if result.outcome is Outcome.METER_MISSING:
                # The lane is one meter's: the rest of it waits for the meter too.
                self.on_meter_missing(ev.meter)
                out.release.extend(rest(i + 1))
                break
            if result.outcome in (Outcome.NOT_EXECUTED, Outcome.UNKNOWN):
                # The rest of this lane would meet the same trouble: leave it for later.
                out.release_later.extend(rest(i + 1))
                break
        return out


def _call(gateway: Gateway, ev: ClaimedEvent, keys: tuple[str, str]) -> CallResult:
    """One call; an unexpected error counts as "outcome unknown" (it may have left)."""
    try:
        return gateway.send(MeterEvent(ev.meter, ev.stripe_customer_id, ev.quantity,
                                       ev.identifier, ev.occurred_at, *keys),
                            ev.idempotency_key)
    except Exception as exc:
        log.exception("event %d: the gateway raised", ev.id)
        return CallResult(Outcome.UNKNOWN, error_class=type(exc).__name__,
                          message=str(exc)[:1000])
