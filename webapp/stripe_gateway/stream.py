"""Stripe's meter event streams (API v2): one session token shared by a process's threads,
requests of up to 100 events, and what each request's answer means for every event in it.

What this relies on in stripe-python 16.1.0:

* ``client.v2.billing.meter_event_session.create()`` is ``POST /v2/billing/meter_event_session``
  on the ``api`` base address, authenticated with the secret key; the session carries
  ``authentication_token`` and ``expires_at`` (RFC 3339), valid 15 minutes.
* ``client.v2.billing.meter_event_stream.create(params=..., options={"api_key": token})`` is
  ``POST /v2/billing/meter_event_stream`` on the ``meter_events`` base address, and returns
  None: the 200's request id is read from the HTTP client instead.
* A v2 error whose ``type`` is ``temporary_session_expired`` raises
  ``stripe.TemporarySessionExpiredError``; other v2 errors are mapped as v1's are (a 400 is an
  ``InvalidRequestError``, 401 ``AuthenticationError``, 429 ``RateLimitError``), so
  :func:`~.errors.classify_error` applies to them unchanged.
* The SDK gives every v2 POST a fresh ``Idempotency-Key`` of its own unless the options carry
  one. Every stream request here carries its own (:func:`request_key`, unique per request), kept
  with the events it carried (``stripe_stream_requests``): Stripe's error reports may name a
  request's idempotency key instead of an event's identifier (the SDK documents
  ``sample_errors[].request.identifier`` as "the request idempotency key"), and the key is how
  such a sample is traced to its events. A resend is a new request with a new key, and Stripe's
  identifier dedupe is what makes resending an event safe.

Stripe validates the events of a stream after answering 200 (unknown meter or customer, bad
value, old timestamp) and reports them as error reports, like v1's later checks. A request-level
400 applies none of its events. Stripe's v2 errors carry ``type``, ``code``, ``message``,
``doc_url`` and ``user_message``, and no ``param``: the event at fault is named only when the
message says ``events[<i>]…``; otherwise :func:`split_refused` finds it by sending halves.

This module is the SDK-free half (the session tokens, what a request's answer means, the
search by halves), imported by the worker whether or not anything is sent; the requests
themselves, and the SDK's errors read as outcomes, are :mod:`.stream_sdk`'s.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from ..outbox.states import CallResult, Outcome

if TYPE_CHECKING:
    from .data import MeterEvent

#: Stripe takes at most this many events in one stream request.
MAX_EVENTS_PER_REQUEST = 100
#: How long Stripe documents a session to last.
SESSION_LIFETIME = timedelta(minutes=15)
#: A session is renewed this long before it expires, so no request carries a token about to
#: expire (a slow request, a thread that waited for the lock).
RENEW_AHEAD_SECONDS = 60.0
#: :func:`split_refused` sends at most this many extra requests for one refused request: enough
#: to find two bad events among 100 by halving (each level of halving costs two requests).
MAX_SPLIT_REQUESTS = 28


#: Every stream request's ``Idempotency-Key`` starts so (the rest is random): a sample naming one
#: is told from an event's identifier by the table of requests, not by its form.
REQUEST_KEY_PREFIX = "bo-stream-"


def request_key() -> str:
    """A new ``Idempotency-Key`` for one stream request: unique, 42 characters."""
    return REQUEST_KEY_PREFIX + secrets.token_hex(16)


def stream_params(event: MeterEvent) -> dict[str, object]:
    """One event of a stream request: the identifier, payload keys and second that v1 sends
    (so Stripe's identifier dedupe holds across a switch of API), the time as RFC 3339."""
    second = datetime.fromtimestamp(int(event.occurred_at.timestamp()), UTC)
    return {
        "event_name": event.event_name,
        "identifier": event.identifier,
        "timestamp": second.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "payload": {event.customer_key: event.stripe_customer_id,
                    event.value_key: str(event.value)},
    }


@dataclass(frozen=True)
class Session:
    """A meter event session: its token, and how long Stripe takes it (``expires_at`` less
    ``created``, both Stripe's times)."""

    token: str
    lifetime: timedelta


class SessionTokens:
    """The process's meter event session: created on first use, shared by every thread,
    renewed ``renew_ahead_seconds`` before it expires and at once when Stripe says it expired.

    The expiry is counted on this process's clock from when the session arrived, for the
    session's lifetime by Stripe's clock: a clock that differs from Stripe's cannot make every
    request renew it. One lock guards it; a thread that finds the session due renews it while
    the others wait for the new token (one session call, not one per thread).
    """

    def __init__(self, create: Callable[[], Session], *, clock: Callable[[], datetime],
                 renew_ahead_seconds: float = RENEW_AHEAD_SECONDS) -> None:
        self._create = create
        self._clock = clock
        self._ahead = timedelta(seconds=renew_ahead_seconds)
        self._lock = threading.Lock()
        self._session: Session | None = None
        self._renew_at = datetime.min.replace(tzinfo=UTC)
        self._created = 0

    @property
    def created(self) -> int:
        """Sessions created so far."""
        return self._created

    def token(self) -> str:
        """A token that is not due for renewal; raises the SDK's error if creating one fails."""
        with self._lock:
            session = self._session
            if session is None or self._clock() >= self._renew_at:
                session = self._new()
            return session.token

    def renew(self, stale: str) -> str:
        """A new token in place of ``stale``, which Stripe said had expired (another thread's
        renewal is used when it already replaced ``stale``)."""
        with self._lock:
            session = self._session
            if session is None or session.token == stale or self._clock() >= self._renew_at:
                session = self._new()
            return session.token

    def _new(self) -> Session:
        session = self._create()
        # Renew ahead of the end, but never sooner than half-way through a short session.
        self._renew_at = self._clock() + max(session.lifetime - self._ahead,
                                             session.lifetime / 2)
        self._session = session
        self._created += 1
        return session


@dataclass(frozen=True)
class StreamResult:
    """What one stream request (or one request and the requests that split it) did.

    ``results`` holds one classified outcome per event, in the request's order. ``requests``
    counts the HTTP stream requests made; ``resent_after_expiry`` of them repeated the same
    events because Stripe said the session had expired: those are not attempts. ``unconfirmed``:
    Stripe refused the request with a 400 that names no event, so none of them was applied
    (each is ``NOT_EXECUTED``) and ``refusal`` is Stripe's answer as it would read for the
    event at fault: :func:`split_refused` finds which one. ``keys``: per event, the
    ``Idempotency-Key`` of the request that carried it to its answer (empty: not known).
    """

    results: tuple[CallResult, ...]
    request_id: str | None
    requests: int = 1
    resent_after_expiry: int = 0
    unconfirmed: bool = False
    refusal: CallResult | None = None
    keys: tuple[str | None, ...] = ()

    def key_of(self, index: int) -> str | None:
        """The ``Idempotency-Key`` of the request that carried event ``index``, if known."""
        return self.keys[index] if index < len(self.keys) else None


def split_refused(send: Callable[[Sequence[MeterEvent]], StreamResult],
                  events: Sequence[MeterEvent], first: StreamResult, *,
                  max_requests: int = MAX_SPLIT_REQUESTS) -> StreamResult:
    """Find the event(s) at fault in a request Stripe refused without naming one (``first``
    is its result): send each half, and halve again any half refused the same way, until the
    refused half is one event, which gets Stripe's refusal; the other halves get their own
    answers (sent, or whatever else Stripe said). Halves go one after another, never two at
    once, level by level (so a bound that stops the search has sent the good halves it met).
    At most ``max_requests`` extra calls of ``send``: events still unresolved then stay not
    executed, and the result is still ``unconfirmed``. A systemic answer stops the search
    and is given to every unresolved event."""
    if not first.unconfirmed:
        return first
    results = list(first.results)
    keys = [first.key_of(i) for i in range(len(events))]
    requests, resent = first.requests, first.resent_after_expiry
    if len(events) == 1:
        results[0] = first.refusal or replace(results[0], outcome=Outcome.PERMANENT)
        return replace(first, results=tuple(results), unconfirmed=False, refusal=None)
    todo = _halves(0, len(events))
    spent = 0
    while todo and spent < max_requests:
        lo, hi = todo.pop(0)
        part = send(events[lo:hi])
        spent += 1
        requests += part.requests
        resent += part.resent_after_expiry
        if part.unconfirmed and hi - lo == 1:
            results[lo] = part.refusal or replace(part.results[0], outcome=Outcome.PERMANENT)
            keys[lo] = part.key_of(0)
        elif part.unconfirmed:
            todo += _halves(lo, hi)
        else:
            results[lo:hi] = part.results
            keys[lo:hi] = [part.key_of(i) for i in range(hi - lo)]
            systemic = next((r for r in part.results if r.outcome is Outcome.SYSTEMIC), None)
            if systemic is not None:
                for a, b in todo:
                    results[a:b] = [systemic] * (b - a)
                todo = []
    return StreamResult(tuple(results), first.request_id, requests, resent,
                        unconfirmed=bool(todo), refusal=first.refusal if todo else None,
                        keys=tuple(keys))


def _halves(lo: int, hi: int) -> list[tuple[int, int]]:
    mid = (lo + hi) // 2
    return [(lo, mid), (mid, hi)]


def _parse_time(value: object) -> datetime:
    """A v2 time (RFC 3339), timezone-aware; ``ValueError`` for anything else."""
    if value is None:
        raise ValueError("no time")
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
