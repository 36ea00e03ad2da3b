"""``Seed``: writes outbox rows, attempts and tenants straight into the database, for tests
that need a given state without driving the product to it."""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection, Engine, func, insert, select

from webapp.models import AuditEntry, Control, DeliveryAttempt, OutboxEvent, Tenant, User, utcnow
from webapp.read.audit import NOT_SIGN_IN

T = OutboxEvent.__table__
TENANTS = Tenant.__table__


class Seed:
    """Writes outbox rows, attempts and tenants straight into the database."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._keys = itertools.count(1)

    def event(self, conn: Connection | None = None, **kw: Any) -> int:
        """One event (in ``conn``'s transaction when given, else in one of its own)."""
        if conn is None:
            with self.engine.begin() as own:
                return self.event(own, **kw)
        now = kw.pop("now", None) or utcnow()
        status = kw.get("status", "pending")
        n = next(self._keys)
        row: dict[str, Any] = dict(
            tenant_id="acme", meter="api_requests", quantity=1,
            idempotency_key=f"key-{n}-{status}", occurred_at=now, status=status,
            attempt_count=0, call_count=0, next_attempt_at=now, key_generation=0,
            created_at=now, updated_at=now)
        if status == "sent":
            row.update(sent_at=now, attempt_count=1, call_count=1, last_outcome="delivered",
                       first_attempt_at=now)
        if status in ("dead", "resolved"):
            row.update(dead_at=now, dead_reason="No such customer", attempt_count=1,
                       call_count=1, last_outcome="permanent",
                       last_error_class="InvalidRequestError",
                       last_error_code="resource_missing", last_http_status=400,
                       last_error_message="No such customer: 'cus_x'", first_attempt_at=now)
        if status == "resolved":
            row.update(resolved_at=now, resolved_by="someone@example.com",
                       resolve_reason="written_off", resolve_note="seeded")
        if status == "retrying":
            row.update(attempt_count=1, call_count=1, last_outcome="not_executed",
                       last_http_status=429, last_error_code="rate_limit",
                       next_attempt_at=now + timedelta(minutes=5), first_attempt_at=now)
        row.update(kw)
        if status != "pending" and "stripe_customer_id" not in kw:
            # Attempted: the customer its tenant was mapped to is fixed on it, as a claim
            # does.
            row["stripe_customer_id"] = conn.execute(
                select(TENANTS.c.stripe_customer_id)
                .where(TENANTS.c.tenant_id == row["tenant_id"])).scalar()
        return int(conn.execute(insert(T).values(**row).returning(T.c.id)).scalar_one())

    def events(self, n: int, *, together: bool = False, **kw: Any) -> list[int]:
        """``n`` events, each committed on its own, or all in one transaction (``together``:
        a reader never sees part of them)."""
        if not together:
            return [self.event(**kw) for _ in range(n)]
        with self.engine.begin() as conn:
            return [self.event(conn, **kw) for _ in range(n)]

    def attempt(self, event_id: int, **kw: Any) -> None:
        row: dict[str, Any] = dict(event_id=event_id, attempted_at=utcnow(), duration_ms=120,
                                   worker="test:1", outcome="delivered", counted=True,
                                   http_status=200, applied=True)
        row.update(kw)
        with self.engine.begin() as conn:
            conn.execute(insert(DeliveryAttempt.__table__).values(**row))

    def tenant(self, tenant_id: str, customer: str | None, name: str | None = None) -> None:
        now = utcnow()
        with self.engine.begin() as conn:
            conn.execute(insert(Tenant.__table__).values(
                tenant_id=tenant_id, name=name, stripe_customer_id=customer, created_at=now,
                updated_at=now))

    def stripe_history(self, now: Any) -> None:
        """A bit of Stripe's side: meters, a stored error report with a sample, and a
        reconciliation run with a mismatch."""
        from webapp.models import (
            ReconciliationMismatch,
            ReconciliationRun,
            StripeErrorSample,
            StripeEvent,
            StripeMeter,
            SyncState,
        )

        with self.engine.begin() as conn:
            conn.execute(insert(StripeMeter.__table__), [
                dict(event_name="api_requests", meter_id="mtr_1", status="active",
                     customer_key="stripe_customer_id", value_key="value", formula="sum",
                     seen_at=now, updated_at=now),
                dict(event_name="plan_level", meter_id="mtr_2", status="inactive",
                     customer_key="customer", value_key="level", formula="last",
                     seen_at=now, updated_at=now)])
            conn.execute(insert(SyncState.__table__), [
                dict(name="meters", ran_at=now, ok=True, detail="2 meters listed"),
                dict(name="events", ran_at=now, ok=False, detail="Stripe answered 500")])
            conn.execute(insert(StripeEvent.__table__).values(
                id="evt_1", type="v1.billing.meter.error_report_triggered", created=now,
                meter_id="mtr_1", source="poll", stored_at=now, error_count=3, sample_count=1,
                rejected=1, unmatched=0, summary="3 invalid events", body="{}"))
            conn.execute(insert(StripeErrorSample.__table__).values(
                stripe_event_id="evt_1", code="meter_event_customer_not_found",
                message="No such customer", identifier="nobody", outcome="unmatched", at=now))
            run_id = conn.execute(insert(ReconciliationRun.__table__).values(
                started_at=now, finished_at=now, since=now - timedelta(days=35), until=now,
                trigger="schedule", buckets_checked=10, pending=2, mismatches=1, calls=3,
                ok=True, errors="[]", notes='["meter plan_level: not compared"]')
                .returning(ReconciliationRun.__table__.c.id)).scalar_one()
            conn.execute(insert(ReconciliationMismatch.__table__).values(
                run_id=run_id, tenant_id="acme", stripe_customer_id="cus_acme",
                meter="api_requests", formula="sum", start=now - timedelta(days=2),
                end=now - timedelta(days=1), local_units=7, stripe_units=47.0,
                difference=40.0))

    def lost_day(self, now: Any, *, stripe_units: float = 0.0, tenant: str = "acme") -> int:
        """A tenant's api_requests two days ago (three sent events: 4, 5 and 6 units, billed
        to ``cus_<tenant>``) and a reconciliation of that tenant that compared the day at
        ``now`` (the latest, with any other run started then) and found Stripe holding
        ``stripe_units`` of the 15 (none by default); the mismatch's id."""
        from webapp.models import ReconciliationMismatch, ReconciliationRun

        day = now.replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=2)
        for i, units in enumerate((4, 5, 6)):
            self.event(status="sent", quantity=units, stripe_customer_id=f"cus_{tenant}",
                       tenant_id=tenant, occurred_at=day + timedelta(hours=10, minutes=i),
                       sent_at=now - timedelta(hours=3), now=now - timedelta(hours=3))
        with self.engine.begin() as conn:
            run_id = conn.execute(insert(ReconciliationRun.__table__).values(
                started_at=now, finished_at=now,
                since=day - timedelta(days=30), until=day + timedelta(days=2), trigger="cli",
                tenant_id=tenant, buckets_checked=1, pending=0, mismatches=1, calls=1, ok=True,
                errors="[]", notes="[]").returning(ReconciliationRun.__table__.c.id)).scalar_one()
            return int(conn.execute(insert(ReconciliationMismatch.__table__).values(
                run_id=run_id, tenant_id=tenant, stripe_customer_id=f"cus_{tenant}",
                meter="api_requests", formula="sum", start=day, end=day + timedelta(days=1),
                local_units=15, stripe_units=stripe_units, difference=stripe_units - 15)
                .returning(ReconciliationMismatch.__table__.c.id)).scalar_one())

    def get(self, event_id: int) -> Any:
        with self.engine.connect() as conn:
            return conn.execute(select(T).where(T.c.id == event_id)).one()

    def statuses(self) -> dict[int, str]:
        with self.engine.connect() as conn:
            return dict(conn.execute(select(T.c.id, T.c.status)).all())  # type: ignore[arg-type]

    def audit_count(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(AuditEntry.__table__)
                                    .where(NOT_SIGN_IN))
                       .scalar_one())

    def snapshot(self) -> tuple[Any, ...]:
        """Everything a dashboard action could change, for "nothing changed" checks."""
        with self.engine.connect() as conn:
            events = conn.execute(select(T).order_by(T.c.id)).all()
            tenants = conn.execute(select(Tenant.__table__)).all()
            control = conn.execute(select(Control.__table__)).all()
            users = conn.execute(select(User.__table__.c.email, User.__table__.c.active)).all()
            audit = conn.execute(select(AuditEntry.__table__).where(NOT_SIGN_IN)).all()
        return (events, tenants, control, users, audit)
