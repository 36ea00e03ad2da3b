"""A loopback HTTP fake of Stripe's ``POST /v1/billing/meter_events``, standard library only.

The real ``stripe`` SDK is pointed at it (``base_addresses={"api": fake.base_url, ...}``) and
sees what it would see from Stripe (``/work/shared/STRIPE.md`` is the spec this follows):

* Bearer-key auth (401 for a missing key or one without a known prefix).
* Validation 400s (``invalid_request_error``, ``Stripe-Should-Retry: false``, never saved under
  the idempotency key): unknown meter, missing customer, a value that is not a whole number of at
  most 15 significant digits, an identifier over 100 characters, a missing or out-of-range
  timestamp (35 days back, 5 minutes ahead, judged by the injected clock).
* Identifier dedupe: a second event with an accepted identifier is a 400 whose message is exactly
  ``An event already exists with identifier <id>.`` (no code, ``Stripe-Should-Retry: false``).
* An idempotency layer keyed by (API key, ``Idempotency-Key``): once execution began, the status
  and body are saved and replayed (``Idempotent-Replayed: true``) for the same params, including
  500/502/504; different params are a 400 ``idempotency_error``; a request while the first one
  is still executing is a 409 ``idempotency_key_in_use``. 409, 429, 503, validation 400s and the
  duplicate-identifier 400 are not saved.
* Faults: queued (:meth:`FakeStripe.fail_next`) and random from a seeded RNG
  (:meth:`FakeStripe.set_faults`), a refused-connection outage on the same port
  (:meth:`FakeStripe.set_outage`) and a switch that answers 401/403 to everything.
* Observation: accepted events, call counts, and the number of times a call for a
  (customer, event_name) lane started while another call of that lane was still in flight;
  Stripe allows one concurrent call per customer per meter.

Order of the checks for one request: auth, the front faults (401, 403, 429, 503, 409,
``drop_before``), the idempotency layer (replay, mismatch, in use), validation, execution (the
500/502/504 faults, the identifier check, the accept), then the latency/``slow`` sleep with the
idempotency key still held, then the response is saved under the key and written (or, for
``drop``, the connection is closed instead).

Run as a process (``python -m tests.support.fake_stripe --port 12111``) it prints
``READY http://127.0.0.1:PORT`` and serves until SIGTERM; the ``/_fake/`` control endpoints
(``GET state``; ``POST faults``, ``fail_next``, ``latency``, ``reset``, ``meters``,
``auth_failure``, each taking a JSON object) let another process drive it. They need no auth,
are served in-process too, and are not counted as calls.

A call counts as in flight for its lane from right after its body is parsed until just before
its response is written; the latency and ``slow`` sleeps happen while in flight.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import random
import re
import secrets
import signal
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType, TracebackType
from typing import Any
from urllib.parse import parse_qsl, urlsplit

__all__ = ["AcceptedEvent", "FakeStripe", "main"]

_log = logging.getLogger(__name__)

METER_EVENTS_PATH = "/v1/billing/meter_events"
CONTROL_PREFIX = "/_fake/"

MAX_PAST_SECONDS = 35 * 24 * 3600
MAX_FUTURE_SECONDS = 5 * 60
MAX_IDENTIFIER_LENGTH = 100
MAX_EVENT_NAME_LENGTH = 100
MAX_VALUE_DIGITS = 15
MAX_BODY_BYTES = 1 << 20
#: request_log() keeps at most this many entries (the oldest are dropped first).
REQUEST_LOG_LIMIT = 200_000

DUPLICATE_MESSAGE_PREFIX = "An event already exists with identifier"

#: Every kind :meth:`FakeStripe.fail_next` accepts.
FAULT_KINDS = frozenset(
    {"500", "502", "504", "503", "409", "429", "drop", "drop_before", "slow", "401", "403"}
)
_OUTCOME_UNKNOWN_STATUSES = frozenset({500, 502, 504})
_FRONT_FAULTS = frozenset({"401", "403", "429", "503", "409", "drop_before"})
_FAULT_KWARGS: dict[str, frozenset[str]] = {
    "500": frozenset({"apply"}),
    "502": frozenset({"apply"}),
    "504": frozenset({"apply"}),
    "429": frozenset({"retry_after"}),
    "slow": frozenset({"seconds"}),
}

_VALUE_RE = re.compile(r"-?([0-9]+)")
_INT_RE = re.compile(r"-?[0-9]+")
_PAYLOAD_KEY_RE = re.compile(r"payload\[([^\[\]]+)\]")
_TOP_LEVEL_PARAMS = frozenset({"event_name", "identifier", "timestamp"})
_KEY_PREFIX_RE = re.compile(r"^[a-z]{2,4}_(?:test|live)_")

_STATUS_MESSAGES = {
    500: "An unknown error occurred while processing the request.",
    502: "Bad gateway: the upstream service did not answer in time.",
    503: "The service is temporarily unavailable. Please try again later.",
    504: "Gateway timeout while processing the request.",
}


@dataclass(frozen=True)
class AcceptedEvent:
    """One meter event the fake accepted (the first one for its identifier)."""

    identifier: str
    event_name: str
    customer: str
    value: str
    timestamp: int
    received_at: float


@dataclass(frozen=True)
class _Fault:
    """One fault to apply to one request."""

    kind: str
    apply: bool = False
    retry_after: float | None = None
    seconds: float = 0.0


@dataclass(frozen=True)
class _RandomFaults:
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


@dataclass
class _Response:
    """A response to write: status, JSON body, extra headers; ``save`` marks it for the
    idempotency layer."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()
    save: bool = False
    replayed: bool = False


