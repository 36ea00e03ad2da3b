"""The fake's HTTP side: responses, Stripe's error shapes, and the keep-alive server that
routes each request to the fake."""

from __future__ import annotations

import json
import logging
import re
import secrets
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from .fake import FakeStripe

_log = logging.getLogger("tests.support.fake_stripe")

METER_EVENTS_PATH = "/v1/billing/meter_events"
ADJUSTMENTS_PATH = "/v1/billing/meter_event_adjustments"
METERS_PATH = "/v1/billing/meters"
EVENTS_PATH = "/v2/core/events"
V1_EVENTS_PATH = "/v1/events"
CUSTOMERS_PATH = "/v1/customers"
SUBSCRIPTIONS_PATH = "/v1/subscriptions"
SUBSCRIPTION_ITEMS_PATH = "/v1/subscription_items"
INVOICES_PATH = "/v1/invoices"
STREAM_SESSION_PATH = "/v2/billing/meter_event_session"
STREAM_PATH = "/v2/billing/meter_event_stream"
CONTROL_PREFIX = "/_fake/"
MAX_BODY_BYTES = 1 << 20
_KEY_PREFIX_RE = re.compile(r"^[a-z]{2,4}_(?:test|live)_")
_SUMMARIES_RE = re.compile(r"^/v1/billing/meters/([^/]+)/event_summaries$")
_SUBSCRIPTION_RE = re.compile(r"^/v1/subscriptions/([^/]+)$")
_INVOICE_RE = re.compile(r"^/v1/invoices/([^/]+)$")
_INVOICE_LINES_RE = re.compile(r"^/v1/invoices/([^/]+)/lines$")


@dataclass
class Response:
    """A response to write: status, JSON body, extra headers; ``save`` marks it for the
    idempotency layer."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()
    save: bool = False
    replayed: bool = False


DROP = Response(status=0, body=b"")


def to_json(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def request_id() -> str:
    return "req_" + secrets.token_hex(7)


def error(status: int, type_: str, message: str, *, code: str | None = None,
          param: str | None = None, should_retry: bool | None = None,
          headers: Iterable[tuple[str, str]] = (), save: bool = False) -> Response:
    """Stripe's error body: ``{"error": {"type", "message", "code"?, "param"?}}``."""
    err: dict[str, str] = {"type": type_, "message": message}
    if code is not None:
        err["code"] = code
    if param is not None:
        err["param"] = param
    extra = list(headers)
    if should_retry is not None:
        extra.append(("Stripe-Should-Retry", "true" if should_retry else "false"))
    return Response(status, to_json({"error": err}), tuple(extra), save=save)


def invalid(message: str, *, param: str | None = None, code: str | None = None) -> Response:
    """A validation 400: never saved, and Stripe says not to retry it."""
    return error(400, "invalid_request_error", message, code=code, param=param,
                 should_retry=False)


def ok(obj: object) -> Response:
    return Response(200, to_json(obj))


def mask_key(key: str) -> str:
    """Mask an API key the way Stripe's error messages do: prefix and last four kept."""
    match = _KEY_PREFIX_RE.match(key)
    prefix = match.group(0) if match else ""
    rest = key[len(prefix):]
    if len(rest) <= 4:
        return prefix + "*" * len(rest)
    return prefix + "*" * (len(rest) - 4) + rest[-4:]


