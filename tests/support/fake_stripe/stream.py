"""Stripe's meter event streams (API v2), as the fake serves them:
``POST /v2/billing/meter_event_session`` (Bearer secret key; a token valid
``stream_token_seconds``, 15 minutes by default) and ``POST /v2/billing/meter_event_stream``
(Bearer session token; JSON ``{"events": [...]}``, up to 100).

Order of the checks for one stream request: the auth failure switch, the session token (none
or unknown: 401; expired, or expired by :meth:`StreamMixin.expire_stream_tokens`: 401 of type
``temporary_session_expired``, which the SDK raises as ``TemporarySessionExpiredError``), the
faults in front (as v1's: 401, 403, 429, 503, 409, ``drop_before``, ``400``), the shape of the
request (a request-level 400 that applies none of its events; its ``param`` names the event,
``events[3].timestamp``, unless ``stream_names_event`` is False), then execution (500/502/504
with ``apply``, ``drop`` after applying), then the latency/``slow`` sleep while in flight.

Execution takes every event and answers 200 ``{}``: the identifier dedupe is v1's (one accepted
set: an identifier already accepted by either API is skipped, silently), and everything else is
checked after the 200 (no such meter, no customer, a bad value, a timestamp more than 35 days
old or 5 minutes ahead), queued as asynchronous errors and reported by ``flush_reports`` as v1's
later checks are.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from .faults import FRONT_FAULTS, Fault, fault_name
from .http import DROP, Handler, Response, bearer_key, error, invalid, ok, request_id
from .meter_events import (
    MAX_EVENT_NAME_LENGTH,
    MAX_FUTURE_SECONDS,
    MAX_IDENTIFIER_LENGTH,
    MAX_PAST_SECONDS,
    MAX_VALUE_DIGITS,
    AcceptedEvent,
    AsyncError,
    FakeMeter,
)

MAX_STREAM_EVENTS = 100
TOKEN_SECONDS = 15 * 60
_DIGITS = re.compile(r"[0-9]+")
EXPIRED_MESSAGE = ("The meter event session has expired. Create a new one with "
                   "POST /v2/billing/meter_event_session.")


def _rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def _parse_time(raw: str) -> float | None:
    try:
        parsed = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed.timestamp() if parsed.tzinfo is not None else None


class StreamMixin:
    """The session and stream endpoints of :class:`FakeStripe` (which holds the state)."""

    _lock: threading.Lock
    _clock: Callable[[], float]
    _meters: dict[str, FakeMeter]
    _customers: set[str] | None
    _accepted: dict[str, AcceptedEvent]
    _also_accepted: list[AcceptedEvent]
    _by_pair: defaultdict[tuple[str, str], list[Any]]
    _accept_count: int
    _overlaps: dict[tuple[str, str], int]
    _lane_in_flight: dict[tuple[str, str], int]
    _in_flight: int
    _max_in_flight: int
    _latency: float
    _auth_failure: int | None
    _targeted: dict[str, Fault]
    _pending_errors: list[AsyncError]
    dedupe_seconds: float | None
    _next_fault_locked: Callable[[str | None], Fault | None]
    _authorized: Callable[[Handler, Callable[[], Response]], Response]
    _auth_error: Callable[[int, str], Response]
    _front_fault: Callable[[Fault, str, str | None], Response]
    _server_error: Callable[[int], Response]
    _later_check: Callable[[FakeMeter, str, str], tuple[str, str] | None]

    #: How long a session token is valid.
    stream_token_seconds: float = TOKEN_SECONDS
    #: Whether a request-level 400 names its event in ``param`` (Stripe's v2 errors carry no
    #: ``param``; the fake then names it in the message, unless ``stream_message_names_event``
    #: is False too, and the client must find it by halving).
    stream_names_event: bool = False
    stream_message_names_event: bool = True
    #: What an error report's sample names for an event sent in a stream: ``request`` (the
    #: request's ``Idempotency-Key``: the SDK documents ``request.identifier`` as "the request
    #: idempotency key") or ``identifier`` (the event's, as Stripe's example shows).
    stream_samples_name: str = "request"

    def _stream_init(self) -> None:
        """The stream's state as constructed (also what :meth:`FakeStripe.reset` returns to)."""
        self.stream_token_seconds = TOKEN_SECONDS
        self.stream_names_event = False
        self.stream_message_names_event = True
        self.stream_samples_name = "request"
        self._stream_tokens: dict[str, float] = {}
        self._stream_sessions = 0
        self._stream_calls = 0
        self._stream_duplicates = 0
        self._stream_log: deque[dict[str, Any]] = deque(maxlen=200_000)

    # -- observation and control --------------------------------------------------------------
    def expire_stream_tokens(self) -> None:
        """Every session token issued so far is expired from now on."""
        with self._lock:
            self._stream_tokens = dict.fromkeys(self._stream_tokens, float("-inf"))

    def stream_sessions(self) -> int:
        """Meter event sessions created."""
        with self._lock:
            return self._stream_sessions

    def stream_calls(self) -> int:
        """Every POST received on the stream route, whatever its outcome."""
        with self._lock:
            return self._stream_calls

    def stream_duplicates(self) -> int:
        """Stream events skipped because their identifier was already accepted."""
        with self._lock:
            return self._stream_duplicates

    def stream_log(self) -> list[dict[str, Any]]:
        """One dict per stream request, oldest first: ``identifiers``, ``status`` (None for a
        dropped connection), ``fault``, ``fault_applied``, ``request_id``, ``token``,
        ``idempotency_key`` (the request's header), ``started`` (``time.monotonic()``)."""
        with self._lock:
            return [dict(entry) for entry in self._stream_log]

    # -- POST /v2/billing/meter_event_session -------------------------------------------------
    def _serve_stream_session(self, handler: Handler) -> Response:
        def create() -> Response:
            now = self._clock()
            token = "mes_tok_" + secrets.token_hex(16)
            with self._lock:
                self._stream_tokens[token] = now + self.stream_token_seconds
                self._stream_sessions += 1
            return ok({"id": "mes_" + secrets.token_hex(12),
                       "object": "v2.billing.meter_event_session",
                       "authentication_token": token, "created": _rfc3339(now),
                       "expires_at": _rfc3339(now + self.stream_token_seconds),
                       "livemode": False})
        return self._authorized(handler, create)

    # -- POST /v2/billing/meter_event_stream --------------------------------------------------
    def _serve_stream(self, handler: Handler, raw: bytes) -> None:
        try:
            body = json.loads(raw) if raw.strip() else None
        except (UnicodeDecodeError, ValueError):
            body = None
        events = body.get("events") if isinstance(body, dict) else None
        items = [e for e in events if isinstance(e, dict)] if isinstance(events, list) else []
        ids = [str(e.get("identifier")) for e in items if e.get("identifier")]
        lanes = self._stream_lanes(items)
        req_id = request_id()
        entry: dict[str, Any] = {"identifiers": ids, "status": None, "fault": None,
                                 "fault_applied": False, "request_id": req_id,
                                 "token": bearer_key(handler.headers.get("Authorization")),
                                 "idempotency_key": handler.headers.get("Idempotency-Key"),
                                 "started": time.monotonic()}
        with self._lock:
            self._stream_calls += 1
            aimed = next((i for i in ids if i in self._targeted), None)
            fault = self._next_fault_locked(aimed)
            self._enter_locked(lanes)
            latency = self._latency
            entry["fault"] = fault_name(fault)
            self._stream_log.append(entry)
        resp: Response = DROP
        try:
            resp, entry["fault_applied"] = self._stream_process(handler, events, items, fault,
                                                                aimed)
            delay = latency + (fault.seconds if fault is not None and fault.kind == "slow" else 0)
            if delay > 0:
                time.sleep(delay)
        finally:
            with self._lock:
                self._leave_locked(lanes)
                entry["status"] = None if resp is DROP else resp.status
        if resp is DROP:
            handler.close_connection = True
        else:
            handler.send(resp, req_id)

    def _stream_lanes(self, items: list[dict[str, Any]]) -> set[tuple[str, str]]:
        """The (customer, event name) lanes the request's events belong to."""
        lanes = set()
        with self._lock:
            for e in items:
                name = str(e.get("event_name") or "")
                meter = self._meters.get(name)
                payload = e.get("payload")
                if not isinstance(payload, dict):
                    continue
                customer = payload.get(meter.customer_key if meter else "stripe_customer_id")
                if name and customer:
                    lanes.add((str(customer), name))
        return lanes

    def _stream_process(self, handler: Handler, events: Any, items: list[dict[str, Any]],
                        fault: Fault | None, aimed: str | None) -> tuple[Response, bool]:
        """The answer (or ``DROP``) and whether the fault took effect."""
        kind = fault.kind if fault is not None else None
        token = bearer_key(handler.headers.get("Authorization"))
        with self._lock:
            auth_failure = self._auth_failure
            expires = self._stream_tokens.get(token or "")
        if auth_failure is not None:
            return self._auth_error(auth_failure, token or ""), False
        if expires is None:
            return error(401, "invalid_request_error",
                         "Invalid or missing meter event session token: create one with "
                         "POST /v2/billing/meter_event_session."), False
        if self._clock() >= expires:
            return error(401, "temporary_session_expired", EXPIRED_MESSAGE,
                         code="billing_meter_event_session_expired"), False
        if kind in FRONT_FAULTS:
            assert fault is not None
            if kind == "400":
                index = next((i for i, e in enumerate(items)
                              if aimed is not None and e.get("identifier") == aimed), 0)
                return self._stream_invalid(
                    "Invalid payload: refused (an injected fault).", f"events[{index}].payload"
                ), True
            return self._front_fault(fault, token or "", handler.headers.get("Idempotency-Key")
                                     ), True
        refused = self._stream_validate(events)
        if refused is not None:
            return refused, kind in ("drop", "slow")
        if kind in ("500", "502", "504"):
            assert fault is not None
            if fault.apply:
                self._stream_execute(items, handler.headers.get("Idempotency-Key"))
            return self._server_error(int(kind)), True
        self._stream_execute(items, handler.headers.get("Idempotency-Key"))
        return (DROP if kind == "drop" else ok({})), kind in ("drop", "slow")

    def _stream_invalid(self, message: str, param: str) -> Response:
        """A request-level 400 about the event ``param`` names: as Stripe's v2 errors, with
        no ``param`` (unless ``stream_names_event``); the message starts with the event's
        path (unless ``stream_message_names_event`` is False)."""
        if not param.startswith("events["):
            return invalid(message, param=param)
        if self.stream_names_event:
            return invalid(message, param=param)
        return invalid(f"{param}: {message}" if self.stream_message_names_event else message)

    def _stream_validate(self, events: Any) -> Response | None:
        """The request-level 400 (nothing applied), or None: what Stripe can tell without
        looking anything up. The rest is checked after the 200."""
        if not isinstance(events, list) or not events:
            return invalid("Missing required param: events.", param="events")
        if len(events) > MAX_STREAM_EVENTS:
            return invalid(f"Too many events: at most {MAX_STREAM_EVENTS} per request.",
                           param="events")
        for i, e in enumerate(events):
            if not isinstance(e, dict):
                return self._stream_invalid("Each event must be an object.", f"events[{i}]")
            name = e.get("event_name")
            if not isinstance(name, str) or not name:
                return self._stream_invalid("Missing required param: event_name.",
                                            f"events[{i}].event_name")
            if len(name) > MAX_EVENT_NAME_LENGTH:
                return self._stream_invalid("Invalid event_name: too long.",
                                            f"events[{i}].event_name")
            payload = e.get("payload")
            if not isinstance(payload, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in payload.items()):
                return self._stream_invalid("Invalid payload: a map of strings to strings.",
                                            f"events[{i}].payload")
            identifier = e.get("identifier")
            if identifier is not None and (not isinstance(identifier, str)
                                           or len(identifier) > MAX_IDENTIFIER_LENGTH):
                return self._stream_invalid(
                    f"Invalid identifier: at most {MAX_IDENTIFIER_LENGTH} characters.",
                    f"events[{i}].identifier")
            ts = e.get("timestamp")
            if ts is not None and (not isinstance(ts, str) or _parse_time(ts) is None):
                return self._stream_invalid(
                    f"Invalid timestamp: {ts!r} is not an RFC 3339 time.",
                    f"events[{i}].timestamp")
        return None

    def _stream_execute(self, items: list[dict[str, Any]], request_key: str | None) -> None:
        """Take every event not already accepted; queue what the checks after the 200 find,
        each sample naming the request's ``Idempotency-Key`` (``stream_samples_name`` is
        ``request``, what the SDK documents) or the event's identifier."""
        now = self._clock()
        with self._lock:
            for e in items:
                identifier = str(e.get("identifier") or "fake_" + secrets.token_hex(12))
                first = self._accepted.get(identifier)
                if first is not None and (self.dedupe_seconds is None
                                          or now - first.received_at < self.dedupe_seconds):
                    self._stream_duplicates += 1
                    continue
                name = str(e["event_name"])
                ts = _parse_time(str(e["timestamp"])) if e.get("timestamp") else now
                timestamp = int(ts if ts is not None else now)
                meter = self._meters.get(name)
                payload = {str(k): str(v) for k, v in e["payload"].items()}
                customer = payload.get(meter.customer_key if meter else "stripe_customer_id", "")
                value = payload.get(meter.value_key if meter else "value", "")
                named = (request_key if self.stream_samples_name == "request" and request_key
                         else identifier)
                self._take(AcceptedEvent(identifier=identifier, event_name=name,
                                         customer=customer, value=value, timestamp=timestamp,
                                         received_at=now, payload=payload),
                           self._stream_check(meter, name, customer, value, timestamp, now),
                           again=first is not None, sample_names=named)

    def _stream_check(self, meter: FakeMeter | None, name: str, customer: str, value: str,
                      timestamp: int, now: float) -> tuple[str, str] | None:
        """What Stripe finds wrong with a stream event after its 200 (lock held)."""
        if meter is None:
            return "no_meter", f"No meter was found for event_name '{name}'."
        if meter.status != "active":
            return "archived_meter", f"Meter {meter.id} for event_name '{name}' is inactive."
        if timestamp < now - MAX_PAST_SECONDS:
            return "timestamp_too_far_in_past", "The timestamp must be within the past 35 days."
        if timestamp > now + MAX_FUTURE_SECONDS:
            return "timestamp_in_future", "The timestamp is more than 5 minutes in the future."
        if value:
            if _DIGITS.fullmatch(value) is None or int(value) == 0:
                return ("meter_event_invalid_value",
                        f"Invalid value '{value}': a positive whole number is required.")
            if len(value.lstrip("0")) > MAX_VALUE_DIGITS:
                return ("meter_event_value_too_many_digits",
                        f"Invalid value '{value}': more than {MAX_VALUE_DIGITS} digits.")
        return self._later_check(meter, customer, value)
