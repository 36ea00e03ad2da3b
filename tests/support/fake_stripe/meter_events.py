"""``POST /v1/billing/meter_events``, as Stripe answers it: authentication, the faults in
front, the idempotency layer, synchronous validation, execution with identifier dedupe, and
the checks Stripe makes only after answering 200 (queued as asynchronous errors)."""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from .faults import FRONT_FAULTS, Fault, RandomFaults, fault_name
from .http import DROP, Handler, Response, bearer_key, error, invalid, mask_key, request_id, to_json

MAX_PAST_SECONDS = 35 * 24 * 3600
MAX_FUTURE_SECONDS = 5 * 60
MAX_IDENTIFIER_LENGTH = 100
MAX_EVENT_NAME_LENGTH = 100
MAX_VALUE_DIGITS = 15
DUPLICATE_MESSAGE_PREFIX = "An event already exists with identifier"
STATUS_MESSAGES = {
    500: "An unknown error occurred while processing the request.",
    502: "Bad gateway: the upstream service did not answer in time.",
    503: "The service is temporarily unavailable. Please try again later.",
    504: "Gateway timeout while processing the request.",
}
_VALUE_RE = re.compile(r"-?([0-9]+)")
_INT_RE = re.compile(r"-?[0-9]+")
_PAYLOAD_KEY_RE = re.compile(r"payload\[([^\[\]]+)\]")
_TOP_LEVEL_PARAMS = frozenset({"event_name", "identifier", "timestamp"})


@dataclass
class AcceptedEvent:
    """One meter event the fake accepted (the first one for its identifier)."""

    identifier: str
    event_name: str
    customer: str
    value: str
    timestamp: int
    received_at: float
    payload: dict[str, str] = field(default_factory=dict)
    #: False once Stripe's checks after the 200 found it invalid (an error was queued).
    valid: bool = True
    cancelled: bool = False
    #: True once a test made Stripe lose it (:meth:`BillingMixin.forget`): summaries leave it
    #: out, its identifier stays taken.
    lost: bool = False
    #: What a sample reporting it names (its identifier, or its stream request's key).
    named: str | None = None


@dataclass
class FakeMeter:
    """A meter: what ``GET /v1/billing/meters`` lists."""

    id: str
    event_name: str
    status: str = "active"
    customer_key: str = "stripe_customer_id"
    value_key: str = "value"
    formula: str = "sum"
    display_name: str = ""
    created: int = 0
    #: ``day`` or ``hour``: pre-aggregated (Stripe keeps one value per customer and window,
    #: the last one sent); None: every event counts.
    event_time_window: str | None = None


@dataclass(frozen=True)
class AsyncError:
    """An error Stripe found after answering 200, waiting to be reported."""

    event_name: str
    code: str
    message: str
    identifier: str
    #: When the event was accepted (the fake's clock); the report's validation starts then.
    at: float | None = None


class IdemRecord:
    """What the idempotency layer holds for one (api key, idempotency key)."""

    __slots__ = ("params", "status", "body", "request_id")

    def __init__(self, params: tuple[tuple[str, str], ...]) -> None:
        self.params = params
        self.status: int | None = None  # None while the first request is executing
        self.body = b""
        self.request_id = ""