class _IdemRecord:
    """What the idempotency layer holds for one (api key, idempotency key)."""

    __slots__ = ("params", "status", "body", "request_id")

    def __init__(self, params: tuple[tuple[str, str], ...]) -> None:
        self.params = params
        self.status: int | None = None  # None while the first request is executing
        self.body = b""
        self.request_id = ""


_DROP = _Response(status=0, body=b"")


def _json(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _request_id() -> str:
    return "req_" + secrets.token_hex(7)


def _error(
    status: int,
    type_: str,
    message: str,
    *,
    code: str | None = None,
    param: str | None = None,
    should_retry: bool | None = None,
    headers: Iterable[tuple[str, str]] = (),
    save: bool = False,
) -> _Response:
    err: dict[str, str] = {"type": type_, "message": message}
    if code is not None:
        err["code"] = code
    if param is not None:
        err["param"] = param
    extra = list(headers)
    if should_retry is not None:
        extra.append(("Stripe-Should-Retry", "true" if should_retry else "false"))
    return _Response(status, _json({"error": err}), tuple(extra), save=save)


def _invalid(message: str, *, param: str | None = None, code: str | None = None) -> _Response:
    """A validation 400: never saved, and Stripe says not to retry it."""
    return _error(400, "invalid_request_error", message, code=code, param=param, should_retry=False)


def _mask_key(key: str) -> str:
    """Mask an API key the way Stripe's error messages do: prefix and last four kept."""
    match = _KEY_PREFIX_RE.match(key)
    prefix = match.group(0) if match else ""
    rest = key[len(prefix) :]
    if len(rest) <= 4:
        return prefix + "*" * len(rest)
    return prefix + "*" * (len(rest) - 4) + rest[-4:]


def _bearer_key(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None


def _fault_name(fault: _Fault | None) -> str | None:
    return None if fault is None else fault.kind


class _Server(ThreadingHTTPServer):
    """ThreadingHTTPServer with daemon handler threads, a deep backlog and quiet errors."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], fake: FakeStripe) -> None:
        self.fake = fake
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Client disconnects are routine here (drops, timeouts, outages); log the rest."""
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            return
        _log.exception("fake_stripe: error while handling a request from %s", client_address)


class _Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 keep-alive handler; the work is done by :class:`FakeStripe`."""

    protocol_version = "HTTP/1.1"
    server_version = "FakeStripe/1.0"
    disable_nagle_algorithm = True
    # Buffered writes: status line, headers and body leave in one flush.
    wbufsize = 64 * 1024
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.fake._track(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass
        finally:
            self.server.fake._untrack(self.connection)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Protocol errors (bad request line, unsupported method) also get a JSON body."""
        self.close_connection = True
        short = message or self.responses.get(code, ("Error",))[0]
        self.send(_error(code, "invalid_request_error", short))

    def version_string(self) -> str:
        """The ``Server`` header."""
        return self.server_version

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Silence the per-request access log."""

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        """Route POSTs: the meter-event endpoint, the control endpoints, else 404."""
        path = urlsplit(self.path).path
        fake = self.server.fake
        fake._track(self.connection, busy=True)
        try:
            self._route_post(path)
        finally:
            fake._track(self.connection, busy=False)

    def _route_post(self, path: str) -> None:
        body = self._read_body()
        if body is None:
            return
        fake = self.server.fake
        if path == METER_EVENTS_PATH:
            fake._serve_meter_event(self, body)
        elif path.startswith(CONTROL_PREFIX):
            self.send(fake._control("POST", path[len(CONTROL_PREFIX) :], body))
        else:
            self.send(self._not_found())

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        """Route GETs: only ``/_fake/state`` exists."""
        path = urlsplit(self.path).path
        if self._read_body() is None:
            return
        if path.startswith(CONTROL_PREFIX):
            self.send(self.server.fake._control("GET", path[len(CONTROL_PREFIX) :], b""))
        else:
            self.send(self._not_found())

    def do_DELETE(self) -> None:  # noqa: N802 - stdlib naming
        """Nothing is deletable here."""
        if self._read_body() is None:
            return
        self.send(self._not_found())

    def _not_found(self) -> _Response:
        path = urlsplit(self.path).path
        return _error(
            404,
            "invalid_request_error",
            f"Unrecognized request URL ({self.command}: {path}). Please see "
            "https://stripe.com/docs or we can help at https://support.stripe.com/.",
        )

    def _read_body(self) -> bytes | None:
        raw_length = self.headers.get("Content-Length", "0") or "0"
        try:
            length = int(raw_length)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY_BYTES:
            self.close_connection = True
            self.send(_error(400, "invalid_request_error", "Invalid Content-Length."))
            return None
        body = self.rfile.read(length) if length else b""
        if len(body) < length:
            # The connection was cut (or its read side shut down by an outage) before the whole
            # body arrived: a real server never saw this request and cannot answer it. Without
            # this, a truncated body was validated or compared with a saved idempotency record,
            # and the client, which had sent a complete request, got a 400 for it.
            self.close_connection = True
            return None
        return body

    def send(self, resp: _Response, request_id: str | None = None) -> None:
        """Write ``resp`` (with a ``Request-Id``) and flush it to the socket."""
        self.send_response(resp.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(resp.body)))
        self.send_header("Request-Id", request_id or _request_id())
        headers = getattr(self, "headers", None)  # absent when the request line was bad
        if headers is not None:
            version = headers.get("Stripe-Version")
            if version:
                self.send_header("Stripe-Version", version)
            idem_key = headers.get("Idempotency-Key")
            if idem_key:
                self.send_header("Idempotency-Key", idem_key)
        for name, value in resp.headers:
            self.send_header(name, value)
        if self.server.fake._outage:
            self.close_connection = True
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(resp.body)
        self.wfile.flush()


class FakeStripe:
    """A fake of Stripe's meter-event endpoint on a loopback port. Thread-safe.

    Use it as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        meters: Iterable[str] = ("api_requests",),
        latency: float = 0.0,
        clock: Callable[[], float] = time.time,
        seed: int = 0,
        valid_key_prefixes: Iterable[str] = ("sk_test_", "rk_test_", "sk_live_", "rk_live_"),
    ) -> None:
        if latency < 0:
            raise ValueError("latency must be >= 0")
        self.host = host
        self._requested_port = port
        self._port: int | None = None
        self._initial_meters = frozenset(meters)
        self._initial_latency = float(latency)
        self._clock = clock
        self._seed = seed
        self._valid_key_prefixes = tuple(valid_key_prefixes)

        self._lock = threading.Lock()
        self._meters: set[str] = set(self._initial_meters)
        self._latency = self._initial_latency
        self._rng = random.Random(seed)
        self._queued: deque[_Fault] = deque()
        self._random: _RandomFaults | None = None
        self._auth_failure: int | None = None

        self._accepted: dict[str, AcceptedEvent] = {}
        self._accept_count = 0
        self._calls = 0
        self._duplicates = 0
        self._overlaps: dict[tuple[str, str], int] = {}
        self._lane_in_flight: dict[tuple[str, str], int] = {}
        self._in_flight = 0
        self._max_in_flight = 0
        self._log: deque[dict[str, Any]] = deque(maxlen=REQUEST_LOG_LIMIT)
        self._idem: dict[tuple[str, str], _IdemRecord] = {}

        # Server lifecycle (start/stop/outage) is serialised by its own lock.
        self._server_lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._outage = False
        self._stopped = False
        self._conns_lock = threading.Lock()
        self._conns: dict[socket.socket, bool] = {}

    # ------------------------------------------------------------------ lifecycle

    @property
    def port(self) -> int:
        """The bound port (fixed at :meth:`start`, kept across outages)."""
        if self._port is None:
            raise RuntimeError("FakeStripe is not started")
        return self._port

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT``: give it to the SDK as the ``api`` base address."""
        return f"http://{self.host}:{self.port}"

    def start(self) -> FakeStripe:
        """Bind and serve in a daemon thread. Returns ``self``."""
        with self._server_lock:
            if self._server is not None or self._outage:
                raise RuntimeError("FakeStripe is already started")
            self._stopped = False
            port = self._port if self._port is not None else self._requested_port
            self._listen(port)
        return self

    def stop(self) -> None:
        """Stop serving, close the listening socket and every open connection."""
        with self._server_lock:
            self._stopped = True
            self._outage = False
            self._unlisten()
            self._sever(graceful=False)

    def __enter__(self) -> FakeStripe:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def set_outage(self, on: bool) -> None:
        """``True``: close the listening socket (connects are refused) and the open connections
        (after any response in progress); ``False``: listen again on the same port."""
        with self._server_lock:
            if self._port is None or self._stopped:
                raise RuntimeError("FakeStripe is not started")
            if on == self._outage:
                return
            if on:
                self._outage = True
                self._unlisten()
                # Idle keep-alive connections are closed now, so the client's pool sees them
                # dropped and reconnects (refused); a request being answered still gets its
                # response (with "Connection: close").
                self._sever(graceful=True)
            else:
                self._listen(self._port)
                self._outage = False

    def _listen(self, port: int) -> None:
        server = _Server((self.host, port), self)
        self._port = server.server_address[1]
        thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-stripe-{self._port}",
            daemon=True,
        )
        self._server, self._thread = server, thread
        thread.start()

    def _unlisten(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def _track(self, conn: socket.socket, busy: bool = False) -> None:
        """Record an open connection and whether a request on it is being answered."""
        with self._conns_lock:
            self._conns[conn] = busy

    def _untrack(self, conn: socket.socket) -> None:
        with self._conns_lock:
            self._conns.pop(conn, None)

    def _sever(self, *, graceful: bool) -> None:
        """Shut the open connections down. ``graceful``: a connection whose request is being
        answered only loses its read side (the response still goes out, then it closes)."""
        with self._conns_lock:
            conns = list(self._conns.items())
        for conn, busy in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RD if graceful and busy else socket.SHUT_RDWR)

    # ------------------------------------------------------------------ observation

    def accepted(self) -> dict[str, AcceptedEvent]:
        """Identifier -> the first accepted event with it (a snapshot)."""
        with self._lock:
            return dict(self._accepted)

    def accept_count(self) -> int:
        """How many events were accepted (duplicates and replays not counted)."""
        with self._lock:
            return self._accept_count

    def calls(self) -> int:
        """Every POST received on the meter-event route, whatever its outcome."""
        with self._lock:
            return self._calls

    def duplicate_identifier_rejections(self) -> int:
        """How many 400 "An event already exists with identifier" answers were produced."""
        with self._lock:
            return self._duplicates

    def overlaps(self) -> dict[tuple[str, str], int]:
        """(customer, event_name) -> how many calls started while another call of the same lane
        was still in flight (Stripe allows one concurrent call per customer per meter)."""
        with self._lock:
            return dict(self._overlaps)

    def max_in_flight(self) -> int:
        """The most meter-event calls in flight at once."""
        with self._lock:
            return self._max_in_flight

    def request_log(self) -> list[dict[str, Any]]:
        """One dict per meter-event request, oldest first: ``identifier``, ``idempotency_key``,
        ``status`` (``None`` for a dropped connection or a request still in flight), ``lane``,
        ``started``/``ended`` (``time.monotonic()``), ``fault`` (kind or ``None``),
        ``fault_applied``, ``replayed``, ``request_id``."""
        with self._lock:
            return [dict(entry) for entry in self._log]

    def reset(self) -> None:
        """Back to the as-constructed state: events, counters, idempotency records, log, faults,
        auth failure, latency, meters and the RNG seed. The listener and an outage are left as
        they are; calls in flight finish normally."""
        with self._lock:
            self._meters = set(self._initial_meters)
            self._latency = self._initial_latency
            self._rng = random.Random(self._seed)
            self._queued.clear()
            self._random = None
            self._auth_failure = None
            self._accepted.clear()
            self._accept_count = 0
            self._calls = 0
            self._duplicates = 0
            self._overlaps.clear()
            self._max_in_flight = self._in_flight
            self._log.clear()
            self._idem.clear()

    # ------------------------------------------------------------------ configuration

    def set_latency(self, seconds: float) -> None:
        """Every meter-event call sleeps this long (while in flight) before it is answered."""
        if seconds < 0:
            raise ValueError("latency must be >= 0")
        with self._lock:
            self._latency = float(seconds)

    def add_meter(self, event_name: str) -> None:
        """Make ``event_name`` an active meter."""
        with self._lock:
            self._meters.add(event_name)

    def set_auth_failure(self, status: int | None) -> None:
        """Answer every meter-event call with 401 or 403 until called with ``None``."""
        if status not in (None, 401, 403):
            raise ValueError("status must be 401, 403 or None")
        with self._lock:
            self._auth_failure = status

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
        if not statuses or not set(statuses) <= _OUTCOME_UNKNOWN_STATUSES:
            raise ValueError("error_5xx_statuses must be a non-empty subset of (500, 502, 504)")
        if slow_seconds < 0 or (retry_after is not None and retry_after < 0):
            raise ValueError("durations must be >= 0")
        config = _RandomFaults(
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
        fault = _Fault(
            kind=kind,
            apply=bool(kw.get("apply", False)),
            retry_after=None if retry_after is None else float(retry_after),
            seconds=seconds,
        )
        with self._lock:
            self._queued.extend([fault] * count)

    def _next_fault_locked(self) -> _Fault | None:
        """Pop a queued fault, else draw a random one. Call with ``self._lock`` held."""
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
            return _Fault("429", retry_after=cfg.retry_after)
        edge += cfg.unavailable_rate
        if pick < edge:
            return _Fault("503")
        edge += cfg.error_5xx_rate
        if pick < edge:
            statuses = cfg.error_5xx_statuses
            status = statuses[min(int(status_draw * len(statuses)), len(statuses) - 1)]
            return _Fault(str(status), apply=apply_draw < cfg.apply_before_5xx_rate)
        edge += cfg.drop_response_rate
        if pick < edge:
            return _Fault("drop")
        if slow_draw < cfg.slow_rate:
            return _Fault("slow", seconds=cfg.slow_seconds)
        return None

    # ------------------------------------------------------------------ the endpoint

    def _serve_meter_event(self, handler: _Handler, raw: bytes) -> None:
        """Answer one ``POST /v1/billing/meter_events``."""
        try:
            pairs = parse_qsl(raw.decode("utf-8"), keep_blank_values=True)
        except (UnicodeDecodeError, ValueError):
            pairs = []
        params = dict(pairs)
        customer = params.get("payload[stripe_customer_id]")
        event_name = params.get("event_name")
        lane = (customer, event_name) if customer and event_name else None
        idem_key = handler.headers.get("Idempotency-Key") or None
        request_id = _request_id()
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
            "request_id": request_id,
            # The SDK's client telemetry header, which the gateway turns off.
            "client_telemetry": handler.headers.get("X-Stripe-Client-Telemetry") is not None,
        }
        with self._lock:
            self._calls += 1
            fault = self._next_fault_locked()
            self._in_flight += 1
            if self._in_flight > self._max_in_flight:
                self._max_in_flight = self._in_flight
            if lane is not None:
                running = self._lane_in_flight.get(lane, 0)
                if running:
                    self._overlaps[lane] = self._overlaps.get(lane, 0) + 1
                self._lane_in_flight[lane] = running + 1
            latency = self._latency
            entry["fault"] = _fault_name(fault)
            self._log.append(entry)

        resp: _Response | None = None
        release: Callable[[_Response | None], None] | None = None
        fault_applied = False
        settled = False

        def settle() -> None:
            # Runs just before the response is written (or the connection dropped), so that a
            # client can never see the answer while its call still counts as in flight: a
            # sequential caller on another connection must not be counted as an overlap.
            nonlocal settled
            settled = True
            with self._lock:
                self._in_flight -= 1
                if lane is not None:
                    left = self._lane_in_flight.get(lane, 1) - 1
                    if left > 0:
                        self._lane_in_flight[lane] = left
                    else:
                        self._lane_in_flight.pop(lane, None)
                entry["ended"] = time.monotonic()
                entry["status"] = None if resp is None or resp is _DROP else resp.status
                entry["fault_applied"] = fault_applied
                entry["replayed"] = resp is not None and resp.replayed
                if entry["identifier"] is None and resp is not None and resp.status == 200:
                    entry["identifier"] = json.loads(resp.body).get("identifier")

        try:
            resp, release, fault_applied = self._process(
                handler, pairs, params, idem_key, request_id, fault
            )
            delay = latency + (fault.seconds if fault is not None and fault.kind == "slow" else 0)
            if delay > 0:
                time.sleep(delay)
            if release is not None:
                release(resp)
                release = None
            settle()
            if resp is _DROP:
                handler.close_connection = True
            else:
                handler.send(resp, request_id)
        finally:
            if release is not None:  # an exception before the response was settled
                release(None)
            if not settled:
                settle()

    def _process(
        self,
        handler: _Handler,
        pairs: list[tuple[str, str]],
        params: Mapping[str, str],
        idem_key: str | None,
        request_id: str,
        fault: _Fault | None,
    ) -> tuple[_Response, Callable[[_Response | None], None] | None, bool]:
        """Decide the response. Returns (response or ``_DROP``, the idempotency-record release
        to call once the response is settled, whether the fault took effect)."""
        kind = fault.kind if fault is not None else None
        drop_after = kind == "drop"

        # 1. Authentication (before everything, like Stripe's edge).
        api_key = _bearer_key(handler.headers.get("Authorization"))
        with self._lock:
            auth_failure = self._auth_failure
        if auth_failure is not None:
            key = api_key or ""
            return self._auth_error(auth_failure, key), None, False
        if api_key is None:
            return (
                _error(
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
        if kind in _FRONT_FAULTS:
            assert fault is not None
            return self._front_fault(fault, api_key, idem_key), None, True

        # 3. The idempotency layer.
        release: Callable[[_Response | None], None] | None = None
        if idem_key is not None:
            record_key = (api_key, idem_key)
            normalized = tuple(sorted(pairs))
            with self._lock:
                record = self._idem.get(record_key)
                if record is None:
                    record = _IdemRecord(normalized)
                    self._idem[record_key] = record
                    owned = True
                else:
                    owned = False
            if not owned:
                resp = self._idempotency_conflict(record, normalized, idem_key)
                return (_DROP if drop_after else resp), None, drop_after or kind == "slow"
            release = self._releaser(record_key, record, request_id)

        # 4. Validation: a 400 that is not saved.
        invalid = self._validate(params)
        if invalid is not None:
            return (_DROP if drop_after else invalid), release, drop_after or kind == "slow"

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
            return _DROP, None, True
        return resp, release, kind == "slow"

    def _releaser(
        self, record_key: tuple[str, str], record: _IdemRecord, request_id: str
    ) -> Callable[[_Response | None], None]:
        """Return the function that saves the response under the key or frees the key."""

        def release(resp: _Response | None) -> None:
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
        self, record: _IdemRecord, normalized: tuple[tuple[str, str], ...], idem_key: str
    ) -> _Response:
        """The answer when the key is already known: 409, 400 mismatch, or the replay."""
        with self._lock:
            status, body, original = record.status, record.body, record.request_id
            params = record.params
        if status is None:
            return self._key_in_use(idem_key)
        if params != normalized:
            return _error(
                400,
                "idempotency_error",
                "Keys for idempotent requests can only be used with the same parameters they "
                f"were first used with. Try using a key other than '{idem_key}' if you meant "
                "to execute a different request.",
            )
        return _Response(
            status,
            body,
            (("Idempotent-Replayed", "true"), ("Original-Request", original)),
            replayed=True,
        )

    def _validate(self, params: Mapping[str, str]) -> _Response | None:
        """Return the validation 400 for ``params``, or ``None`` if they are acceptable."""
        for name in params:
            if name not in _TOP_LEVEL_PARAMS and not _PAYLOAD_KEY_RE.fullmatch(name):
                return _invalid(f"Received unknown parameter: {name}", param=name)
        event_name = params.get("event_name")
        if not event_name:
            return _invalid(
                "Missing required param: event_name.", param="event_name", code="parameter_missing"
            )
        if not params.get("payload[stripe_customer_id]"):
            return _invalid(
                "Missing required param: payload[stripe_customer_id].",
                param="payload[stripe_customer_id]",
                code="parameter_missing",
            )
        value = params.get("payload[value]")
        if value is None or value == "":
            return _invalid(
                "Missing required param: payload[value].",
                param="payload[value]",
                code="parameter_missing",
            )
        match = _VALUE_RE.fullmatch(value)
        if match is None:
            return _invalid(
                f"Invalid value for payload[value]: '{value}' is not a whole number.",
                param="payload[value]",
                code="parameter_invalid_integer",
            )
        if len(match.group(1).lstrip("0")) > MAX_VALUE_DIGITS:
            return _invalid(
                f"Invalid value for payload[value]: '{value}' has more than {MAX_VALUE_DIGITS} "
                "significant digits.",
                param="payload[value]",
            )
        identifier = params.get("identifier")
        if identifier is not None and len(identifier) > MAX_IDENTIFIER_LENGTH:
            return _invalid(
                f"Invalid identifier: must be at most {MAX_IDENTIFIER_LENGTH} characters.",
                param="identifier",
            )
        if len(event_name) > MAX_EVENT_NAME_LENGTH:
            return _invalid(
                f"Invalid event_name: must be at most {MAX_EVENT_NAME_LENGTH} characters.",
                param="event_name",
            )
        raw_ts = params.get("timestamp")
        if raw_ts is None or raw_ts == "":
            return _invalid(
                "Missing required param: timestamp.", param="timestamp", code="parameter_missing"
            )
        if not _INT_RE.fullmatch(raw_ts):
            return _invalid(
                f"Invalid integer: {raw_ts}", param="timestamp", code="parameter_invalid_integer"
            )
        timestamp = int(raw_ts)
        now = self._clock()
        if timestamp < now - MAX_PAST_SECONDS:
            return _invalid(
                "The timestamp must be within the past 35 days.",
                param="timestamp",
                code="timestamp_too_far_in_past",
            )
        if timestamp > now + MAX_FUTURE_SECONDS:
            return _invalid(
                "The timestamp cannot be more than 5 minutes in the future.",
                param="timestamp",
                code="timestamp_too_far_in_future",
            )
        with self._lock:
            known = event_name in self._meters
        if not known:
            return _invalid(
                f"No active meter was found for event_name '{event_name}'.", param="event_name"
            )
        return None

    def _execute(self, params: Mapping[str, str], api_key: str) -> _Response:
        """Apply the event: a saved 200, or the (unsaved) duplicate-identifier 400."""
        identifier = params.get("identifier") or "fake_" + secrets.token_hex(12)
        event_name = params["event_name"]
        customer = params["payload[stripe_customer_id]"]
        value = params["payload[value]"]
        timestamp = int(params["timestamp"])
        now = self._clock()
        with self._lock:
            duplicate = identifier in self._accepted
            if duplicate:
                self._duplicates += 1
            else:
                self._accepted[identifier] = AcceptedEvent(
                    identifier=identifier,
                    event_name=event_name,
                    customer=customer,
                    value=value,
                    timestamp=timestamp,
                    received_at=now,
                )
                self._accept_count += 1
        if duplicate:
            return _invalid(f"{DUPLICATE_MESSAGE_PREFIX} {identifier}.")
        payload = {}
        for name, val in params.items():
            match = _PAYLOAD_KEY_RE.fullmatch(name)
            if match is not None:
                payload[match.group(1)] = val
        body = {
            "object": "billing.meter_event",
            "created": int(now),
            "event_name": event_name,
            "identifier": identifier,
            "livemode": api_key.startswith(("sk_live_", "rk_live_")),
            "payload": payload,
            "timestamp": timestamp,
        }
        return _Response(200, _json(body), save=True)

    # ------------------------------------------------------------------ canned errors

    def _auth_error(self, status: int, api_key: str) -> _Response:
        if status == 403:
            return _error(
                403,
                "invalid_request_error",
                f"The provided key '{_mask_key(api_key)}' does not have the required "
                "permissions for this endpoint on account 'acct_fake'.",
            )
        return _error(
            401, "invalid_request_error", f"Invalid API Key provided: {_mask_key(api_key)}"
        )

    def _key_in_use(self, idem_key: str) -> _Response:
        return _error(
            409,
            "invalid_request_error",
            "There is currently another in-progress request using this Idempotent Key (that "
            "probably means you submitted twice, and the other request is still going "
            f"through): {idem_key}. Please try again later.",
            code="idempotency_key_in_use",
        )

    def _server_error(self, status: int) -> _Response:
        return _error(status, "api_error", _STATUS_MESSAGES[status], save=True)

    def _front_fault(self, fault: _Fault, api_key: str, idem_key: str | None) -> _Response:
        kind = fault.kind
        if kind in ("401", "403"):
            return self._auth_error(int(kind), api_key)
        if kind == "429":
            headers: tuple[tuple[str, str], ...] = ()
            if fault.retry_after is not None:
                headers = (("Retry-After", f"{fault.retry_after:g}"),)
            return _error(
                429,
                "invalid_request_error",
                "Request rate limit exceeded. You can learn more about rate limits here "
                "https://stripe.com/docs/rate-limits.",
                code="rate_limit",
                headers=headers,
            )
        if kind == "503":
            return _error(503, "api_error", _STATUS_MESSAGES[503])
        if kind == "409":
            return self._key_in_use(idem_key or "")
        return _DROP  # drop_before

    # ------------------------------------------------------------------ control endpoints

    def state(self) -> dict[str, Any]:
        """The JSON-able snapshot served at ``GET /_fake/state``."""
        with self._lock:
            return {
                "accepted": [
                    {
                        "identifier": ev.identifier,
                        "event_name": ev.event_name,
                        "customer": ev.customer,
                        "value": ev.value,
                        "timestamp": ev.timestamp,
                    }
                    for ev in self._accepted.values()
                ],
                "accept_count": self._accept_count,
                "calls": self._calls,
                "overlaps": [
                    {"customer": customer, "event_name": event_name, "count": count}
                    for (customer, event_name), count in self._overlaps.items()
                ],
                "max_in_flight": self._max_in_flight,
                "in_flight": self._in_flight,
                "duplicate_identifier_rejections": self._duplicates,
            }

    def _control(self, method: str, name: str, body: bytes) -> _Response:
        """Serve ``/_fake/<name>``; arguments come as a JSON object body."""
        if method == "GET":
            if name == "state":
                return _Response(200, _json(self.state()))
            return _error(404, "invalid_request_error", f"No control endpoint GET {name}.")
        try:
            args = json.loads(body) if body.strip() else {}
            if not isinstance(args, dict):
                raise ValueError("the body must be a JSON object")
            if name == "faults":
                self.set_faults(**args)
            elif name == "fail_next":
                self.fail_next(**args)
            elif name == "latency":
                self.set_latency(float(args["seconds"]))
            elif name == "reset":
                self.reset()
            elif name == "meters":
                self.add_meter(str(args["event_name"]))
            elif name == "auth_failure":
                self.set_auth_failure(args.get("status"))
            else:
                return _error(404, "invalid_request_error", f"No control endpoint POST {name}.")
        except (TypeError, ValueError, KeyError) as exc:
            return _error(400, "invalid_request_error", f"Bad control request: {exc!r}")
        return _Response(200, _json({"ok": True}))


def main(argv: list[str] | None = None) -> int:
    """Serve a fake until SIGTERM/SIGINT; print ``READY <base_url>`` once listening."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.fake_stripe",
        description="Loopback fake of Stripe's POST /v1/billing/meter_events.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=12111)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per call")
    parser.add_argument(
        "--meter",
        action="append",
        default=None,
        help="an active meter's event_name (repeatable; default api_requests)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    fake = FakeStripe(
        args.host,
        args.port,
        meters=tuple(args.meter or ("api_requests",)),
        latency=args.latency,
        seed=args.seed,
    )
    fake.start()
    try:
        print(f"READY {fake.base_url}", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        fake.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
