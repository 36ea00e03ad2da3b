"""The HTTP ingest API: ``POST /api/v1/usage`` with a bearer token (``billing-outbox tokens``).

Not in the producer's transaction, and safe to retry: each event carries the producer's own
idempotency key. A batch is 1 to 1,000 events (at most 1 MiB); each gets its own result, in
the order sent. What is wrong with the request as a whole is answered as
``application/problem+json`` (RFC 9457). No session cookie is read and no CSRF token is
asked for: the token is the only credential here, and a session alone is refused."""

from __future__ import annotations

import json
import math
import threading
import time
from typing import Any

from flask import Blueprint, Response, request

from ..outbox.ingest import ingest
from ..outbox.tokens import Token, find_token, mark_used
from .common import now, svc

bp = Blueprint("api", __name__)

MAX_EVENTS = 1000
MAX_BYTES = 1 << 20
#: How often a token's "last used" time is written at most (per serving process).
MARK_EVERY = 60.0
PROBLEM = "application/problem+json"


def problem(status: int, title: str, detail: str, **headers: str) -> Response:
    """An RFC 9457 problem document."""
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail}
    resp = Response(json.dumps(body), status=status, mimetype=PROBLEM)
    for name, value in headers.items():
        resp.headers[name.replace("_", "-")] = value
    return resp


class _Buckets:
    """A token bucket per token, in this process: ``rate`` requests a second, bursts of
    twice that."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: dict[int, tuple[float, float]] = {}
        self._marked: dict[int, float] = {}

    def take(self, token: Token) -> float:
        """0 when the request may go; else the seconds until one may."""
        rate, burst = token.rate_per_second, max(1.0, 2 * token.rate_per_second)
        t = time.monotonic()
        with self._lock:
            level, at = self._state.get(token.id, (burst, t))
            level = min(burst, level + (t - at) * rate)
            if level >= 1.0:
                self._state[token.id] = (level - 1.0, t)
                return 0.0
            self._state[token.id] = (level, t)
            return (1.0 - level) / rate

    def should_mark(self, token_id: int) -> bool:
        t = time.monotonic()
        with self._lock:
            if t - self._marked.get(token_id, -math.inf) < MARK_EVERY:
                return False
            self._marked[token_id] = t
            return True


BUCKETS = _Buckets()


def _authorized() -> Token | Response:
    header = request.headers.get("Authorization", "")
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        return problem(401, "Unauthorized", "Send an ingest token: Authorization: Bearer <token> "
                       "(billing-outbox tokens create NAME).",
                       WWW_Authenticate='Bearer realm="billing-outbox"')
    token = find_token(svc().engine, presented.strip())
    if token is None:
        return problem(401, "Unauthorized", "This token is not known here.",
                       WWW_Authenticate='Bearer realm="billing-outbox", error="invalid_token"')
    if not token.active:
        return problem(403, "Forbidden", f"The token {token.name!r} was revoked.")
    if "ingest" not in token.scopes:
        return problem(403, "Forbidden", f"The token {token.name!r} has no ingest scope.")
    return token


@bp.get("/api/openapi.json")
def openapi() -> Response:
    """The API described as OpenAPI 3.1."""
    from .openapi import document

    return Response(json.dumps(document(MAX_EVENTS, MAX_BYTES)), mimetype="application/json")


@bp.post("/api/v1/usage")
def ingest_usage() -> Response:
    token = _authorized()
    if isinstance(token, Response):
        return token
    wait = BUCKETS.take(token)
    if wait > 0:
        return problem(429, "Too Many Requests",
                       f"The token {token.name!r} may make {token.rate_per_second:g} requests "
                       "a second; try again after the time in Retry-After.",
                       Retry_After=str(max(1, math.ceil(wait))))
    if request.mimetype != "application/json":
        return problem(415, "Unsupported Media Type",
                       "Send the events as application/json.")
    if (request.content_length or 0) > MAX_BYTES:
        return problem(413, "Content Too Large", "A request is at most 1 MiB.")
    raw = request.stream.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        return problem(413, "Content Too Large", "A request is at most 1 MiB.")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return problem(400, "Bad Request", "The body is not valid JSON.")
    events = body.get("events") if isinstance(body, dict) else None
    if not isinstance(events, list):
        return problem(400, "Bad Request", 'The body must be {"events": [ … ]}.')
    if not events:
        return problem(400, "Bad Request", "Send at least one event.")
    if len(events) > MAX_EVENTS:
        return problem(413, "Content Too Large",
                       f"A request holds at most {MAX_EVENTS:,} events; this one holds "
                       f"{len(events):,}. Split it.")
    at = now()
    results = ingest(svc().engine, events, now=at,
                     meter_default=svc().settings.stripe_meter_event_name,
                     source=f"http:{token.name}")
    if BUCKETS.should_mark(token.id):
        mark_used(svc().engine, token.id, now=at)
    payload: dict[str, Any] = {"results": [r.as_dict() for r in results]}
    return Response(json.dumps(payload), status=200, mimetype="application/json")
