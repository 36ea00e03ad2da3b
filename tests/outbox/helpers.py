"""Helpers shared by the claim and record tests: events enqueued for real, tenants
mapped, claims made with an injected clock, and canned call results."""


from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from webapp.models import OutboxEvent
from webapp.outbox import enqueue_usage
from webapp.outbox.adjustments import CancelAnswer
from webapp.outbox.claims import Claim, claim_batch
from webapp.outbox.operations import set_tenant
from webapp.outbox.record import AttemptRecord
from webapp.outbox.states import CallResult, Outcome, Policy

T = OutboxEvent.__table__
POLICY = Policy(max_attempts=5, initial_backoff_seconds=0.05, max_backoff_seconds=1.0,
                dedupe_window_seconds=23 * 3600.0)
#: The instant these tests call now: fixed, so no test depends on when the suite reaches it
#: (every call below takes ``now``).
T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def add(engine: Engine, n: int, *, tenant: str = "acme", meter: str = "api_requests",
        prefix: str = "k", now: datetime = T0, start: int = 0) -> list[int]:
    ids = []
    with Session(engine) as db, db.begin():
        for i in range(start, start + n):
            ids.append(enqueue_usage(db, tenant_id=tenant, quantity=i + 1, meter=meter,
                                     idempotency_key=f"{prefix}{i}", now=now).id)
    return ids


def map_tenant(engine: Engine, tenant: str, customer: str | None, now: datetime = T0) -> None:
    set_tenant(engine, tenant, stripe_customer_id=customer, name=None, now=now)


def row(engine: Engine, event_id: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(T).where(T.c.id == event_id)).one()


def rows(engine: Engine) -> dict[int, Any]:
    with engine.connect() as conn:
        return {r.id: r for r in conn.execute(select(T))}


def claim(engine: Engine, now: datetime, *, limit: int = 100, timeout: float = 30.0,
          worker: str = "w1", **kw: Any) -> Claim:
    return claim_batch(engine, worker=worker, limit=limit, now=now,
                       claim_timeout_seconds=timeout, **kw)


def attempt(c: Claim, event_index: int, result: CallResult, when: datetime) -> AttemptRecord:
    return AttemptRecord(c.events[event_index], result, when, 5)


OK = CallResult(Outcome.DELIVERED, http_status=200)
PERM = CallResult(Outcome.PERMANENT, http_status=400, error_class="InvalidRequestError",
                  message="No active meter was found for event_name 'x'.", request_id="req_1")
TIMEOUT = CallResult(Outcome.UNKNOWN, error_class="APIConnectionError", message="timed out")
E500 = CallResult(Outcome.UNKNOWN, http_status=500, error_class="APIError", fresh_key=True)
E429 = CallResult(Outcome.NOT_EXECUTED, http_status=429, retry_after=2.0)
E401 = CallResult(Outcome.SYSTEMIC, http_status=401, error_class="AuthenticationError")




def taken(ids: list[int]) -> dict[int, CancelAnswer]:
    """Stripe's answer to a cancel of each event, as it answers a fresh adjustment."""
    return {i: CancelAnswer(CallResult(Outcome.DELIVERED, http_status=200,
                                       request_id=f"req_cancel_{i}"), status="pending")
            for i in ids}