def bearer_key(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None


class Server(ThreadingHTTPServer):
    """ThreadingHTTPServer with daemon handler threads, a deep backlog and quiet errors."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], fake: FakeStripe, *, role: str = "all"
                 ) -> None:
        self.fake = fake
        #: ``all`` (every route on one port), ``api`` (every route but the meter event
        #: stream, as api.stripe.com) or ``meter_events`` (the stream alone, as
        #: meter-events.stripe.com). The control endpoints answer on every port.
        self.role = role
        super().__init__(address, Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Client disconnects are routine here (drops, timeouts, outages); log the rest."""
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            return
        _log.exception("fake_stripe: error while handling a request from %s", client_address)


class Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 keep-alive handler; the work is done by :class:`FakeStripe`."""

    protocol_version = "HTTP/1.1"
    server_version = "FakeStripe/1.0"
    disable_nagle_algorithm = True
    # Buffered writes: status line, headers and body leave in one flush.
    wbufsize = 64 * 1024
    server: Server

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

    def send_error(self, code: int, message: str | None = None, explain: str | None = None
                   ) -> None:
        """Protocol errors (bad request line, unsupported method) also get a JSON body."""
        self.close_connection = True
        short = message or self.responses.get(code, ("Error",))[0]
        self.send(error(code, "invalid_request_error", short))

    def version_string(self) -> str:
        """The ``Server`` header."""
        return self.server_version

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Silence the per-request access log."""

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        """Route POSTs: meter events (v1, and v2 streams with their sessions), adjustments, the
        control endpoints, else 404. What is due (periods, finalizations) is done first."""
        path = urlsplit(self.path).path
        fake = self.server.fake
        fake._hit(self.server.role, "POST", path)
        fake._track(self.connection, busy=True)
        try:
            body = self._read_body()
            if body is None:
                return
            # Before anything is accepted: an event received after a finalization moment
            # must find the invoice already finalized.
            fake.tick()
            role = self.server.role
            if (role == "meter_events" and path != STREAM_PATH
                    and not path.startswith(CONTROL_PREFIX)) or (
                    role == "api" and path == STREAM_PATH):
                self.send(self._not_found())
            elif path == METER_EVENTS_PATH:
                fake._serve_meter_event(self, body)
            elif path == STREAM_PATH:
                fake._serve_stream(self, body)
            elif path == STREAM_SESSION_PATH:
                self.send(fake._serve_stream_session(self))
            elif path == ADJUSTMENTS_PATH:
                req_id = request_id()
                self.send(fake._authorized(self, lambda: fake._serve_adjustment(body, req_id)),
                          req_id)
            elif path.startswith(CONTROL_PREFIX):
                self.send(fake._control("POST", path[len(CONTROL_PREFIX):], body))
            else:
                self.send(self._not_found())
        finally:
            fake._track(self.connection, busy=False)

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        """Route GETs: meters, their summaries, v2 events, v1 events (customers deleted),
        customers, subscriptions and their items, invoices and their lines, the control
        endpoints. What is due is done first."""
        parts = urlsplit(self.path)
        path, query = parts.path, parts.query
        if self._read_body() is None:
            return
        fake = self.server.fake
        fake._hit(self.server.role, "GET", path)
        fake.tick()
        summaries = _SUMMARIES_RE.match(path)
        subscription = _SUBSCRIPTION_RE.match(path)
        invoice = _INVOICE_RE.match(path)
        lines = _INVOICE_LINES_RE.match(path)
        if self.server.role == "meter_events" and not path.startswith(CONTROL_PREFIX):
            self.send(self._not_found())
        elif path == METERS_PATH:
            self.send(fake._authorized(self, lambda: fake._serve_meter_list(query)))
        elif summaries is not None:
            meter_id = summaries.group(1)
            self.send(fake._authorized(self, lambda: fake._serve_summaries(meter_id, query)))
        elif path == EVENTS_PATH:
            self.send(fake._authorized(self, lambda: fake._serve_event_list(query)))
        elif path == V1_EVENTS_PATH:
            self.send(fake._authorized(self, lambda: fake._serve_v1_event_list(query)))
        elif path == CUSTOMERS_PATH:
            self.send(fake._authorized(self, lambda: fake._serve_customer_list(query)))
        elif path.startswith(CUSTOMERS_PATH + "/") and path.count("/") == 3:
            customer_id = path[len(CUSTOMERS_PATH) + 1:]
            self.send(fake._authorized(self, lambda: fake._serve_customer(customer_id)))
        elif path.startswith(EVENTS_PATH + "/"):
            event_id = path[len(EVENTS_PATH) + 1:]
            self.send(fake._authorized(self, lambda: fake._serve_event(event_id)))
        elif path == SUBSCRIPTIONS_PATH:
            self.send(fake._authorized(self, lambda: fake._serve_subscription_list(query)))
        elif subscription is not None:
            sub_id = subscription.group(1)
            self.send(fake._authorized(self, lambda: fake._serve_subscription(sub_id)))
        elif path == SUBSCRIPTION_ITEMS_PATH:
            self.send(fake._authorized(self, lambda: fake._serve_subscription_items(query)))
        elif path == INVOICES_PATH:
            self.send(fake._authorized(self, lambda: fake._serve_invoice_list(query)))
        elif invoice is not None:
            invoice_id = invoice.group(1)
            self.send(fake._authorized(self, lambda: fake._serve_invoice(invoice_id)))
        elif lines is not None:
            lines_of = lines.group(1)
            self.send(fake._authorized(self, lambda: fake._serve_invoice_lines(lines_of, query)))
        elif path.startswith(CONTROL_PREFIX):
            self.send(fake._control("GET", path[len(CONTROL_PREFIX):], b""))
        else:
            self.send(self._not_found())

    def do_DELETE(self) -> None:  # noqa: N802 - stdlib naming
        """Nothing is deletable here."""
        if self._read_body() is None:
            return
        self.server.fake.tick()
        self.send(self._not_found())

    def _not_found(self) -> Response:
        path = urlsplit(self.path).path
        return error(404, "invalid_request_error",
                     f"Unrecognized request URL ({self.command}: {path}). Please see "
                     "https://stripe.com/docs or we can help at https://support.stripe.com/.")

    def _read_body(self) -> bytes | None:
        raw_length = self.headers.get("Content-Length", "0") or "0"
        try:
            length = int(raw_length)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY_BYTES:
            self.close_connection = True
            self.send(error(400, "invalid_request_error", "Invalid Content-Length."))
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

    def send(self, resp: Response, req_id: str | None = None) -> None:
        """Write ``resp`` (with a ``Request-Id``) and flush it to the socket."""
        resp, req_id = self.server.fake._poisoned(resp, req_id)
        self.send_response(resp.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(resp.body)))
        self.send_header("Request-Id", req_id or request_id())
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
