"""The money loop with real processes, on SQLite and PostgreSQL: a ``billing-outbox worker``
reads Stripe's meters and error reports on its own schedule and rejects what Stripe refused;
``billing-outbox serve`` receives signed pushes from Stripe's event destination."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, cli, start_worker, stop_process, wait_for, worker_env
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session
from support.fake_stripe import FakeStripe

from webapp.models import OutboxEvent, StripeEvent, utcnow
from webapp.outbox import enqueue_usage, operations

pytestmark = pytest.mark.slow
T = OutboxEvent.__table__
SECRET = "whsec_process_0123456789abcdef"


@pytest.fixture
def fake() -> Iterator[FakeStripe]:
    with FakeStripe(customers=("cus_known",), sample_limit=100, report_every=0.3) as f:
        f.add_meter("storage_gb", customer_key="customer", value_key="gb")
        yield f


def setup(engine: Engine, known: int, ghosts: int) -> None:
    operations.set_tenant(engine, "known", stripe_customer_id="cus_known", name=None,
                          now=utcnow())
    operations.set_tenant(engine, "ghost", stripe_customer_id="cus_ghost", name=None,
                          now=utcnow())
    with Session(engine) as db, db.begin():
        for i in range(known):
            enqueue_usage(db, tenant_id="known", quantity=i + 1, idempotency_key=f"k:{i}",
                          meter="storage_gb" if i % 2 else "api_requests")
        for i in range(ghosts):
            enqueue_usage(db, tenant_id="ghost", quantity=1, idempotency_key=f"g:{i}")


def statuses(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return dict(conn.execute(select(T.c.status, func.count())  # type: ignore[arg-type]
                                 .group_by(T.c.status)).all())


def test_a_worker_rejects_what_stripe_reports(engine: Engine, db_url: str, fake: FakeStripe,
                                              tmp_path: Path) -> None:
    setup(engine, known=20, ghosts=10)
    env = worker_env(db_url, fake.base_url, STRIPE_EVENTS_POLL_SECONDS="1")
    log = tmp_path / "worker.log"
    proc = start_worker(env, log)
    try:
        wait_for(lambda: statuses(engine) == {"sent": 20, "rejected": 10}, 60,
                 message="the known customer's events sent, the unknown one's rejected")
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    text = log.read_text()
    assert code == 0 and "Traceback" not in text, text[-3000:]
    accepted = fake.accepted()
    # The meter's own payload keys, read from Stripe's meter list.
    assert accepted["k:1"].payload == {"customer": "cus_known", "gb": "2"}
    assert all(e.valid for k, e in accepted.items() if k.startswith("k:"))
    # The command finds nothing more: every report is stored once.
    polled = cli("stripe-events", "poll", env=env)
    assert polled.returncode == 0 and '"rejected": 0' in polled.stdout


def test_a_signed_push_reaches_the_served_dashboard(pg_url: str, pg: Engine, fake: FakeStripe,
                                                   tmp_path: Path) -> None:
    import socket

    setup(pg, known=0, ghosts=5)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    env = worker_env(pg_url, fake.base_url, STRIPE_WEBHOOK_SECRET=SECRET,
                     STRIPE_EVENTS_POLL_SECONDS="3600")    # only the push can do it
    fake.set_webhook(f"http://127.0.0.1:{port}/stripe/webhook", SECRET)
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "webapp", "serve", "--port", str(port),
                             "--workers", "1"], env=env, cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: statuses(pg) == {"rejected": 5}, 60,
                 message="the in-app drainer sends, Stripe pushes its report, it is applied")
        with pg.connect() as conn:
            sources = set(conn.execute(select(StripeEvent.__table__.c.source)).scalars())
        assert sources == {"webhook"}
    finally:
        try:
            stop_process(proc)
        finally:
            log.close()
    assert proc.returncode == 0, (tmp_path / "serve.log").read_text()[-3000:]
