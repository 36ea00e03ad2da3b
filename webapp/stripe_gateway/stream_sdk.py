"""The meter event stream's requests through the official SDK (see :mod:`.stream` for what
this relies on in stripe-python and what each answer means): :class:`StreamSender`, and the
SDK's errors read as each event's outcome. Loaded with :class:`~.client.StripeGateway`."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import stripe

from ..outbox.states import CallResult, Outcome
from .errors import classify_error
from .stream import (
    MAX_EVENTS_PER_REQUEST,
    RENEW_AHEAD_SECONDS,
    SESSION_LIFETIME,
    Session,
    SessionTokens,
    StreamResult,
    _parse_time,
    request_key,
    stream_params,
)

if TYPE_CHECKING:
    from .data import MeterEvent

#: Where an answer names the event at fault: ``events[3].timestamp`` (a v1-style ``param``, or
#: within a v2 error's message, which has no ``param``).
_EVENT_INDEX = re.compile(r"\bevents\[([0-9]+)\]")


class StreamSender:
    """Sends meter events through a stream session of the official SDK; never raises for
    Stripe's answer (only :class:`ValueError` for an empty or oversized batch)."""

    def __init__(self, client: stripe.StripeClient, *,
                 last_request_id: Callable[[], str | None],
                 clock: Callable[[], datetime] | None = None,
                 renew_ahead_seconds: float = RENEW_AHEAD_SECONDS) -> None:
        self._client = client
        self._last_request_id = last_request_id
        self.sessions = SessionTokens(self._create_session,
                                      clock=clock or (lambda: datetime.now(UTC)),
                                      renew_ahead_seconds=renew_ahead_seconds)

    def _create_session(self) -> Session:
        session = self._client.v2.billing.meter_event_session.create()
        try:
            lifetime = (_parse_time(getattr(session, "expires_at", None))
                        - _parse_time(getattr(session, "created", None)))
        except (TypeError, ValueError):
            lifetime = SESSION_LIFETIME  # what Stripe documents, when its answer says nothing
        return Session(str(session.authentication_token), lifetime)

    def send(self, events: Sequence[MeterEvent],
             idempotency_key: str | None = None) -> StreamResult:
        """``POST /v2/billing/meter_event_stream`` with ``events`` (1 to 100) under
        ``idempotency_key`` (a new :func:`~.stream.request_key` when None), each event's
        classified outcome and the key of the request that carried it. An expired session is
        renewed and the same events sent once more, under a new key (counted in
        ``resent_after_expiry``)."""
        count = len(events)
        if not 0 < count <= MAX_EVENTS_PER_REQUEST:
            raise ValueError(f"a stream request holds 1 to {MAX_EVENTS_PER_REQUEST} events, "
                             f"not {count}")
        params = {"events": [stream_params(e) for e in events]}
        key = idempotency_key or request_key()
        resent = 0
        try:
            token = self.sessions.token()
        except stripe.StripeError as exc:
            return _session_failed(exc, count, requests=0, resent=0)
        while True:
            try:
                self._client.v2.billing.meter_event_stream.create(
                    params=params,  # type: ignore[arg-type]
                    options={"api_key": token, "idempotency_key": key})
            except stripe.TemporarySessionExpiredError as exc:
                if resent:
                    # Expired twice in a row: nothing was applied; try again later.
                    result = replace(classify_error(exc), outcome=Outcome.NOT_EXECUTED)
                    return StreamResult((result,) * count, exc.request_id, 1 + resent, resent)
                resent = 1
                # Not applied: the same events go again, as a new request with a key of its
                # own (Stripe may keep the refusal under the first).
                key = request_key()
                try:
                    token = self.sessions.renew(token)
                except stripe.StripeError as renew_exc:
                    return _session_failed(renew_exc, count, requests=1, resent=0)
                continue
            except stripe.StripeError as exc:
                results, refusal = classify_stream_error(exc, count)
                return StreamResult(results, exc.request_id, 1 + resent, resent,
                                    unconfirmed=refusal is not None, refusal=refusal,
                                    keys=(key,) * count)
            request_id = self._last_request_id()
            sent = CallResult(Outcome.DELIVERED, http_status=200, request_id=request_id)
            return StreamResult((sent,) * count, request_id, 1 + resent, resent,
                                keys=(key,) * count)


def classify_stream_error(exc: stripe.StripeError, count: int
                          ) -> tuple[tuple[CallResult, ...], CallResult | None]:
    """Each event's outcome after a stream request failed with ``exc``, and, when Stripe
    refused the request with a 400 that names none of its events, that refusal (else None).

    Every answer but a request-level 400 concerns the whole request, so every event gets the
    outcome v1 gives the same answer (timeouts and 5xx: unknown; 429, 409, 503: not executed;
    401, 403: systemic). A 400 applied none of the events: the one it names
    (``events[3].timestamp``, in its message; or in a ``param``, which Stripe's v2 errors do
    not carry) gets v1's outcome for a 400, the others are not executed.
    """
    base = classify_error(exc)
    if exc.http_status != 400 or base.outcome is Outcome.NOT_EXECUTED:
        return (base,) * count, None
    index = refused_index(exc)
    if index is None or index >= count:
        untouched = replace(base, outcome=Outcome.NOT_EXECUTED, fresh_key=False)
        return (untouched,) * count, base
    untouched = replace(base, outcome=Outcome.NOT_EXECUTED, fresh_key=False,
                        message=f"not applied: Stripe refused the whole request because of "
                                f"another event in it ({base.message})")
    return tuple(base if i == index else untouched for i in range(count)), None


def refused_index(exc: stripe.StripeError) -> int | None:
    """The position of the event a 400 names (``events[3].timestamp`` → 3): in a ``param``
    where there is one, else in the message. A message that names two different events does
    not say which one was refused alone: None then, and the halving finds it."""
    error = getattr(exc, "error", None)
    param = getattr(error, "param", None) or getattr(exc, "param", None)
    match = _EVENT_INDEX.match(str(param)) if param else None
    if match:
        return int(match.group(1))
    message = getattr(error, "message", None) or getattr(exc, "user_message", None) or ""
    named = {int(m.group(1)) for m in _EVENT_INDEX.finditer(str(message))}
    return named.pop() if len(named) == 1 else None


def _session_failed(exc: stripe.StripeError, count: int, *, requests: int,
                    resent: int) -> StreamResult:
    """No session, so no event left: a 401/403 (or any answer that will not pass by itself)
    stops sending; a timeout, a 5xx or a rate limit leaves the events not executed."""
    base = classify_error(exc)
    if base.outcome in (Outcome.UNKNOWN, Outcome.NOT_EXECUTED):
        base = replace(base, outcome=Outcome.NOT_EXECUTED, fresh_key=False)
    else:
        base = replace(base, outcome=Outcome.SYSTEMIC)
    message = f"no meter event session: {base.message}" if base.message else None
    result = replace(base, message=message)
    return StreamResult((result,) * count, exc.request_id, requests, resent)
