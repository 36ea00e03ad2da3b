"""The drain pass: claim due events, send them through the gateway, record what happened.

``Drainer.drain_once`` is one pass (the CLI's ``drain --once``, the in-app scheduler job and
the tests call it directly); ``webapp.worker.run_drainer`` loops until asked to stop
(:mod:`webapp.worker.pipeline`). No transaction is open while Stripe is called.

Guarantees kept here, on top of the claim's:
- one call in flight per (Stripe customer, meter) across every process (the lane locks);
- a call starts only while the claim has longer left than the longest call can take, so an
  expired claim can never overlap a live call for the same event;
- a Stripe outage costs a handful of calls (the circuit breaker), not every event's budget;
- a systemic failure (401/403/404) pauses sending for every worker and changes no event.

Several workers on PostgreSQL split the lanes by shards (:mod:`webapp.worker.shards`) and
each claims from its own first, so that they do not claim events of each other's lanes only
to release them; a preference of the claim, not a guarantee (the lane locks are that).
Expired claims are rescued by :class:`webapp.worker.rescuer.Rescuer`, not by a pass.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime

from sqlalchemy import Engine

from ..config import Settings
from ..db import reading
from ..models import utcnow
from ..outbox import claims, control, record
from ..outbox.meters import MeterInfo
from ..outbox.producers import record_default_meter
from ..outbox.states import CallResult
from ..stripe_gateway import StripeGateway
from .batch import Sender, Sent
from .breaker import CircuitBreaker
from .heartbeat import Heartbeat
from .lanes import lane_locks
from .meters import MeterCatalog, MeterRefresher
from .process import policy_from, worker_name
from .sending import send_calls
from .shards import ShardView
from .streaming import send_streams
from .throttle import RateLimiter, process_limiter

log = logging.getLogger(__name__)

#: After a failed record of the default meter, how long until the next try.
METER_RECORD_RETRY_SECONDS = 30


@dataclass
class DrainSummary:
    """What one pass did; printed as JSON by ``drain --once``."""

    claimed: int = 0
    sent: int = 0
    retrying: int = 0
    dead: int = 0
    released: int = 0
    fenced: int = 0
    rescued: int = 0
    calls: int = 0
    paused: bool = False
    pause_reason: str | None = None
    skipped: str | None = None
    breaker: str = "closed"
    duration_ms: int = 0

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def add(self, other: DrainSummary) -> None:
        """Add ``other``'s counts to this one's."""
        for name in ("claimed", "sent", "retrying", "dead", "released", "fenced", "rescued",
                     "calls"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class Pass:
    """One pass between its phases: claimed (``begin``), sent (``send``), recorded
    (``finish``)."""

    summary: DrainSummary
    started: float
    claim: claims.Claim | None = None
    probing: bool = False
    sent: Sent = field(default_factory=Sent)
    meters: dict[str, MeterInfo] | None = None

    @property
    def events(self) -> int:
        return len(self.claim.events) if self.claim is not None else 0


class Drainer:
    """Wires the outbox core to a gateway. One per process; thread-safe ``drain_once``.

    ``lock_engine``: where the lane and shard locks are taken (``DATABASE_DIRECT_URL``);
    None: ``engine``.

    ``gateway``: the process's (``Services.gateway()``; None without ``STRIPE_API_KEY``: then
    nothing is claimed). ``check_meters``: read Stripe's meters through it and send only to
    active ones, with each meter's payload keys (the product always does; a benchmark's
    stand-in for Stripe that has no meters turns it off)."""

    def __init__(self, engine: Engine, settings: Settings, gateway: StripeGateway | None, *,
                 clock: Callable[[], datetime] = utcnow,
                 monotonic: Callable[[], float] = time.monotonic, worker: str | None = None,
                 breaker: CircuitBreaker | None = None, rng: random.Random | None = None,
                 check_meters: bool = True, lock_engine: Engine | None = None) -> None:
        self.engine = engine
        self.settings = settings
        self.clock = clock
        self.monotonic = monotonic
        self.worker = worker or worker_name()
        self.policy = policy_from(settings)
        # The lane and shard locks are session state: over DATABASE_DIRECT_URL when the main
        # engine goes through a transaction pooler (webapp.pooler).
        self.lanes = lane_locks(lock_engine or engine, monotonic=monotonic)
        self.breaker = breaker or CircuitBreaker(monotonic=monotonic)
        self.rng = rng or random.Random()  # noqa: S311 - jitter, not security
        self.stopping = threading.Event()
        self.sender = Sender(
            gateway=None, lanes=self.lanes,
            limiter=(process_limiter(settings.stripe_max_requests_per_second)
                     if monotonic is time.monotonic
                     else RateLimiter(settings.stripe_max_requests_per_second,
                                      monotonic=monotonic)),
            breaker=self.breaker, policy=self.policy, concurrency=settings.concurrency,
            safety_margin_seconds=settings.claim_safety_margin_seconds, clock=clock,
            monotonic=monotonic, stopping=self.stopping, on_systemic=self._pause_systemic,
            on_meter_missing=self._meter_missing,
            strategy=send_streams if settings.meter_event_api == "v2_stream" else send_calls)
        #: Stripe's meters (with ``check_meters``): events of a meter that is not active at
        #: Stripe are not claimed, and each is sent with its meter's payload keys.
        self.meters: MeterCatalog | None = None
        self.check_meters = check_meters
        self.gateway = gateway
        self.pass_lock = threading.Lock()
        #: Whether this drainer takes a share of the lane shards: yes for a long-lived one
        #: (the worker, the in-app scheduler); the ``drain`` command, a one-off, claims the
        #: oldest due events as they come and leaves the split alone.
        self.shards = True
        self._last_probe = 0.0
        self.probe_interval_seconds = 30.0
        #: ``run`` overlaps the next claim and the last record with sending (PostgreSQL:
        #: each on its own connection; SQLite would only queue them behind one write lock).
        self.pipelined = engine.dialect.name == "postgresql"
        #: Every finished pass's figures added up (``claimed``, ``sent``, ``released``…).
        self.totals = DrainSummary()
        self.passes = 0
        self._totals_lock = threading.Lock()
        #: Set by :meth:`announce` for a long-lived drainer (the dashboard reads it).
        self.heartbeat: Heartbeat | None = None
        #: When to record the default meter for producers in SQL (None: done, or not asked).
        self._meter_record_due: float | None = None

    @property
    def gateway(self) -> StripeGateway | None:
        """Where events are sent; None: nothing is (no ``STRIPE_API_KEY``)."""
        return self.sender.gateway

    @gateway.setter
    def gateway(self, value: StripeGateway | None) -> None:
        self.sender.gateway = value
        self.meters = None
        if value is not None and self.check_meters:
            refresher = MeterRefresher(self.engine, value, clock=self.clock)
            self.meters = MeterCatalog(self.engine, refresher, monotonic=self.monotonic,
                                       on_systemic=self._pause_systemic)

    # -- lifecycle ---------------------------------------------------------------------------
    def announce(self, kind: str) -> None:
        """Write a heartbeat row every few seconds from now on (``kind``: ``worker`` or
        ``app``), so the dashboard's status line knows this drainer and its breaker."""
        self.heartbeat = Heartbeat(self.engine, self.worker, kind, clock=self.clock,
                                   monotonic=self.monotonic)
        # Producers in SQL take their default meter from what the running project records.
        self._meter_record_due = self.monotonic()
        self._record_default_meter()

    def _record_default_meter(self) -> None:
        """Record the default meter, now if due; after a failure, again a while later (a
        database that did not answer at start-up must not leave the old meter for good)."""
        due = self._meter_record_due
        if due is None or self.monotonic() < due:
            return
        try:
            record_default_meter(self.engine, self.settings.stripe_meter_event_name,
                                 now=self.clock())
        except Exception as exc:  # noqa: BLE001 - an old schema must not stop the drain
            self._meter_record_due = self.monotonic() + METER_RECORD_RETRY_SECONDS
            hint = ("run billing-outbox db upgrade" if "outbox_settings" in str(exc)
                    else f"the database did not answer: {type(exc).__name__}")
            log.warning("could not record the default meter for billing_outbox_enqueue "
                        "(%s); trying again in %d s", hint, METER_RECORD_RETRY_SECONDS)
        else:
            self._meter_record_due = None

    def request_stop(self) -> None:
        """Stop claiming; in-flight calls finish, the rest of the batch is released."""
        self.stopping.set()

    def close(self) -> None:
        """Let go of the send threads and every lane and shard."""
        self.sender.close()
        self.lanes.close()
        if self.heartbeat is not None:
            self.heartbeat.remove()

    # -- one pass ----------------------------------------------------------------------------
    def drain_once(self) -> DrainSummary:
        """Claim one batch, send it, record the outcomes. Never raises for Stripe's answers."""
        with self.pass_lock:
            p = self.begin()
            if p.claim is not None and p.claim.events:
                try:
                    self.send(p)
                finally:
                    self.finish(p)
            else:
                self.close_pass(p)
            return p.summary

    def begin(self, *, ahead: bool = False) -> Pass:
        """Phase 1: read the pause switch and the breaker, then claim. ``ahead``: claimed
        while the previous batch is still being sent (never a probe)."""
        summary = DrainSummary()
        p = Pass(summary, started=self.monotonic())
        if self.gateway is None:
            summary.skipped = "STRIPE_API_KEY is not set: nothing is sent"
            return p
        if self.stopping.is_set():
            summary.skipped = "stopping"
            return p
        with reading(self.engine) as conn:
            pause = control.pause_state(conn)
        limit = self.settings.batch_size
        if pause.paused:
            summary.paused, summary.pause_reason = True, pause.reason
            due = self.monotonic() - self._last_probe >= self.probe_interval_seconds
            if ahead or pause.kind != control.SYSTEMIC or not due:
                if self.shards:
                    # Still counted, and holding a share, so that sending resumes without a
                    # scramble for shards.
                    self.lanes.shard_view()
                return p
            self._last_probe = self.monotonic()
            limit, p.probing = 1, True
        allowed = self.breaker.allow_batch()
        if allowed == 0 or (ahead and allowed is not None):
            summary.skipped = "circuit breaker open"
            if allowed == 0:
                self.lanes.shard_view(draining=False)
            return p
        if allowed == 1:
            limit = 1
        # Claimed ahead, while this process still holds the previous batch's lanes: those
        # are free again by the time this batch is sent.
        avoid = self.sender.busy_elsewhere()
        if not ahead:
            avoid |= self.lanes.busy()
        # A batch comes from this worker's own shards first; a probe or a half-open breaker's
        # single call takes any event.
        skip, fill = self.lanes.shard_view() if limit > 1 and self.shards else ShardView()
        p.meters = (self.meters.active(retry=p.probing) if self.meters is not None
                    else None)
        p.claim = claims.claim_batch(
            self.engine, worker=self.worker, limit=limit, now=self.clock(),
            claim_timeout_seconds=self.settings.claim_timeout_seconds, avoid_lanes=avoid,
            skip_shards=skip, fill_from_skipped=fill,
            meters=None if p.meters is None else sorted(p.meters))
        summary.claimed = len(p.claim.events)
        return p

    def send(self, p: Pass) -> None:
        """Phase 2: send the claim's events (see :meth:`Sender.send`)."""
        assert p.claim is not None
        p.sent = self.sender.send(p.claim, p.meters)

    def finish(self, p: Pass) -> None:
        """Phase 3: record the outcomes (token-guarded), resume after a good probe, log."""
        assert p.claim is not None
        try:
            self._record(p.claim, p.sent, p.summary)
            if p.probing and p.summary.sent:
                if control.set_paused(self.engine, paused=False, reason=None,
                                      kind=control.SYSTEMIC, by=self.worker, now=self.clock(),
                                      only_kind=control.SYSTEMIC):
                    log.warning("sending resumed: a probe call to Stripe succeeded")
                p.summary.paused = False
        finally:
            self.close_pass(p)

    def close_pass(self, p: Pass) -> None:
        """Add a pass's figures to the totals, and log it if it did anything."""
        p.summary.duration_ms = int((self.monotonic() - p.started) * 1000)
        p.summary.breaker = self.breaker.state
        with self._totals_lock:
            self.passes += 1
            self.totals.add(p.summary)
            if self.heartbeat is not None:
                if p.summary.sent:
                    self.heartbeat.sent()
                self.heartbeat.beat(self.breaker, can_send=self.gateway is not None,
                                    sent_total=self.totals.sent)
        if p.summary.claimed:
            log.info("drained: %s", p.summary.as_dict())
        self._record_default_meter()

    def release_pass(self, p: Pass) -> None:
        """Return a batch claimed ahead to the queue untouched."""
        if p.claim is not None and p.claim.events:
            claims.release(self.engine, p.claim.token, [e.id for e in p.claim.events],
                           now=self.clock())

    def _pause_systemic(self, result: CallResult) -> None:
        reason = (f"Stripe answered HTTP {result.http_status} ({result.error_class}): "
                  f"{result.message or ''}").strip()[:500]
        # The next probe from this worker waits a full interval, not its very next pass.
        self._last_probe = self.monotonic()
        if control.set_paused(self.engine, paused=True, reason=reason, kind=control.SYSTEMIC,
                              by=self.worker, now=self.clock()):
            log.error("sending paused for every worker: %s", reason)

    def _meter_missing(self, event_name: str) -> None:
        if self.meters is not None:
            self.meters.mark_missing(event_name)

    def _record(self, claim: claims.Claim, sent: Sent, summary: DrainSummary) -> None:
        results = sent.results
        attempts = [a for r in results for a in r.attempts]
        release_now = [i for r in results for i in r.release]
        release_later = sent.busy_ids + [i for r in results for i in r.release_later]
        dead = [d for r in results for d in r.dead]
        now = self.clock()
        rec = record.record_outcomes(self.engine, claim, attempts, release_ids=release_now,
                                     dead_without_call=dead, now=now, policy=self.policy,
                                     rng=self.rng)
        if release_later:
            rec.released += claims.release(self.engine, claim.token, release_later, now=now,
                                           delay_seconds=self.settings.poll_interval_seconds)
        summary.calls += len(attempts)
        summary.sent += rec.sent
        summary.retrying += rec.retrying
        summary.dead += rec.dead
        summary.released += rec.released
        summary.fenced += rec.fenced
        if rec.fenced:
            log.error("%d outcomes not applied: claim %s had been taken over", rec.fenced,
                      claim.token)
