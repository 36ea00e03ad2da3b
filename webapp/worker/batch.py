"""Sending one claimed batch, whichever API carries it: the lanes held while the batch is
out (in this process and, through the lane locks, in every other), what each lane did, and the
rules both ways of sending share — when a call may still start under the claim, the payload
keys of the event's meter, the event never resent past Stripe's dedupe window, and an error
raised by the gateway counted as "outcome unknown". The strategies themselves are
:mod:`webapp.worker.sending` (v1, one call per event) and :mod:`webapp.worker.streaming`
(v2 streams)."""

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
from ..stripe_gateway import StripeGateway
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

    gateway: StripeGateway | None  # None: the drainer sends nothing (no STRIPE_API_KEY)
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
    #: How the held lanes' events go out: one v1 call at a time per lane
    #: (:func:`webapp.worker.sending.send_calls`), or stream requests of up to 100
    #: (:func:`webapp.worker.streaming.send_streams`, ``STRIPE_METER_EVENT_API=v2_stream``).
    strategy: Strategy
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
            out.results = self.strategy(self, claim, lanes, abort, meters or {})
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


#: A way of sending the held lanes' events: one result per lane or job.
Strategy = Callable[[Sender, Claim, list[list[ClaimedEvent]], threading.Event,
                     dict[str, MeterInfo]], list[LaneResult]]


def latest_start(claim: Claim, sender: Sender) -> datetime:
    """The last moment a call may start under ``claim``: later, it could expire while the
    call runs."""
    return claim.deadline - timedelta(seconds=sender.safety_margin_seconds)


def payload_keys(meters: dict[str, MeterInfo], meter: str) -> tuple[str, str]:
    """The customer and value keys of the event's meter payload (Stripe's defaults for a
    meter not listed)."""
    info = meters.get(meter)
    return ((info.customer_key, info.value_key) if info is not None
            else (DEFAULT_CUSTOMER_KEY, DEFAULT_VALUE_KEY))


def past_window(ev: ClaimedEvent, now: datetime, policy: Policy, out: LaneResult) -> bool:
    """Whether ``ev``'s outcome has been unknown past Stripe's dedupe window; then it goes
    dead in ``out`` and is never resent (a resend could bill twice)."""
    if ev.first_unknown_at is None or not past_dedupe_window(ev.view(), now, policy):
        return False
    out.dead.append((ev.id, DEAD_PAST_WINDOW))
    log.error("event %d: %s; not resent", ev.id, DEAD_PAST_WINDOW)
    return True


def unknown_from(exc: BaseException) -> CallResult:
    """An unexpected error from the gateway: the call may have left, so its outcome is
    unknown."""
    return CallResult(Outcome.UNKNOWN, error_class=type(exc).__name__, message=str(exc)[:1000])
