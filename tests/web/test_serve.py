"""`billing-outbox serve`: gunicorn serves the app and its APScheduler job really drains."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, stop_process, wait_for, worker_env
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from webapp.db import make_engine
from webapp.models import OutboxEvent, utcnow
from webapp.outbox import enqueue_usage
from webapp.outbox.operations import set_tenant

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback only
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def test_serve_drains_under_gunicorn(pg_url: str, fake_stripe: Any, tmp_path: Path) -> None:
    engine = make_engine(pg_url)
    set_tenant(engine, "acme", stripe_customer_id="cus_acme", name="Acme", now=utcnow())
    env = worker_env(pg_url, fake_stripe.base_url)
    keys = [f"serve-{i}" for i in range(40)]
    with Session(engine) as db, db.begin():
        for i, key in enumerate(keys):
            enqueue_usage(db, tenant_id="acme", quantity=i + 1, idempotency_key=key)

    port = free_port()
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "webapp", "serve", "--port", str(port),
                             "--workers", "2"], env=env, cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: get(base + "/healthz")[0] == 200, 30, message="gunicorn up")
        status, body = get(base + "/readyz")
        assert status == 200, body
        assert json.loads(body)["status"] == "ok"

        def all_sent() -> bool:
            with engine.connect() as conn:
                return conn.execute(select(func.count()).where(
                    OutboxEvent.status == "sent")).scalar_one() == len(keys)

        wait_for(all_sent, 45, message="the in-app drainer sends every event")
        assert set(fake_stripe.accepted()) == set(keys)
        assert fake_stripe.accept_count() == len(keys)
        # One drainer per host: every attempt row names the same worker process.
        with engine.connect() as conn:
            from webapp.models import DeliveryAttempt

            workers = conn.execute(select(DeliveryAttempt.worker).distinct()).scalars().all()
        assert len(workers) == 1, workers
    finally:
        try:
            stop_process(proc)
        finally:
            log.close()
            engine.dispose()
    assert proc.returncode == 0, (tmp_path / "serve.log").read_text()[-3000:]