class MeterEventsMixin:
    """The meter-event endpoint of :class:`FakeStripe` (which holds the state)."""

    _lock: threading.Lock
    _clock: Callable[[], float]
    _valid_key_prefixes: tuple[str, ...]
    _meters: dict[str, FakeMeter]
    _customers: set[str] | None
    _customer_state_locked: Callable[..., str]
    #: Whether a ``meter_event_customer_not_found`` error's message names the customer
    #: (Stripe's wording is not documented: tests try both).
    customer_error_names_customer: bool = True
    _accepted: dict[str, AcceptedEvent]
    _also_accepted: list[AcceptedEvent]
    _by_pair: defaultdict[tuple[str, str], list[Any]]
    _accept_count: int
    _calls: int
    _duplicates: int
    _overlaps: dict[tuple[str, str], int]
    _lane_in_flight: dict[tuple[str, str], int]
    _in_flight: int
    _max_in_flight: int
    _log: deque[dict[str, Any]]
    _idem: dict[tuple[str, str], IdemRecord]
    _auth_failure: int | None
    _latency: float
    _queued: deque[Fault]
    _random: RandomFaults | None
    _pending_errors: list[AsyncError]
    dedupe_seconds: float | None
    _next_fault_locked: Callable[[str | None], Fault | None]

    def _customer_key(self, event_name: str | None) -> str:
        with self._lock:
            meter = self._meters.get(event_name or "")
        return meter.customer_key if meter is not None else "stripe_customer_id"

    def _authorized(self, handler: Handler, answer: Callable[[], Response]) -> Response:
        """Stripe's authentication in front of every API route but the meter events', and
        the same latency."""
        api_key = bearer_key(handler.headers.get("Authorization"))
        with self._lock:
            auth_failure = self._auth_failure
            latency = self._latency
        if latency:
            time.sleep(latency)
        if auth_failure is not None:
            return self._auth_error(auth_failure, api_key or "")
        if api_key is None or not api_key.startswith(self._valid_key_prefixes):
            return self._auth_error(401, api_key or "")
        return answer()

    def _serve_meter_event(self, handler: Handler, raw: bytes) -> None:
        """Answer one ``POST /v1/billing/meter_events``."""
        try:
            pairs = parse_qsl(raw.decode("utf-8"), keep_blank_values=True)
        except (UnicodeDecodeError, ValueError):
            pairs = []
        params = dict(pairs)
        event_name = params.get("event_name")
        customer = params.get(f"payload[{self._customer_key(event_name)}]")
        lane = (customer, event_name) if customer and event_name else None
        idem_key = handler.headers.get("Idempotency-Key") or None
        req_id = request_id()
        started = time.monotonic()
        entry: dict[str, Any] = {
            "identifier": params.get("identifier"),
            "idempotency_key": idem_key,
            "status": None,
            "lane": lane,
            "started": started,
            "ended": None,
            "fault": None,
            "fault_applied": False,
            "replayed": False,
            "request_id": req_id,
            # The SDK's client telemetry header, which the gateway turns off.
            "client_telemetry": handler.headers.get("X-Stripe-Client-Telemetry") is not None,
        }
        with self._lock:
            self._calls += 1
            fault = self._next_fault_locked(params.get("identifier"))
            self._enter_locked([lane] if lane is not None else [])
            latency = self._latency
            entry["fault"] = fault_name(fault)
            self._log.append(entry)

        resp: Response | None = None
        release: Callable[[Response | None], None] | None = None
        fault_applied = False
        settled = False

        def settle() -> None:
            # Runs just before the response is written (or the connection dropped), so that a
            # client can never see the answer while its call still counts as in flight: a
            # sequential caller on another connection must not be counted as an overlap.
            nonlocal settled
            settled = True
            with self._lock:
                self._leave_locked([lane] if lane is not None else [])
                entry["ended"] = time.monotonic()
                entry["status"] = None if resp is None or resp is DROP else resp.status
                entry["fault_applied"] = fault_applied
                entry["replayed"] = resp is not None and resp.replayed
                if entry["identifier"] is None and resp is not None and resp.status == 200:
                    entry["identifier"] = json.loads(resp.body).get("identifier")

        try:
            resp, release, fault_applied = self._process(
                handler, pairs, params, idem_key, req_id, fault
            )
            delay = latency + (fault.seconds if fault is not None and fault.kind == "slow" else 0)
            if delay > 0:
                time.sleep(delay)
            if release is not None:
                release(resp)
                release = None
            settle()
            if resp is DROP:
                handler.close_connection = True
            else:
                handler.send(resp, req_id)
        finally:
            if release is not None:  # an exception before the response was settled
                release(None)
            if not settled:
                settle()

    def _process(
        self,
        handler: Handler,
        pairs: list[tuple[str, str]],
        params: Mapping[str, str],
        idem_key: str | None,
        request_id: str,
        fault: Fault | None,
    ) -> tuple[Response, Callable[[Response | None], None] | None, bool]:
        """Decide the response. Returns (response or ``DROP``, the idempotency-record release
        to call once the response is settled, whether the fault took effect)."""
        kind = fault.kind if fault is not None else None
        drop_after = kind == "drop"

        # 1. Authentication (before everything, like Stripe's edge).
        api_key = bearer_key(handler.headers.get("Authorization"))
        with self._lock:
            auth_failure = self._auth_failure
        if auth_failure is not None:
            key = api_key or ""
            return self._auth_error(auth_failure, key), None, False
        if api_key is None:
            return (
                error(
                    401,
                    "invalid_request_error",
                    "You did not provide an API key. You need to provide your API key in the "
                    "Authorization header, using Bearer auth (e.g. 'Authorization: Bearer "
                    "YOUR_SECRET_KEY'). See https://stripe.com/docs/api#authentication for "
                    "details, or we can help at https://support.stripe.com/.",
                ),
                None,
                False,
            )
        if not api_key.startswith(self._valid_key_prefixes):
            return self._auth_error(401, api_key), None, False

        # 2. Faults in front of the idempotency layer: nothing is executed or saved.
        if kind in FRONT_FAULTS:
            assert fault is not None
            return self._front_fault(fault, api_key, idem_key), None, True

        # 3. The idempotency layer.
        release: Callable[[Response | None], None] | None = None
        if idem_key is not None:
            record_key = (api_key, idem_key)
            normalized = tuple(sorted(pairs))
            with self._lock:
                record = self._idem.get(record_key)
                if record is None:
                    record = IdemRecord(normalized)
                    self._idem[record_key] = record
                    owned = True
                else:
                    owned = False
            if not owned:
                resp = self._idempotency_conflict(record, normalized, idem_key)
                return (DROP if drop_after else resp), None, drop_after or kind == "slow"
            release = self._releaser(record_key, record, request_id)

        # 4. Validation: a 400 that is not saved.
        invalid = self._validate(params)
        if invalid is not None:
            return (DROP if drop_after else invalid), release, drop_after or kind == "slow"

        # 5. Execution.
        if kind in ("500", "502", "504"):
            assert fault is not None
            if fault.apply:
                self._execute(params, api_key)
            return self._server_error(int(kind)), release, True
        resp = self._execute(params, api_key)
        if drop_after:
            # The event is applied (and the response saved under the key), but never sent.
            if release is not None:
                release(resp)
            return DROP, None, True
        return resp, release, kind == "slow"

    def _releaser(
        self, record_key: tuple[str, str], record: IdemRecord, request_id: str
    ) -> Callable[[Response | None], None]:
        """Return the function that saves the response under the key or frees the key."""

        def release(resp: Response | None) -> None:
            with self._lock:
                if self._idem.get(record_key) is not record:
                    return  # reset() cleared it meanwhile
                if resp is not None and resp.save:
                    record.status = resp.status
                    record.body = resp.body
                    record.request_id = request_id
                else:
                    del self._idem[record_key]

        return release

    def _idempotency_conflict(
        self, record: IdemRecord, normalized: tuple[tuple[str, str], ...], idem_key: str
    ) -> Response:
        """The answer when the key is already known: 409, 400 mismatch, or the replay."""
        with self._lock:
            status, body, original = record.status, record.body, record.request_id
            params = record.params
        if status is None:
            return self._key_in_use(idem_key)
        if params != normalized:
            return error(
                400,
                "idempotency_error",
                "Keys for idempotent requests can only be used with the same parameters they "
                f"were first used with. Try using a key other than '{idem_key}' if you meant "
                "to execute a different request.",
            )
        return Response(
            status,
            body,
            (("Idempotent-Replayed", "true"), ("Original-Request", original)),
            replayed=True,
        )

    def _validate(self, params: Mapping[str, str]) -> Response | None:
        """The synchronous 400 for ``params``, or ``None``: Stripe checks the rest after its
        200 (an unknown customer, a payload without the meter's keys)."""
        for name in params:
            if name not in _TOP_LEVEL_PARAMS and not _PAYLOAD_KEY_RE.fullmatch(name):
                return invalid(f"Received unknown parameter: {name}", param=name)
        event_name = params.get("event_name")
        if not event_name:
            return invalid("Missing required param: event_name.", param="event_name",
                           code="parameter_missing")
        if len(event_name) > MAX_EVENT_NAME_LENGTH:
            return invalid(f"Invalid event_name: must be at most {MAX_EVENT_NAME_LENGTH} "
                           "characters.", param="event_name")
        identifier = params.get("identifier")
        if identifier is not None and len(identifier) > MAX_IDENTIFIER_LENGTH:
            return invalid(f"Invalid identifier: must be at most {MAX_IDENTIFIER_LENGTH} "
                           "characters.", param="identifier")
        raw_ts = params.get("timestamp")
        if raw_ts is None or raw_ts == "":
            return invalid("Missing required param: timestamp.", param="timestamp",
                           code="parameter_missing")
        if not _INT_RE.fullmatch(raw_ts):
            return invalid(f"Invalid integer: {raw_ts}", param="timestamp",
                           code="parameter_invalid_integer")
        timestamp = int(raw_ts)
        now = self._clock()
        if timestamp < now - MAX_PAST_SECONDS:
            return invalid("The timestamp must be within the past 35 days.", param="timestamp",
                           code="timestamp_too_far_in_past")
        if timestamp > now + MAX_FUTURE_SECONDS:
            return invalid("The timestamp cannot be more than 5 minutes in the future.",
                           param="timestamp", code="timestamp_in_future")
        with self._lock:
            meter = self._meters.get(event_name)
        if meter is None or meter.status != "active":
            return invalid(f"No active meter was found for event_name '{event_name}'.",
                           param="event_name")
        value = params.get(f"payload[{meter.value_key}]")
        if value is not None and value != "":
            match = _VALUE_RE.fullmatch(value)
            name = f"payload[{meter.value_key}]"
            if match is None:
                return invalid(f"Invalid value for {name}: '{value}' is not a whole number.",
                               param=name, code="parameter_invalid_integer")
            if len(match.group(1).lstrip("0")) > MAX_VALUE_DIGITS:
                return invalid(f"Invalid value for {name}: '{value}' has more than "
                               f"{MAX_VALUE_DIGITS} significant digits.", param=name)
        return None

    def _execute(self, params: Mapping[str, str], api_key: str) -> Response:
        """Apply the event: a saved 200, or the (unsaved) duplicate-identifier 400. What Stripe
        checks only later is queued as an asynchronous error."""
        identifier = params.get("identifier") or "fake_" + secrets.token_hex(12)
        event_name = params["event_name"]
        timestamp = int(params["timestamp"])
        payload = {m.group(1): v for name, v in params.items()
                   if (m := _PAYLOAD_KEY_RE.fullmatch(name)) is not None}
        now = self._clock()
        with self._lock:
            meter = self._meters[event_name]
            customer = payload.get(meter.customer_key, "")
            value = payload.get(meter.value_key, "")
            first = self._accepted.get(identifier)
            expired = (first is not None and self.dedupe_seconds is not None
                       and now - first.received_at >= self.dedupe_seconds)
            duplicate = first is not None and not expired
            if duplicate:
                self._duplicates += 1
            else:
                self._take(AcceptedEvent(identifier=identifier, event_name=event_name,
                                         customer=customer, value=value, timestamp=timestamp,
                                         received_at=now, payload=payload),
                           self._later_check(meter, customer, value), again=first is not None)
        if duplicate:
            return invalid(f"{DUPLICATE_MESSAGE_PREFIX} {identifier}.")
        body = {
            "object": "billing.meter_event",
            "created": int(now),
            "event_name": event_name,
            "identifier": identifier,
            "livemode": api_key.startswith(("sk_live_", "rk_live_")),
            "payload": payload,
            "timestamp": timestamp,
        }
        return Response(200, to_json(body), save=True)

    def _enter_locked(self, lanes: Iterable[tuple[str, str]]) -> None:
        """A call starts (lock held): counted in flight, and on each of its lanes; a lane
        already busy counts an overlap."""
        self._in_flight += 1
        self._max_in_flight = max(self._max_in_flight, self._in_flight)
        for lane in lanes:
            running = self._lane_in_flight.get(lane, 0)
            if running:
                self._overlaps[lane] = self._overlaps.get(lane, 0) + 1
            self._lane_in_flight[lane] = running + 1

    def _leave_locked(self, lanes: Iterable[tuple[str, str]]) -> None:
        """The call of :meth:`_enter_locked` is answered (lock held)."""
        self._in_flight -= 1
        for lane in lanes:
            left = self._lane_in_flight.get(lane, 1) - 1
            if left > 0:
                self._lane_in_flight[lane] = left
            else:
                self._lane_in_flight.pop(lane, None)

    def _take(self, accepted: AcceptedEvent, problem: tuple[str, str] | None, *,
              again: bool, sample_names: str | None = None) -> None:
        """Count an accepted event (lock held): its asynchronous error if Stripe finds one
        after the 200 (its sample naming ``sample_names``, else the event's identifier), and
        a second acceptance once its dedupe window had passed."""
        accepted.named = sample_names or accepted.identifier
        if problem is not None:
            accepted.valid = False
            self._pending_errors.append(AsyncError(accepted.event_name, problem[0], problem[1],
                                                   accepted.named, accepted.received_at))
        if again:
            self._also_accepted.append(accepted)
        else:
            self._accepted[accepted.identifier] = accepted
        self._by_pair[(accepted.event_name, accepted.customer)].append(accepted)
        self._accept_count += 1

    def _refuse_received_since_locked(self, customer: str, since: float) -> int:
        """A customer deleted at ``since``, a time already past (lock held): the valid events
        of it received since then are refused as if checked at their receipt (each
        ``meter_event_customer_not_found``, reported with the next flush). How many."""
        refused = 0
        for (_, of), events in self._by_pair.items():
            if of != customer:
                continue
            for ev in events:
                if isinstance(ev, AcceptedEvent) and ev.valid and ev.received_at >= since:
                    ev.valid = False
                    refused += 1
                    self._pending_errors.append(AsyncError(
                        ev.event_name, "meter_event_customer_not_found",
                        self._not_found_message(customer), ev.named or ev.identifier,
                        ev.received_at))
        return refused

    def _not_found_message(self, customer: str) -> str:
        return (f"No such customer: '{customer}'." if self.customer_error_names_customer
                else "The customer of the event was not found.")

    def _later_check(self, meter: FakeMeter, customer: str, value: str
                     ) -> tuple[str, str] | None:
        """What Stripe finds wrong after its 200 (call with the lock held): the code and
        message of the error it will report, or None."""
        if not customer:
            return ("meter_event_no_customer_defined",
                    f"The event has no customer in payload key '{meter.customer_key}' that "
                    f"meter {meter.id} maps customers from.")
        if not value:
            return ("meter_event_invalid_value",
                    f"The event has no value in payload key '{meter.value_key}'.")
        if self._customer_state_locked(customer) != "active":  # as it is now, at receipt
            return ("meter_event_customer_not_found", self._not_found_message(customer))
        return None

    def _auth_error(self, status: int, api_key: str) -> Response:
        if status == 403:
            return error(
                403,
                "invalid_request_error",
                f"The provided key '{mask_key(api_key)}' does not have the required "
                "permissions for this endpoint on account 'acct_fake'.",
            )
        return error(
            401, "invalid_request_error", f"Invalid API Key provided: {mask_key(api_key)}"
        )

    def _key_in_use(self, idem_key: str) -> Response:
        return error(
            409,
            "invalid_request_error",
            "There is currently another in-progress request using this Idempotent Key (that "
            "probably means you submitted twice, and the other request is still going "
            f"through): {idem_key}. Please try again later.",
            code="idempotency_key_in_use",
        )

    def _server_error(self, status: int) -> Response:
        return error(status, "api_error", STATUS_MESSAGES[status], save=True)

    def _front_fault(self, fault: Fault, api_key: str, idem_key: str | None) -> Response:
        kind = fault.kind
        if kind in ("401", "403"):
            return self._auth_error(int(kind), api_key)
        if kind == "429":
            headers: tuple[tuple[str, str], ...] = ()
            if fault.retry_after is not None:
                headers = (("Retry-After", f"{fault.retry_after:g}"),)
            return error(
                429,
                "invalid_request_error",
                "Request rate limit exceeded. You can learn more about rate limits here "
                "https://stripe.com/docs/rate-limits.",
                code="rate_limit",
                headers=headers,
            )
        if kind == "503":
            return error(503, "api_error", STATUS_MESSAGES[503])
        if kind == "409":
            return self._key_in_use(idem_key or "")
        if kind == "400":
            return invalid("Invalid value for payload: refused (an injected fault).",
                           param="payload", code="parameter_invalid")
        return DROP  # drop_before
