"""Issue 30, the claim order with a real worker process on PostgreSQL: with a backlog of both,
the events a draft invoice still needs are sent before the rest, though every other event has
waited longer.

Ten customers' periods ended two minutes ago (their drafts finalize in 58 minutes); twenty
others are mid-period. The tables are filled by the billing refresher itself, reading the
fake through the real SDK, as the worker does again when it starts.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from conftest import make_settings, start_worker, stop_process, wait_for, worker_env
from sqlalchemy import func, insert, select

from webapp.db import make_engine
from webapp.models import OutboxEvent, utcnow
from webapp.outbox import invoices
from webapp.outbox.operations import set_tenant
from webapp.worker import gateway_from
from webapp.worker.invoices import billing_refresher

pytestmark = pytest.mark.slow

T = OutboxEvent.__table__
METER = "api_requests"
URGENT, NORMAL = 10, 20
URGENT_EVENTS, NORMAL_EVENTS = 50, 1000
BATCH = 50


def test_a_finalizing_invoices_events_are_claimed_first(pg_url: str, fake_stripe: Any,
                                                        tmp_path: Any) -> None:
    fake = fake_stripe
    fake.add_meter(METER)
    fake.set_latency(0.002)
    now = utcnow().replace(microsecond=0)
    stamp = int(now.timestamp())
    urgent = [f"cus_u{i}" for i in range(URGENT)]
    normal = [f"cus_n{i}" for i in range(NORMAL)]
    fake.create_subscriptions(urgent, [METER], period_start=stamp - 3600 - 120,
                              period_seconds=3600, grace_seconds=3600)
    fake.create_subscriptions(normal, [METER], period_start=stamp - 600, period_seconds=3600)
    engine = make_engine(pg_url)
    try:
        settings = make_settings(pg_url, stripe_api_base=fake.base_url,
                                 stripe_meter_events_base=fake.meter_events_url)
        for customer in urgent + normal:
            set_tenant(engine, customer[4:], stripe_customer_id=customer, name=None, now=now)
        summary = billing_refresher(engine, gateway_from(settings), settings).run_once()
        assert (summary.items, summary.drafts) == (URGENT + NORMAL, URGENT)

        def row(key: str, tenant: str, due_ago: timedelta, occurred_ago: timedelta) -> dict:
            return dict(tenant_id=tenant, meter=METER, quantity=1, idempotency_key=key,
                        occurred_at=now - occurred_ago, status="pending", attempt_count=0,
                        call_count=0, key_generation=0, next_attempt_at=now - due_ago,
                        created_at=now - due_ago, updated_at=now)

        # Every other event has waited ten minutes; the draft's events have only just come due.
        rows = [row(f"normal:{i}", normal[i % NORMAL][4:], timedelta(minutes=10),
                    timedelta(minutes=1)) for i in range(NORMAL_EVENTS)]
        rows += [row(f"urgent:{i}", urgent[i % URGENT][4:], timedelta(0),
                     timedelta(minutes=30)) for i in range(URGENT_EVENTS)]
        with engine.begin() as conn:
            conn.execute(insert(T), rows)
        assert invoices.mark_invoice_first(engine) == (URGENT_EVENTS, 0)

        env = worker_env(pg_url, fake.base_url, fake.meter_events_url,
                         OUTBOX_BATCH_SIZE=str(BATCH), OUTBOX_CONCURRENCY="8")
        proc = start_worker(env, log_path=tmp_path / "worker.log")
        try:
            def all_sent() -> bool:
                assert proc.poll() is None, (tmp_path / "worker.log").read_text()
                with engine.connect() as conn:
                    return conn.execute(select(func.count()).select_from(T).where(
                        T.c.status == "sent")).scalar() == len(rows)

            wait_for(all_sent, 90, interval=0.25, message="every event sent")
        finally:
            assert stop_process(proc) == 0, (tmp_path / "worker.log").read_text()[-3000:]
    finally:
        engine.dispose()

    order = [e["identifier"] for e in sorted(fake.request_log(), key=lambda e: e["started"])]
    assert len(order) == len(rows) and len(set(order)) == len(rows)
    ranks = [i for i, identifier in enumerate(order) if identifier.startswith("urgent:")]
    # The first claim takes the draft's events (a second may be claimed while it is in flight).
    assert max(ranks) < URGENT_EVENTS + BATCH, ranks
