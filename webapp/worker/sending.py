"""v1 sending (``STRIPE_METER_EVENT_API=v1``): each held lane's events one call at a time,
lanes in parallel, no transaction open (:mod:`webapp.worker.batch` holds what both ways of
sending share)."""

from __future__ import annotations

import logging
import threading

from ..outbox.claims import Claim, ClaimedEvent
from ..outbox.meters import MeterInfo
from ..outbox.record import AttemptRecord
from ..outbox.states import CallResult, Outcome
from ..stripe_gateway import MeterEvent, StripeGateway
from .batch import LaneResult, Sender, latest_start, past_window, payload_keys, unknown_from

log = logging.getLogger(__name__)


def send_calls(sender: Sender, claim: Claim, lanes: list[list[ClaimedEvent]],
               abort: threading.Event, meters: dict[str, MeterInfo]) -> list[LaneResult]:
    """Send the held lanes' events, one v1 call at a time per lane, up to
    ``sender.concurrency`` lanes at once; one result per lane."""
    if len(lanes) <= 1 or sender.concurrency == 1:
        return [_send_lane(sender, claim, evs, abort, meters) for evs in lanes]
    futures = [sender.pool().submit(_send_lane, sender, claim, evs, abort, meters)
               for evs in lanes]
    return [f.result() for f in futures]


def _send_lane(sender: Sender, claim: Claim, events: list[ClaimedEvent], abort: threading.Event,
               meters: dict[str, MeterInfo]) -> LaneResult:
    """Send one lane's events in order, one call at a time."""
    out = LaneResult()
    keys = payload_keys(meters, events[0].meter if events else "")
    latest = latest_start(claim, sender)
    # Bound once: this loop runs for every event the drainer sends.
    clock, monotonic, call, gateway = sender.clock, sender.monotonic, _call, sender.gateway
    assert gateway is not None
    stopping, aborted = sender.stopping.is_set, abort.is_set
    breaker, limiter, record = sender.breaker, sender.limiter, out.attempts.append

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
        if past_window(ev, now, sender.policy, out):
            continue
        if not limiter.acquire(sender.stopping):
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
            sender.on_systemic(result)
            out.release.extend(rest(i + 1))
            break
        if result.outcome is Outcome.METER_MISSING:
            # The lane is one meter's: the rest of it waits for the meter too.
            sender.on_meter_missing(ev.meter)
            out.release.extend(rest(i + 1))
            break
        if result.outcome in (Outcome.NOT_EXECUTED, Outcome.UNKNOWN):
            # The rest of this lane would meet the same trouble: leave it for later.
            out.release_later.extend(rest(i + 1))
            break
    return out


def _call(gateway: StripeGateway, ev: ClaimedEvent, keys: tuple[str, str]) -> CallResult:
    """One call; an unexpected error counts as "outcome unknown" (it may have left)."""
    try:
        return gateway.send(MeterEvent(ev.meter, ev.stripe_customer_id, ev.quantity,
                                       ev.identifier, ev.occurred_at, *keys),
                            ev.idempotency_key)
    except Exception as exc:
        log.exception("event %d: the gateway raised", ev.id)
        return unknown_from(exc)
