"""Issue 14, logs: with ``LOG_FORMAT=json`` every line ``billing-outbox serve`` writes —
gunicorn's master and workers, its access log, APScheduler's, ours — is one JSON object; and
an idle dashboard with its in-app drainer polling writes nothing at INFO: one line per pass
with work, none per idle poll, no access lines for static files, probes or live panels."""

from __future__ import annotations

import json
import subprocess
import sys
import time
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

from .test_serve import free_port, get

pytestmark = pytest.mark.slow


def lines(path: Path) -> list[dict[str, Any]]:
    out = []
    for raw in path.read_text().splitlines():
        try:
            out.append(json.loads(raw))
        except ValueError:
            raise AssertionError(f"not a JSON line: {raw!r}") from None
    return out


def test_json_lines_everywhere_and_quiet_when_idle(sqlite_url: str, fake_stripe: Any,
                                                    tmp_path: Path) -> None:
    engine = make_engine(sqlite_url)
    fake_stripe.add_meter("api_requests")
    set_tenant(engine, "acme", stripe_customer_id="cus_acme", name="Acme", now=utcnow())
    with Session(engine) as db, db.begin():
        for i in range(5):
            enqueue_usage(db, tenant_id="acme", quantity=1, idempotency_key=f"log-{i}")
    env = worker_env(sqlite_url, fake_stripe.base_url, LOG_FORMAT="json")
    port = free_port()
    out_path, err_path = tmp_path / "out.log", tmp_path / "err.log"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "webapp", "serve", "--port", str(port),
                                 "--workers", "1"], env=env, cwd=ROOT, stdout=out, stderr=err)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_for(lambda: get(base + "/healthz")[0] == 200, 30, message="gunicorn up")

            def sent() -> bool:
                with engine.connect() as conn:
                    return conn.execute(select(func.count()).where(
                        OutboxEvent.status == "sent")).scalar_one() == 5

            wait_for(sent, 30, message="the in-app drainer sends")
            assert get(base + "/login")[0] == 200
            assert get(base + "/static/app.css")[0] == 200
            polled = urllib.request.Request(base + "/login", headers={"HX-Request": "true"})
            with urllib.request.urlopen(polled, timeout=5) as resp:  # noqa: S310 - loopback
                assert resp.status == 200
            assert get(base + "/no-such-page")[0] == 404
            time.sleep(0.5)
            before = len(lines(out_path)) + len(lines(err_path))
            time.sleep(3)  # about 60 idle polls at OUTBOX_POLL_INTERVAL_SECONDS=0.05
            idle = len(lines(out_path)) + len(lines(err_path)) - before
        finally:
            stop_process(proc)
            engine.dispose()
    everything = lines(out_path) + lines(err_path)
    assert idle == 0, everything[-10:]
    loggers = {line["logger"] for line in everything}
    assert {"gunicorn.error", "gunicorn.access", "webapp.worker.drainer"} <= loggers, loggers
    scheduler = [line for line in everything if line["logger"].startswith("apscheduler")]
    assert all(line["level"] != "INFO" for line in scheduler), scheduler
    access = [line["message"] for line in everything if line["logger"] == "gunicorn.access"]
    assert any('"GET /login HTTP/1.1" 200' in m for m in access), access
    assert any('"GET /no-such-page HTTP/1.1" 404' in m for m in access), access
    assert sum('"GET /login HTTP/1.1" 200' in m for m in access) == 1, access  # not the htmx one
    assert not any("/static/" in m or "/healthz" in m for m in access), access
    drained = [line for line in everything if line["message"].startswith("drained:")]
    assert drained and all(line["level"] == "INFO" for line in drained)
    assert all({"ts", "level", "logger", "message"} <= set(line) for line in everything)
