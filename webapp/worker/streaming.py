"""Sending one claimed batch through Stripe's meter event streams (``STRIPE_METER_EVENT_API=
v2_stream``): the held lanes' events packed into requests of up to 100, requests in parallel.

One request in flight per (Stripe customer, meter), as in v1. Stripe documents this limit for
``POST /v1/billing/meter_events`` ("one concurrent call per customer per meter") and for
``POST /v2/billing/meter_events`` (the ``too_many_concurrent_requests`` code); the stream's own
reference (docs.stripe.com/api/v2/billing/meter-event-stream/create, and the 2024-09-30.acacia
changelog "Adds Meter Event v2 API endpoints") documents 10,000 requests/s and asynchronous
validation, and says nothing that lifts it. So it is kept: each held lane's events go in one
request (a lane of more than 100 in requests one after another), a request may hold events of
many lanes, and no two requests in flight share a lane.

Each request's answer is mapped onto v1's outcome classes and recorded by the drainer through
the same ``AttemptRecord`` rows (one per event, carrying the batch's request id):
200 → each event delivered; timeouts and 5xx → each unknown (the same identifiers next time,
and the dedupe-window guard before any resend); 429/409/503 → each not executed; a 400 that
names an event → only that event's outcome, the others back untouched to be sent again; a 400
that names none → :func:`~webapp.stripe_gateway.split_refused` finds the event; 401/403 →
sending paused for everyone; no such meter → the meter's events wait. A resend after Stripe
said the session expired is the same request, never an attempt.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from datetime import datetime

from ..outbox.claims import Claim, ClaimedEvent
from ..outbox.meters import MeterInfo
from ..outbox.record import AttemptRecord
from ..outbox.states import CallResult, Outcome
from ..stripe_gateway import (
    MAX_EVENTS_PER_REQUEST,
    MeterEvent,
    StreamResult,
    split_refused,
)
from ..stripe_gateway.stream import request_key
from .batch import LaneResult, Sender, latest_start, past_window, payload_keys, unknown_from

log = logging.getLogger(__name__)

#: A request (or a half of a refused one) that was never sent: stopping, the claim too short to
#: start one more, the breaker open. Its events go back untouched.
NOT_SENT = CallResult(Outcome.NOT_EXECUTED, message="not sent")

Request = list[ClaimedEvent]
#: Requests sent one after another by one thread (a lane of more than 100 events), or one.
Job = list[Request]


def pack(lanes: Sequence[Sequence[ClaimedEvent]], size: int = MAX_EVENTS_PER_REQUEST
         ) -> list[Job]:
    """The held lanes' events as jobs: every lane whole in one request (first fit, largest
    lanes first), a lane larger than ``size`` as a job of its own requests in order."""
    jobs: list[Job] = []
    bins: list[Request] = []
    for evs in sorted(lanes, key=len, reverse=True):
        if not evs:
            continue
        if len(evs) > size:
            jobs.append([list(evs[i:i + size]) for i in range(0, len(evs), size)])
            continue
        for b in bins:
            if len(b) + len(evs) <= size:
                b.extend(evs)
                break
        else:
            bins.append(list(evs))
    jobs.extend([b] for b in bins)
    return jobs


def send_streams(sender: Sender, claim: Claim, lanes: list[list[ClaimedEvent]],
                 abort: threading.Event, meters: dict[str, MeterInfo]) -> list[LaneResult]:
    """Send the held lanes' events in stream requests, up to ``sender.concurrency`` at once;
    one result per job (its attempts, releases and dead events)."""
    jobs = pack(lanes)
    run = _Run(sender, claim, abort, meters)
    if len(jobs) <= 1 or sender.concurrency == 1:
        return [run.job(j) for j in jobs]
    return [f.result() for f in [sender.pool().submit(run.job, j) for j in jobs]]


class _Run:
    """One batch's requests: what they share (the claim, the abort switch, the meters)."""

    def __init__(self, sender: Sender, claim: Claim, abort: threading.Event,
                 meters: dict[str, MeterInfo]) -> None:
        self.s = sender
        self.claim = claim
        self.abort = abort
        self.meters = meters
        self.latest = latest_start(claim, sender)
        gateway = sender.gateway
        assert gateway is not None  # the drainer claims nothing without one
        self.gateway = gateway

    def job(self, requests: Job) -> LaneResult:
        """Send ``requests`` one after another; after one that failed, the rest wait."""
        out = LaneResult()
        for i, events in enumerate(requests):
            rest = [e.id for r in requests[i + 1:] for e in r]
            verdict = self.request(events, out)
            if verdict == "ok":
                continue
            (out.release_later if verdict == "later" else out.release).extend(rest)
            break
        return out

    def request(self, events: Request, out: LaneResult) -> str:
        """Send one request's events and file each event's outcome in ``out``. ``ok``: go on
        with the job; ``later``/``now``: its remaining requests go back after a poll interval
        or at once."""
        s = self.s
        if s.breaker.allow_batch() == 0:
            out.release_later.extend(e.id for e in events)
            return "later"
        now = s.clock()
        if not self._may_start():
            out.release.extend(e.id for e in events)
            return "now"
        send: list[ClaimedEvent] = []
        for ev in events:
            if not past_window(ev, now, s.policy, out):
                send.append(ev)
        if not send:
            return "ok"
        t0 = s.monotonic()
        payload = [self._meter_event(ev) for ev in send]
        result = self._send(payload)
        if result.unconfirmed:
            result = split_refused(self._send, payload, result)
        ms = int((s.monotonic() - t0) * 1000)
        return self._file(send, result, now, ms, out)

    def _may_start(self) -> bool:
        s = self.s
        return not (s.stopping.is_set() or self.abort.is_set() or s.clock() > self.latest)

    def _send(self, events: Sequence[MeterEvent]) -> StreamResult:
        """One stream request within the rate limit and the claim, under an idempotency key
        of its own; never raises."""
        if not self._may_start() or not self.s.limiter.acquire(self.s.stopping):
            return StreamResult((NOT_SENT,) * len(events), None, requests=0)
        key = request_key()
        try:
            result = self.gateway.send_batch(events, key)
        except Exception as exc:
            log.exception("a stream request of %d events: the gateway raised", len(events))
            unknown = unknown_from(exc)
            self.s.breaker.record(Outcome.UNKNOWN)
            return StreamResult((unknown,) * len(events), None, keys=(key,) * len(events))
        self.s.breaker.record(_request_outcome(result))
        return result

    def _meter_event(self, ev: ClaimedEvent) -> MeterEvent:
        return MeterEvent(ev.meter, ev.stripe_customer_id, ev.quantity, ev.identifier,
                          ev.occurred_at, *payload_keys(self.meters, ev.meter))

    def _file(self, events: list[ClaimedEvent], result: StreamResult, now: datetime, ms: int,
              out: LaneResult) -> str:
        """Each event's outcome into ``out``: an attempt, or back untouched."""
        assert len(result.results) == len(events)
        verdict = "ok"
        systemic: CallResult | None = None
        for i, (ev, r) in enumerate(zip(events, result.results, strict=True)):
            if r is NOT_SENT:
                out.release.append(ev.id)
                verdict = "now" if verdict == "ok" else verdict
                continue
            if r.outcome is Outcome.NOT_EXECUTED and r.http_status == 400:
                # Refused with the whole request because of another event (or not yet found
                # among the halves): nothing of it was applied; it goes back untouched.
                (out.release_later if result.unconfirmed else out.release).append(ev.id)
                continue
            out.attempts.append(AttemptRecord(ev, r, now, ms, result.key_of(i)))
            if r.outcome is Outcome.SYSTEMIC:
                systemic = systemic or r
            elif r.outcome is Outcome.METER_MISSING:
                # The rest of a lane's requests are of the same meter: they wait for it too.
                self.s.on_meter_missing(ev.meter)
                verdict = "now" if verdict == "ok" else verdict
            elif r.outcome in (Outcome.NOT_EXECUTED, Outcome.UNKNOWN):
                verdict = "later"
        if systemic is not None:
            self.abort.set()
            self.s.on_systemic(systemic)
            verdict = "now"
        if verdict != "ok" or any(r.outcome is not Outcome.DELIVERED for r in result.results):
            first = next((r for r in result.results if r.outcome is not Outcome.DELIVERED),
                         result.results[0])
            log.warning("stream request of %d events: %s (HTTP %s, %s %s, request %s)",
                        len(events), first.outcome.value, first.http_status,
                        first.error_class, first.error_code or "", first.request_id)
        return verdict


def _request_outcome(result: StreamResult) -> Outcome:
    """What one request tells the circuit breaker: a refusal of one event is a definite answer
    from a reachable Stripe, a timeout or a 5xx is a failure, as in v1."""
    outcomes = {r.outcome for r in result.results}
    for o in (Outcome.UNKNOWN, Outcome.SYSTEMIC, Outcome.PERMANENT, Outcome.METER_MISSING,
              Outcome.DELIVERED):
        if o in outcomes:
            return o
    if result.unconfirmed and result.refusal is not None:
        return result.refusal.outcome
    return Outcome.NOT_EXECUTED
