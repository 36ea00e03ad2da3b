"""A loopback HTTP fake of Stripe's billing API, standard library only: meter events (v1, and
v2 meter event streams with their sessions: ``stream.py``), meters, meter event summaries and
adjustments, customers (``customers``: listed with their metadata, for the tenant sync),
subscriptions with metered items, their billing periods, trials, pauses and cancellations, and
the invoices Stripe makes of them: the first one at creation, a draft at a period's end
finalized after a grace period, a final one at a cancellation; paid, voided, marked
uncollectible, failing to finalize or deleted by hand (``subscriptions``), and the v2 events
that report errors found after a 200 or an invoice's or a subscription's change (listed, read
in full, or pushed signed to an event destination).

The real ``stripe`` SDK is pointed at it (``base_addresses={"api": fake.base_url, ...}``) and
sees what it would see from Stripe (Stripe's documented behaviour, summarized in
``docs/stripe.md``, is the spec this follows):

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
* Meter event streams (``stream.py``): sessions, forced token expiry, the same faults and
  latency, one accepted set with v1 (an identifier accepted by either is taken once), every
  check but the request's shape made after the 200 and reported like v1's later checks.
* Adjustments (``type=cancel``) answered ``pending`` without an ``id``, as Stripe documents the
  v1 object, unless a test asks otherwise (:meth:`FakeStripe.answer_adjustments`).
* Subscriptions and invoices (``subscriptions.py``): periods roll, trials end and drafts
  finalize on the injected clock, lazily: :meth:`FakeStripe.tick` does what is due, and every
  request calls it before anything else (so an event received after a finalization moment is
  on no invoice); an aggregation lag (:meth:`FakeStripe.set_aggregation_lag`) makes an event
  received just before a finalization miss it, as Stripe's asynchronous aggregation can.
* Observation: accepted events (v1's and the streams'), adjustments made with the answer each
  got, call counts, and the number of times a call for a (customer, event_name) lane started
  while another call of that lane was still in flight; Stripe allows one concurrent call per
  customer per meter.

Order of the checks for one request: auth, the front faults (401, 403, 429, 503, 409,
``drop_before``), the idempotency layer (replay, mismatch, in use), validation, execution (the
500/502/504 faults, the identifier check, the accept), then the latency/``slow`` sleep with the
idempotency key still held, then the response is saved under the key and written (or, for
``drop``, the connection is closed instead).

Stripe's checks after its 200 (an unknown customer, a payload without the meter's keys) are
queued and reported by :meth:`FakeStripe.flush_reports` (or every ``report_every`` seconds),
one ``v1.billing.meter.error_report_triggered`` event per meter with at most
``sample_limit`` samples per code. Summaries count valid, uncancelled events that a test
has not made Stripe lose (:meth:`FakeStripe.forget`), and :meth:`FakeStripe.add_usage`;
identifier dedupe lasts ``dedupe_seconds`` (None: for ever).

Run as a process (``python -m tests.support.fake_stripe --port 12111``) it prints
``READY http://127.0.0.1:PORT`` and serves until SIGTERM; the ``/_fake/`` control endpoints
(``GET state``, ``invoices``, ``subscriptions``; ``POST faults``, ``fail_next``, ``latency``,
``reset``, ``meters``, ``auth_failure``, ``stripe_customers``, ``forget``, ``subscriptions``
(with ``trial_seconds`` and ``first_invoice``), ``tick``, ``finalize_invoice``, ``pay_invoice``,
``void_invoice``, ``mark_uncollectible``, ``fail_finalization``, ``delete_draft``,
``pause_subscription``, ``resume_subscription``, ``cancel_subscription`` (with
``invoice_now``), ``list_latency``, ``aggregation_lag``, ``pushed_types``, each taking a JSON
object) let another process drive it. They need no auth, are served in-process too, and are
not counted as calls.

A call counts as in flight for its lane from right after its body is parsed until just before
its response is written; the latency and ``slow`` sleeps happen while in flight.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import random
import signal
import socket
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from types import FrameType, TracebackType
from typing import Any

from .billing import BillingMixin, Usage
from .customers import CustomersMixin
from .faults import Fault, FaultsMixin, RandomFaults
from .http import Response, Server, error, to_json
from .meter_events import AcceptedEvent, AsyncError, FakeMeter, IdemRecord, MeterEventsMixin
from .reports import ReportsMixin
from .stream import StreamMixin
from .subscriptions import DEFAULT_GRACE_SECONDS, SubscriptionsMixin

__all__ = ["AcceptedEvent", "FakeStripe", "main"]

_log = logging.getLogger("tests.support.fake_stripe")

#: request_log() keeps at most this many entries (the oldest are dropped first).
REQUEST_LOG_LIMIT = 200_000


@dataclasses.dataclass(frozen=True)
class Poison:
    """Hostile values every answer carries (see :meth:`FakeStripe.poison`)."""

    request_id: str | None = None
    code: str | None = None
    message: str | None = None


class FakeStripe(FaultsMixin, MeterEventsMixin, StreamMixin, BillingMixin, CustomersMixin,
                 ReportsMixin, SubscriptionsMixin):
    """A fake of Stripe's billing API on a loopback port. Thread-safe.

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
        customers: Iterable[str] | None = None,
        page_cap: int = 100,
        sample_limit: int = 3,
        dedupe_seconds: float | None = None,
        report_every: float | None = None,
        separate_streams: bool = False,
        grace_seconds: int = DEFAULT_GRACE_SECONDS,
    ) -> None:
        if latency < 0:
            raise ValueError("latency must be >= 0")
        self.host = host
        self._requested_port = port
        self._port: int | None = None
        #: Streams on a port of their own, as Stripe serves them on a host of its own.
        self.separate_streams = separate_streams
        self._streams_port: int | None = None
        self._initial_meters = frozenset(meters)
        self._initial_latency = float(latency)
        self._clock = clock
        self._seed = seed
        self._valid_key_prefixes = tuple(valid_key_prefixes)

        self._lock = threading.Lock()
        self._meters: dict[str, FakeMeter] = {}
        self._meter_seq = 0
        self._initial_customers = None if customers is None else frozenset(customers)
        self._customers: set[str] | None = (None if customers is None
                                            else set(self._initial_customers or ()))
        self.page_cap = page_cap
        self.sample_limit = sample_limit
        self.dedupe_seconds = dedupe_seconds
        self.summary_delay = 0.0
        self.events_newest_first = False
        self.summary_calls = 0
        self._usage: list[Usage] = []
        self._adjustment_answer: tuple[str, bool | str] = ("pending", False)
        self._adjustments: list[dict[str, Any]] = []
        self._stripe_customers: dict[str, dict[str, Any]] = {}
        self.customer_list_calls = 0
        self.customer_lookups: dict[str, int] = {}
        self._pending_errors: list[AsyncError] = []
        self._events: dict[str, dict[str, Any]] = {}
        self._webhook: tuple[str, str] | None = None
        self._also_accepted: list[AcceptedEvent] = []
        #: Every accepted event and added usage by (event name, customer): what summaries read.
        self._by_pair: defaultdict[tuple[str, str], list[AcceptedEvent | Usage]] = \
            defaultdict(list)
        for name in self._initial_meters:
            self.add_meter(name)
        self._report_every = report_every
        self._reporter: threading.Thread | None = None
        self._latency = self._initial_latency
        self._rng = random.Random(seed)
        self._queued: deque[Fault] = deque()
        self._targeted: dict[str, Fault] = {}
        self._random: RandomFaults | None = None
        self._auth_failure: int | None = None
        self._poison: Poison | None = None

        self._accepted: dict[str, AcceptedEvent] = {}
        self._accept_count = 0
        self._calls = 0
        self._duplicates = 0
        self._overlaps: dict[tuple[str, str], int] = {}
        self._lane_in_flight: dict[tuple[str, str], int] = {}
        self._in_flight = 0
        self._max_in_flight = 0
        self._log: deque[dict[str, Any]] = deque(maxlen=REQUEST_LOG_LIMIT)
        self._hits: deque[tuple[str, str, str]] = deque(maxlen=REQUEST_LOG_LIMIT)
        self._idem: dict[tuple[str, str], IdemRecord] = {}
        self._stream_init()
        #: The grace period of invoices' drafts (seconds), unless a subscription names one.
        self._initial_grace_seconds = int(grace_seconds)
        self._subscriptions_init()

        # Server lifecycle (start/stop/outage) is serialised by its own lock.
        self._server_lock = threading.Lock()
        self._server: Server | None = None
        self._thread: threading.Thread | None = None
        self._streams_server: Server | None = None
        self._streams_thread: threading.Thread | None = None
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

    @property
    def meter_events_url(self) -> str:
        """The ``meter_events`` base address: with ``separate_streams``, a port that serves
        ``POST /v2/billing/meter_event_stream`` alone (Stripe's meter-events host), while
        :attr:`base_url` answers 404 to it (as api.stripe.com does); else :attr:`base_url`."""
        if not self.separate_streams:
            return self.base_url
        if self._streams_port is None:
            raise RuntimeError("FakeStripe is not started")
        return f"http://{self.host}:{self._streams_port}"

    def start(self) -> FakeStripe:
        """Bind and serve in a daemon thread. Returns ``self``."""
        with self._server_lock:
            if self._server is not None or self._outage:
                raise RuntimeError("FakeStripe is already started")
            self._stopped = False
            port = self._port if self._port is not None else self._requested_port
            self._listen(port)
            if self._report_every and self._reporter is None:
                self._reporter = threading.Thread(target=self._report_loop, daemon=True,
                                                  name="fake-stripe-reports")
                self._reporter.start()
        return self

    def _report_loop(self) -> None:
        while not self._stopped:
            time.sleep(self._report_every or 1.0)
            if not self._stopped:
                self.flush_reports()

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
        if self.separate_streams:
            server, thread = self._serve(self._streams_port or 0, "meter_events")
            self._streams_port = server.server_address[1]
            self._streams_server, self._streams_thread = server, thread
        server, thread = self._serve(port, "api" if self.separate_streams else "all")
        self._port = server.server_address[1]
        self._server, self._thread = server, thread

    def _serve(self, port: int, role: str) -> tuple[Server, threading.Thread]:
        server = Server((self.host, port), self, role=role)
        thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-stripe-{server.server_address[1]}",
            daemon=True,
        )
        thread.start()
        return server, thread

    def _unlisten(self) -> None:
        for server, thread in ((self._server, self._thread),
                               (self._streams_server, self._streams_thread)):
            if server is None:
                continue
            server.shutdown()
            server.server_close()
            if thread is not None:
                thread.join(timeout=5)
        self._server = self._thread = None
        self._streams_server = self._streams_thread = None

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

    def also_accepted(self) -> list[AcceptedEvent]:
        """Events accepted again under an identifier whose dedupe window had passed."""
        with self._lock:
            return list(self._also_accepted)

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

    def hits(self) -> list[tuple[str, str, str]]:
        """(port's role, method, path) of every request received but the control endpoints',
        oldest first: ``api`` or ``meter_events`` with ``separate_streams``, else ``all``."""
        with self._lock:
            return list(self._hits)

    def _hit(self, role: str, method: str, path: str) -> None:
        if not path.startswith("/_fake/"):
            with self._lock:
                self._hits.append((role, method, path))

    def reset(self) -> None:
        """Back to the as-constructed state: events, counters, idempotency records, log, faults,
        auth failure, latency, meters, subscriptions, invoices, the grace period, the list
        latency, the aggregation lag (0), the pushed event types and the RNG seed. The listener
        and an outage are left as they are; calls in flight finish normally."""
        with self._lock:
            self._meters = {}
            self._customers = (None if self._initial_customers is None
                               else set(self._initial_customers))
            self._usage.clear()
            self._adjustment_answer = ("pending", False)
            self._adjustments.clear()
            self._stripe_customers.clear()
            self.customer_list_calls = 0
            self.customer_lookups = {}
            self.customer_error_names_customer = True
            self._pending_errors.clear()
            self._events.clear()
            self._also_accepted.clear()
            self._by_pair.clear()
            self.summary_calls = 0
            self.summary_delay = 0.0
            self.events_newest_first = False
            self._latency = self._initial_latency
            self._rng = random.Random(self._seed)
            self._queued.clear()
            self._targeted.clear()
            self._random = None
            self._auth_failure = None
            self._poison = None
            self._accepted.clear()
            self._accept_count = 0
            self._calls = 0
            self._duplicates = 0
            self._overlaps.clear()
            self._max_in_flight = self._in_flight
            self._log.clear()
            self._hits.clear()
            self._idem.clear()
            # Sessions already issued stay valid (a client holding one keeps using it).
            tokens = self._stream_tokens
            self._stream_init()
            self._stream_tokens = tokens
            self._subscriptions_init()
        for name in self._initial_meters:
            self.add_meter(name)

    # ------------------------------------------------------------------ configuration

    def set_latency(self, seconds: float) -> None:
        """Every meter-event call sleeps this long (while in flight) before it is answered."""
        if seconds < 0:
            raise ValueError("latency must be >= 0")
        with self._lock:
            self._latency = float(seconds)

    def add_customer(self, customer: str) -> None:
        """Make ``customer`` known (once any is known, unknown ones are reported later)."""
        with self._lock:
            if self._customers is None:
                self._customers = set()
            self._customers.add(customer)

    def poison(self, *, request_id: str | None = None, code: str | None = None,
               message: str | None = None) -> None:
        """Answer with hostile values until :meth:`reset` (or a call with none): every answer
        of every route carries ``request_id`` as its ``Request-Id`` header; every error body
        carries ``code`` and ``message`` instead of its own (so a 400, a 429 or a 500 keeps
        its status and type, and the SDK its class). Values are sent as given: a code of 300
        characters, emoji, a NUL or a lone surrogate (both JSON-escaped, as Stripe's JSON
        would carry them)."""
        with self._lock:
            self._poison = (Poison(request_id, code, message)
                            if any(v is not None for v in (request_id, code, message))
                            else None)

    def _poisoned(self, resp: Response, req_id: str | None) -> tuple[Response, str | None]:
        """``resp`` and its request id as :meth:`poison` says to answer them."""
        with self._lock:
            poison = self._poison
        if poison is None:
            return resp, req_id
        if poison.request_id is not None:
            req_id = poison.request_id
        if resp.status >= 400 and (poison.code is not None or poison.message is not None):
            body = json.loads(resp.body)
            err = body.get("error") if isinstance(body, dict) else None
            if isinstance(err, dict):
                if poison.code is not None:
                    err["code"] = poison.code
                if poison.message is not None:
                    err["message"] = poison.message
                resp = dataclasses.replace(resp, body=to_json(body))
        return resp, req_id

    def set_auth_failure(self, status: int | None) -> None:
        """Answer every meter-event call with 401 or 403 until called with ``None``."""
        if status not in (None, 401, 403):
            raise ValueError("status must be 401, 403 or None")
        with self._lock:
            self._auth_failure = status

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
                "events": len(self._events),
                "summary_calls": self.summary_calls,
                "stream_calls": self._stream_calls,
                "stream_sessions": self._stream_sessions,
                "stream_duplicates": self._stream_duplicates,
                "subscriptions": len(self._subs),
                "invoices": len(self._invoices),
                "subscription_list_calls": self.subscription_list_calls,
                "invoice_list_calls": self.invoice_list_calls,
                "invoice_retrieve_calls": self.invoice_retrieve_calls,
                "invoice_line_calls": self.invoice_line_calls,
            }

    def _control(self, method: str, name: str, body: bytes) -> Response:
        """Serve ``/_fake/<name>``; arguments come as a JSON object body."""
        if method == "GET":
            if name == "state":
                return Response(200, to_json(self.state()))
            if name == "invoices":
                return Response(200, to_json({"invoices": self.invoices()}))
            if name == "subscriptions":
                return Response(200, to_json({"subscriptions": self.subscriptions()}))
            return error(404, "invalid_request_error", f"No control endpoint GET {name}.")
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
                window = args.get("event_time_window")
                self.add_meter(str(args["event_name"]),
                               event_time_window=None if window is None else str(window))
            elif name == "auth_failure":
                self.set_auth_failure(args.get("status"))
            elif name == "customers":
                self.add_customer(str(args["customer"]))
            elif name == "stripe_customers":
                self.create_customer(args.get("id"), name=args.get("name"),
                                     metadata=args.get("metadata"),
                                     deleted=bool(args.get("deleted")))
            elif name == "expire_stream_tokens":
                self.expire_stream_tokens()
            elif name == "flush_reports":
                return Response(200, to_json({"events": self.flush_reports()}))
            elif name == "report":
                return Response(200, to_json({"event": self.report_errors([AsyncError(
                    str(args["event_name"]), str(args["code"]), str(args["message"]),
                    str(args["identifier"]))])}))
            elif name == "forget":
                return Response(200, to_json({"forgotten": self.forget(
                    str(args["customer"]), str(args["event_name"]), str(args["day"]),
                    keep=int(args.get("keep", 0)))}))
            elif name == "delete_customer":
                return Response(200, to_json({"event": self.delete_customer(
                    str(args["id"]), at=None if args.get("at") is None else float(args["at"]))}))
            elif name == "subscriptions":
                return self._control_subscriptions(args)
            elif name == "tick":
                self.tick()  # (the request already did what was due, as every request does)
            elif name in ("finalize_invoice", "pay_invoice", "void_invoice",
                          "mark_uncollectible", "fail_finalization"):
                act = {"finalize_invoice": self.finalize_invoice, "pay_invoice": self.pay_invoice,
                       "void_invoice": self.void_invoice,
                       "mark_uncollectible": self.mark_uncollectible,
                       "fail_finalization": self.fail_finalization}[name]
                return Response(200, to_json({"invoice": act(str(args["id"]))}))
            elif name == "delete_draft":
                return Response(200, to_json(self.delete_draft(str(args["id"]))))
            elif name in ("pause_subscription", "resume_subscription"):
                change = (self.pause_subscription if name == "pause_subscription"
                          else self.resume_subscription)
                return Response(200, to_json({"subscription": change(str(args["id"]))}))
            elif name == "cancel_subscription":
                final = self.cancel_subscription(str(args["id"]),
                                                 invoice_now=bool(args.get("invoice_now", False)))
                return Response(200, to_json({"ok": True, "invoice": final}))
            elif name == "list_latency":
                self.set_list_latency(float(args["seconds"]))
            elif name == "aggregation_lag":
                self.set_aggregation_lag(float(args["seconds"]))
            elif name == "pushed_types":
                types = args.get("types")
                self.set_pushed_types(None if types is None else [str(t) for t in types])
            else:
                return error(404, "invalid_request_error", f"No control endpoint POST {name}.")
        except (TypeError, ValueError, KeyError) as exc:
            return error(400, "invalid_request_error", f"Bad control request: {exc!r}")
        return Response(200, to_json({"ok": True}))

    def _control_subscriptions(self, args: dict[str, Any]) -> Response:
        """``POST /_fake/subscriptions``: ``customer`` (answers ``{"id"}``) or ``customers``
        (``{"ids"}``), ``meters``, ``period_start``, ``period_seconds``, ``grace_seconds``,
        ``licensed``, ``status``, ``trial_seconds``, ``first_invoice``."""
        seconds, grace = args.get("period_seconds"), args.get("grace_seconds")
        trial = args.get("trial_seconds")
        options: dict[str, Any] = {
            "period_start": int(args["period_start"]),
            "period_seconds": None if seconds is None else int(seconds),
            "grace_seconds": None if grace is None else int(grace),
            "licensed": bool(args.get("licensed", False)),
            "status": str(args.get("status", "active")),
            "trial_seconds": None if trial is None else int(trial),
            "first_invoice": bool(args.get("first_invoice", False))}
        meters = [str(m) for m in args.get("meters", ["api_requests"])]
        if "customers" in args:
            ids = self.create_subscriptions([str(c) for c in args["customers"]], meters,
                                            **options)
            return Response(200, to_json({"ids": ids}))
        return Response(200, to_json({"id": self.create_subscription(
            str(args["customer"]), meters, **options)}))


def main(argv: list[str] | None = None) -> int:
    """Serve a fake until SIGTERM/SIGINT; print ``READY <base_url>`` once listening."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.fake_stripe",
        description="Loopback fake of Stripe's billing API.",
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
    parser.add_argument("--report-every", type=float, default=None,
                        help="report the errors found after a 200 every N seconds")
    parser.add_argument("--separate-streams", action="store_true",
                        help="serve meter event streams on a port of their own (printed "
                             "after the API's on the READY line), as Stripe does on a host "
                             "of its own")
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
        report_every=args.report_every,
        separate_streams=args.separate_streams,
    )
    fake.start()
    try:
        ready = f"READY {fake.base_url}"
        if args.separate_streams:
            ready += f" {fake.meter_events_url}"
        print(ready, flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        fake.stop()
    return 0
