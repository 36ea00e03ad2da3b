"""The only module that imports ``stripe``: our verb in (send one meter event), a classified
outcome out (see STRIPE.md's table and ``webapp.outbox.states.Outcome``)."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Protocol

import requests
import stripe

from .outbox.states import CallResult, Outcome

log = logging.getLogger(__name__)

DUPLICATE_IDENTIFIER_PREFIX = "An event already exists with identifier"
MAX_MESSAGE = 1000


@dataclass(frozen=True)
class MeterEvent:
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


class StripeGateway:
    """Sends meter events with the official SDK; never raises for a Stripe answer.

    The SDK's own retries are off (``max_network_retries=0``): the outbox retries, with the
    right idempotency key for each kind of failure, and one call never outlives the claim.
    """

    def __init__(self, api_key: str, *, api_base: str, timeout_seconds: float,
                 connect_timeout_seconds: float = 3.05, default_meter: str | None = None) -> None:
        self._api_key = api_key
        self._default_meter = default_meter
        self._base = api_base.rstrip("/")
        self._timeout = (connect_timeout_seconds, timeout_seconds)
        # Proxy settings are read from the environment once, here: requests would otherwise
        # rescan every environment variable on every call (a third of a call's CPU time).
        proxies = requests.utils.get_environ_proxies(self._base)
        self._proxy = {k: v for k, v in proxies.items() if k in ("http", "https")} or None
        self._local = threading.local()

    def _client(self) -> stripe.StripeClient:
        """One client, HTTP session and connection pool per sending thread."""
        client = getattr(self._local, "client", None)
        if client is None:
            session = requests.Session()
            session.trust_env = False
            client = stripe.StripeClient(
                self._api_key,
                base_addresses={"api": self._base, "meter_events": self._base},
                max_network_retries=0,
                http_client=stripe.RequestsClient(timeout=self._timeout, session=session,
                                                  proxy=self._proxy),  # type: ignore[arg-type]
            )
            self._local.client = client
        return client

    def send(self, event: MeterEvent, idempotency_key: str) -> CallResult:
        try:
            created = self._client().v1.billing.meter_events.create(
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
