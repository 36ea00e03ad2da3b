"""Stripe's errors, classified into the outbox's outcomes (the table in docs/stripe.md)."""

from __future__ import annotations

import logging

import stripe

from ..outbox.states import CallResult, Outcome

log = logging.getLogger(__name__)

DUPLICATE_IDENTIFIER_PREFIX = "An event already exists with identifier"
MAX_MESSAGE = 1000


def stripe_code(exc: stripe.StripeError) -> str | None:
    """Stripe's error code. The SDK fills ``exc.code`` only for invalid-request and card
    errors; the code of every other error (429, 409, 401…) is on ``exc.error.code``."""
    error = getattr(exc, "error", None)
    code = getattr(error, "code", None) if error is not None else None
    return str(code) if code else (str(exc.code) if exc.code else None)


def classify_error(exc: stripe.StripeError) -> CallResult:
    """Map an SDK error to an outcome class. The exception's class comes first where it says
    more than the status (a rate limit answered with a 400 is still a rate limit), then the
    status (an idempotency 409 and an idempotency 400 share one class)."""
    status = exc.http_status
    code = stripe_code(exc)
    base = dict(http_status=status, error_class=type(exc).__name__, error_code=code,
                message=_message(exc), request_id=exc.request_id)
    if isinstance(exc, stripe.APIConnectionError) or status is None:
        outcome = Outcome.NOT_EXECUTED if _never_sent(exc) else Outcome.UNKNOWN
        return CallResult(outcome, **base)  # type: ignore[arg-type]
    if isinstance(exc, stripe.RateLimitError) or code == "rate_limit":
        # Not executed, whatever the status: Stripe's older form of the answer is a 400.
        return CallResult(Outcome.NOT_EXECUTED, retry_after=_retry_after(exc),
                          **base)  # type: ignore[arg-type]
    if status == 400:
        if str(base["message"]).startswith(DUPLICATE_IDENTIFIER_PREFIX):
            return CallResult(Outcome.DELIVERED, **base)  # type: ignore[arg-type]
        if isinstance(exc, stripe.IdempotencyError):
            log.error("Stripe idempotency_error: a retry changed its parameters (a bug): %s "
                      "(request %s)", base["message"], exc.request_id)
        elif no_such_meter(exc):
            # The meter is missing or inactive: the event waits for it, untouched.
            return CallResult(Outcome.METER_MISSING, **base)  # type: ignore[arg-type]
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


def no_such_meter(exc: stripe.StripeError) -> bool:
    """A 400 about ``event_name``: no active meter has it."""
    if exc.http_status != 400 or isinstance(exc, stripe.IdempotencyError):
        return False
    error = getattr(exc, "error", None)
    if getattr(error, "param", None) == "event_name":
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
