"""Producers in other languages call ``billing_outbox_enqueue`` as docs/producers.md shows:
from ``psql`` and from Node.js with ``pg`` (npm, ``tests/node``), in a transaction that
commits and one that rolls back, a duplicate, a conflict and bad input with their SQLSTATEs;
then a drainer sends what they committed to the fake Stripe, once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from conftest import ROOT, make_settings
from sqlalchemy import Engine, select

from webapp.models import OutboxEvent, utcnow
from webapp.outbox.operations import set_tenant
from webapp.worker import Drainer, gateway_from

NODE_DIR = ROOT / "tests" / "node"


def libpq_env(pg_url: str) -> dict[str, str]:
    """The environment libpq clients (psql, node-postgres) read, for the test's schema."""
    u = urlparse(pg_url.replace("postgresql+psycopg://", "postgresql://"))
    options = parse_qs(u.query).get("options", [""])[0]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env.update(PGHOST=u.hostname or "127.0.0.1", PGPORT=str(u.port or 5432),
               PGUSER=u.username or "postgres", PGDATABASE=u.path.lstrip("/"),
               PGOPTIONS=options.replace("-csearch_path", "-c search_path"))
    return env


def tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: the producer recipes are proven with it")
    return found


def psql(env: dict[str, str], sql: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("psql"), "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1",
                           "-v", "VERBOSITY=verbose", "-c", "\\set VERBOSITY verbose",
                           "-c", sql], env=env, capture_output=True, text=True, timeout=60)


def keys(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {k: i for k, i in conn.execute(select(OutboxEvent.idempotency_key,
                                                     OutboxEvent.id))}


def drain_to(engine: Engine, pg_url: str, fake: Any) -> None:
    set_tenant(engine, "acme", stripe_customer_id="cus_acme", name=None, now=utcnow())
    settings = make_settings(pg_url, stripe_api_base=fake.base_url,
                             stripe_meter_events_base=fake.meter_events_url)
    drainer = Drainer(engine, settings, gateway_from(settings))
    try:
        for _ in range(20):
            if not drainer.drain_once().claimed:
                break
    finally:
        drainer.close()


def test_from_psql(pg: Engine, pg_url: str, fake_stripe: Any) -> None:
    env = libpq_env(pg_url)
    done = psql(env, "BEGIN; SELECT billing_outbox_enqueue('acme', 5, 'psql:1'); COMMIT;")
    assert done.returncode == 0, done.stderr
    first = int(done.stdout.strip())
    rolled = psql(env, "BEGIN; SELECT billing_outbox_enqueue('acme', 5, 'psql:2'); ROLLBACK;")
    assert rolled.returncode == 0, rolled.stderr
    again = psql(env, "SELECT billing_outbox_enqueue('acme', 5, 'psql:1', NULL, NULL)")
    assert int(again.stdout.strip()) == first
    for sql, state, words in (
            ("SELECT billing_outbox_enqueue('acme', 6, 'psql:1')", "23505",
             f"idempotency_key 'psql:1' already names event {first} with a different quantity"),
            ("SELECT billing_outbox_enqueue('acme', 0, 'psql:3')", "22023",
             "quantity: must be positive (got 0)"),
            ("SELECT billing_outbox_enqueue('', 1, 'psql:4')", "22023",
             "tenant_id: must be a non-empty string"),
            ("SELECT billing_outbox_enqueue('acme', 1, 'psql:5', 'api_requests', "
             "now() + interval '1 hour')", "22023",
             "occurred_at: is more than 5 minutes in the future")):
        refused = psql(env, sql)
        assert refused.returncode != 0
        assert f"ERROR:  {state}: {words}" in refused.stderr, refused.stderr
    assert set(keys(pg)) == {"psql:1"}
    drain_to(pg, pg_url, fake_stripe)
    accepted = list(fake_stripe.accepted().values())
    assert [(a.customer, a.event_name, a.value) for a in accepted] == [
        ("cus_acme", "api_requests", "5")]
    with pg.connect() as conn:
        assert conn.execute(select(OutboxEvent.status).where(OutboxEvent.id == first)
                            ).scalar_one() == "sent"


def test_from_node_postgres(pg: Engine, pg_url: str, fake_stripe: Any,
                            tmp_path: Path) -> None:
    npm, node = tool("npm"), tool("node")
    work = tmp_path / "node"
    work.mkdir()
    for name in ("package.json", "package-lock.json", "enqueue.js"):
        shutil.copy(NODE_DIR / name, work / name)
    installed = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--silent"], cwd=work,
                               capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr
    ran = subprocess.run([node, "enqueue.js"], cwd=work, env=libpq_env(pg_url),
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    steps = {s["step"]: s for s in map(json.loads, ran.stdout.splitlines())}
    first = int(steps["committed"]["id"])
    assert steps["rolled back"]["error"] == "the work failed"
    assert int(steps["duplicate"]["id"]) == first
    assert (steps["conflict"]["sqlstate"], steps["conflict"]["message"]) == (
        "23505", f"idempotency_key 'node:order-1' already names event {first} with a "
                 "different quantity")
    for label, column in (("bad quantity", "quantity"), ("bad tenant", "tenant_id"),
                          ("bad key", "idempotency_key"), ("too old", "occurred_at")):
        assert (steps[label]["sqlstate"], steps[label]["column"]) == ("22023", column), label
    assert set(keys(pg)) == {"node:order-1"}
    drain_to(pg, pg_url, fake_stripe)
    assert [(a.customer, a.value) for a in fake_stripe.accepted().values()] == [
        ("cus_acme", "5")]


def test_the_documented_sqlite_insert_is_sent(tmp_path: Path, sqlite_template: Any,
                                              fake_stripe: Any) -> None:
    """A producer sharing the embedded database with Python's sqlite3 and the documented
    INSERT (its time format included): the drainer claims and sends it."""
    import sqlite3
    from datetime import UTC, datetime, timedelta

    from webapp.db import make_engine

    url = sqlite_template.copy_to(tmp_path / "outbox.sqlite3")
    now = (datetime.now(UTC) - timedelta(seconds=1)).strftime("%Y-%m-%d %H:%M:%S.%f")
    db = sqlite3.connect(tmp_path / "outbox.sqlite3")
    with db:
        for _ in range(2):  # the second finds the first and adds nothing
            db.execute(
                "INSERT INTO stripe_usage_outbox (tenant_id, meter, quantity, idempotency_key, "
                "occurred_at, next_attempt_at, created_at, updated_at, status, attempt_count, "
                "call_count, key_generation) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'pending', 0, 0, 0) "
                "ON CONFLICT (idempotency_key) DO NOTHING",
                ("acme", "api_requests", 5, "order:42", now, now, now, now))
    db.close()
    engine = make_engine(url)
    try:
        drain_to(engine, url, fake_stripe)
        with engine.connect() as conn:
            rows = conn.execute(select(OutboxEvent.status, OutboxEvent.occurred_at)).all()
    finally:
        engine.dispose()
    assert [r.status for r in rows] == ["sent"]
    assert [(a.customer, a.value) for a in fake_stripe.accepted().values()] == [
        ("cus_acme", "5")]


@pytest.fixture
def pg(pg_url: str) -> Any:
    from webapp.db import make_engine

    eng = make_engine(pg_url)
    yield eng
    eng.dispose()
