"""A world for billing tests through the real SDK: the fake Stripe, a drainer and the billing
refresher on one clock (real time plus an offset the test moves), with hour-long periods, so a
grace period passes without waiting for it."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from conftest import wait_for
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from support.fake_stripe import FakeStripe
from webapp.config import Settings
from webapp.models import OutboxEvent, StripeInvoicePeriod, utcnow
from webapp.outbox import enqueue_usage, late, operations
from webapp.outbox.unbilled import unbilled_events
from webapp.worker import Drainer, gateway_from
from webapp.worker.invoices import BillingRefresher, billing_refresher

T = OutboxEvent.__table__
LINES = StripeInvoicePeriod.__table__
METER = "api_requests"
PERIOD = 3600
GRACE = 1800


class Clock:
    """Real time plus an offset the test moves forward; shared by the fake and our side."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> datetime:
        return utcnow() + timedelta(seconds=self.offset)

    def seconds(self) -> float:
        return time.time() + self.offset

    def move_to(self, at: datetime) -> None:
        self.offset += max(0.0, (at - self()).total_seconds())


class World:
    """The fake, a drainer and the billing refresher on one clock. Periods are an hour long;
    the first began 50 minutes ago (``start``) and ends in 10."""

    def __init__(self, engine: Engine, fake: FakeStripe, settings: Settings,
                 clock: Clock) -> None:
        self.engine, self.fake, self.clock, self.settings = engine, fake, clock, settings
        self.drainer = Drainer(engine, settings, gateway_from(settings), clock=clock)
        if self.drainer.meters is not None:
            self.drainer.meters.active()
        self.refresher: BillingRefresher = billing_refresher(
            engine, gateway_from(settings), settings, clock=clock)
        self.start = int(clock.seconds()) - 3000

    def end(self, n: int = 1) -> datetime:
        return datetime.fromtimestamp(self.start + PERIOD * n, UTC)

    def tenant(self, name: str, customer: str) -> None:
        operations.set_tenant(self.engine, name, stripe_customer_id=customer, name=None,
                              now=self.clock())

    def subscribe(self, customer: str, **kw: Any) -> str:
        kw.setdefault("period_start", self.start)
        kw.setdefault("period_seconds", PERIOD)
        kw.setdefault("grace_seconds", GRACE)
        return self.fake.create_subscription(customer, [METER], **kw)

    def enqueue(self, tenant: str, key: str, quantity: int, at: datetime) -> int:
        with Session(self.engine) as db, db.begin():
            return int(enqueue_usage(db, tenant_id=tenant, quantity=quantity,
                                     idempotency_key=key, meter=METER, occurred_at=at,
                                     now=self.clock()).id)

    def rows(self, ids: list[int]) -> dict[int, Any]:
        with self.engine.connect() as conn:
            return {r.id: r for r in conn.execute(select(T).where(T.c.id.in_(ids)))}

    def drain(self, ids: list[int], timeout: float = 30.0) -> None:
        def sent() -> bool:
            self.drainer.drain_once()
            return {r.status for r in self.rows(ids).values()} == {"sent"}

        wait_for(sent, timeout, interval=0.02, message=f"events {ids} to be sent")

    def lines(self, customer: str) -> list[Any]:
        with self.engine.connect() as conn:
            return list(conn.execute(select(LINES).where(LINES.c.stripe_customer_id == customer)
                                     .order_by(LINES.c.period_start, LINES.c.invoice_id)))

    def late_ids(self) -> list[int]:
        with self.engine.connect() as conn:
            return [e.id for e in late.late_events(conn)]

    def unbilled(self) -> dict[int, str]:
        with self.engine.connect() as conn:
            return {e.id: e.reason for e in unbilled_events(conn)}
