"""The only module that imports ``stripe``: our verb in (send one meter event), a classified
outcome out (see STRIPE.md's table and ``webapp.outbox.states.Outcome``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any, NamedTuple, Protocol

import requests
import stripe
import urllib3

from .outbox.states import CallResult, Outcome

log = logging.getLogger(__name__)

DUPLICATE_IDENTIFIER_PREFIX = "An event already exists with identifier"
MAX_MESSAGE = 1000


class MeterEvent(NamedTuple):
    """Exactly what goes to ``POST /v1/billing/meter_events`` for one outbox event."""

    event_name: str
    stripe_customer_id: str
    value: int
    identifier: str
    occurred_at: datetime

    def params(self) -> dict[str, object]:
        return {
            "event_name": self.event_name,
            "payload": {"stripe_customer_id": self.stripe_customer_id, "value": str(self.value)},
            "identifier": self.identifier,
            "timestamp": int(self.occurred_at.timestamp()),
        }


class Gateway(Protocol):
    def send(self, event: MeterEvent, idempotency_key: str) -> CallResult: ...


class Urllib3Client(stripe.HTTPClient):
    """The SDK's HTTP client interface on one shared urllib3 pool.

    The SDK's default (requests) spends about as much CPU per call on its own machinery as on
    the call; urllib3, which requests uses underneath, does the same work directly. Thread-safe:
    one pool serves every sending thread. No retries here: the outbox decides them.
    """

    name = "urllib3"

    def __init__(self, connect_timeout: float, read_timeout: float, *,
                 proxy: str | None = None, pool_size: int = 64) -> None:
        super().__init__(verify_ssl_certs=True, proxy=proxy)
        options: dict[str, Any] = dict(num_pools=4, maxsize=pool_size, block=False, retries=False,
                       timeout=urllib3.Timeout(connect=connect_timeout, read=read_timeout),
                       cert_reqs="CERT_REQUIRED", ca_certs=stripe.ca_bundle_path)
        self._pool: urllib3.PoolManager = (urllib3.ProxyManager(proxy, **options) if proxy
                                           else urllib3.PoolManager(**options))
        self._proxied = bool(proxy)
        # scheme://host[:port] -> its connection pool. Every call goes to Stripe's one host:
        # looking its pool up by the URL's prefix spares parsing each URL and normalizing a
        # pool key for it (about a tenth of the worker's CPU per call).
        self._origins: dict[str, urllib3.HTTPConnectionPool] = {}

    def request(self, method: str, url: str, headers: Mapping[str, str] | None,
                post_data: Any = None, *, _usage: Any = None
                ) -> tuple[Any, int, Any]:  # the SDK decodes bytes as well as str
        try:
            if self._proxied:
                resp = self._pool.request(method.upper(), url, body=post_data,
                                          headers=dict(headers or {}), retries=False)
            else:
                origin, path = _split_origin(url)
                pool = self._origins.get(origin)
                if pool is None:
                    pool = self._origins.setdefault(origin, self._pool.connection_from_url(url))
                resp = pool.urlopen(method.upper(), path, body=post_data,
                                    headers=dict(headers or {}), retries=False, redirect=False,
                                    assert_same_host=False)
        except urllib3.exceptions.HTTPError as exc:
            raise stripe.APIConnectionError(  # type: ignore[no-untyped-call]
                "Unexpected error communicating with Stripe. "
                f"(Network error: {type(exc).__name__}: {exc})", should_retry=True) from exc
        return resp.data, resp.status, resp.headers

    def request_stream(self, method: str, url: str, headers: Mapping[str, str] | None,
                       post_data: Any = None, *, _usage: Any = None) -> Any:
        raise NotImplementedError("streaming is not used by billing-outbox")

    def close(self) -> None:
        self._pool.clear()


def _split_origin(url: str) -> tuple[str, str]:
    """``("https://api.stripe.com", "/v1/billing/meter_events")`` from the full URL."""
    start = url.find("://")
    slash = url.find("/", start + 3 if start >= 0 else 0)
    return (url, "/") if slash < 0 else (url[:slash], url[slash:])


class StripeGateway:
    """Sends meter events with the official SDK; never raises for a Stripe answer.

    The SDK's own retries are off (``max_network_retries=0``): the outbox retries, with the
    right idempotency key for each kind of failure, and one call never outlives the claim.
    """

    def __init__(self, api_key: str, *, api_base: str, timeout_seconds: float,
                 connect_timeout_seconds: float = 3.05, default_meter: str | None = None,
                 pool_size: int = 64) -> None:
        self._default_meter = default_meter
        self._base = api_base.rstrip("/")
        # Proxy settings are read from the environment once, here (requests would rescan
        # every environment variable on every call).
        proxies = requests.utils.get_environ_proxies(self._base)
        proxy = proxies.get("https" if self._base.startswith("https") else "http")
        http = Urllib3Client(connect_timeout_seconds, timeout_seconds, proxy=proxy,
                             pool_size=max(pool_size, 1))
        # The SDK's client telemetry puts the previous call's request id and latency (and
        # the platform) in a header of the next call. The outbox makes one small call per
        # event, up to 1,000 a second; building that header was several percent of the
        # worker's CPU per call, and nothing billing needs depends on it. (A module-level
        # switch: this module is the only one that imports ``stripe``.)
        stripe.enable_telemetry = False
        self._client = stripe.StripeClient(
            api_key,
            base_addresses={"api": self._base, "meter_events": self._base},
            max_network_retries=0,
            http_client=http,
        )

    def send(self, event: MeterEvent, idempotency_key: str) -> CallResult:
        try:
            created = self._client.v1.billing.meter_events.create(
                params=event.params(),  # type: ignore[arg-type]
                options={"idempotency_key": idempotency_key})
        except stripe.StripeError as exc:
            result = classify_error(exc)
            if (self._default_meter is not None and event.event_name == self._default_meter
                    and result.outcome is Outcome.PERMANENT and _no_such_meter(exc)):
                # The configured default meter (STRIPE_METER_EVENT_NAME) is missing or inactive:
                # every event on it would fail alike, so this is systemic (pause sending, touch
                # no event) rather than a dead letter per event; a probe resumes sending once
                # the meter exists. A missing meter named by one event alone stays permanent.
                return replace(result, outcome=Outcome.SYSTEMIC)
            return result
        response = getattr(created, "last_response", None)
        return CallResult(Outcome.DELIVERED, http_status=200,
                          request_id=getattr(response, "request_id", None))


def classify_error(exc: stripe.StripeError) -> CallResult:
    """Map an SDK error to an outcome class, by HTTP status first (an idempotency 409 and an
    idempotency 400 share one exception class)."""
    status = exc.http_status
    base = dict(http_status=status, error_class=type(exc).__name__, error_code=exc.code,
                message=_message(exc), request_id=exc.request_id)
    if isinstance(exc, stripe.APIConnectionError) or status is None:
        outcome = Outcome.NOT_EXECUTED if _never_sent(exc) else Outcome.UNKNOWN
        return CallResult(outcome, **base)  # type: ignore[arg-type]
    if status == 400:
        if str(base["message"]).startswith(DUPLICATE_IDENTIFIER_PREFIX):
            return CallResult(Outcome.DELIVERED, **base)  # type: ignore[arg-type]
        if isinstance(exc, stripe.IdempotencyError):
            log.error("Stripe idempotency_error: a retry changed its parameters (a bug): %s "
                      "(request %s)", base["message"], exc.request_id)
        return CallResult(Outcome.PERMANENT, **base)  # type: ignore[arg-type]
    if status in (401, 403, 404):
        return CallResult(Outcome.SYSTEMIC, **base)  # type: ignore[arg-type]
    if status in (409, 429, 503):
        return CallResult(Outcome.NOT_EXECUTED, retry_after=_retry_after(exc),
                          **base)  # type: ignore[arg-type]
    if status >= 500:
        # Stripe saved this answer under the key and would replay it: use a fresh key.
        return CallResult(Outcome.UNKNOWN, fresh_key=True, **base)  # type: ignore[arg-type]
    return CallResult(Outcome.PERMANENT, **base)  # type: ignore[arg-type]


def _no_such_meter(exc: stripe.StripeError) -> bool:
    """A 400 about ``event_name``: no active meter has it (the configured name's length and
    characters are checked at start-up, so nothing else about it can be wrong)."""
    if exc.http_status != 400 or isinstance(exc, stripe.IdempotencyError):
        return False
    if getattr(exc.error, "param", None) == "event_name":
        return True
    message = _message(exc).lower()
    return "no active meter" in message or "no such meter" in message


def _message(exc: stripe.StripeError) -> str:
    body = exc.json_body if isinstance(exc.json_body, dict) else {}
    err = body.get("error") if isinstance(body.get("error"), dict) else {}
    message = err.get("message") if err else None
    if not message:
        message = exc.user_message or str(exc) or type(exc).__name__
    return str(message)[:MAX_MESSAGE]


def _never_sent(exc: BaseException) -> bool:
    """True when the connection was refused or never established: the request did not leave."""
    seen: set[int] = set()
    stack: list[object] = [exc]
    while stack:
        item = stack.pop()
        if id(item) in seen or item is None:
            continue
        seen.add(id(item))
        name = type(item).__name__
        if name in ("ConnectionRefusedError", "NewConnectionError", "ConnectTimeout",
                    "ConnectTimeoutError"):
            return True
        if isinstance(item, BaseException):
            stack.extend([item.__cause__, item.__context__, getattr(item, "reason", None)])
            stack.extend(a for a in item.args if isinstance(a, BaseException))
    return False


def _retry_after(exc: stripe.StripeError) -> float | None:
    headers = exc.headers or {}
    raw = headers.get("Retry-After") or headers.get("retry-after")
    if raw is None:
        return None
    try:
        return max(0.0, min(float(raw), 3600.0))
    except ValueError:
        return None
