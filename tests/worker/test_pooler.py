"""Through Debian's PgBouncer in transaction mode (``support.pgbouncer``), started here in
front of the local PostgreSQL: the pooler is found, every command that holds lane and shard
locks refuses to start without ``DATABASE_DIRECT_URL`` (one line, exit 2), and with it the
events enqueued inside pooled transactions drain to Stripe once each, with no prepared
statement on a pooled connection and no advisory lock left on one."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import cli, start_worker, stop_process, wait_for, worker_env
from sqlalchemy import Engine, func, select, text
from sqlalchemy.orm import Session
from support.pgbouncer import PgBouncer, in_front_of

from webapp.db import make_engine
from webapp.models import OutboxEvent, utcnow
from webapp.outbox import enqueue_usage
from webapp.outbox.operations import set_tenant
from webapp.pooler import transaction_pooled


@pytest.fixture
def bouncer(pg_url: str) -> Iterator[PgBouncer]:
    with in_front_of(pg_url) as pooler:
        yield pooler


@pytest.fixture
def pooled(bouncer: PgBouncer) -> Iterator[Engine]:
    """The application's own engine through the pooler, as docs/deployment.md says to make it."""
    engine = make_engine(bouncer.url("tx"), connect_args={"prepare_threshold": None})
    yield engine
    engine.dispose()


def test_transaction_pooling_is_found_and_nothing_else(bouncer: PgBouncer, pg_url: str) -> None:
    for _ in range(3):
        assert transaction_pooled(bouncer.url("tx"))
        assert not transaction_pooled(bouncer.url("session"))
        assert not transaction_pooled(pg_url)


@pytest.mark.parametrize("command", [("worker",), ("drain",), ("drain", "--once"),
                                     ("serve", "--port", "8999")])
def test_commands_with_lane_locks_refuse_without_the_direct_url(
        bouncer: PgBouncer, fake_stripe: Any, command: tuple[str, ...]) -> None:
    env = worker_env(bouncer.url("tx"), fake_stripe.base_url)
    done = cli(*command, env=env, timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert len(lines) == 1, lines
    assert lines[0].startswith("billing-outbox: DATABASE_URL goes through a transaction pooler")
    assert "DATABASE_DIRECT_URL" in lines[0]
    assert fake_stripe.accept_count() == 0


def test_an_unreachable_database_is_not_taken_for_a_pooler(
        caplog: pytest.LogCaptureFixture) -> None:
    """A worker started before its database is up starts as before (and waits for it)."""
    from webapp.config import Settings
    from webapp.pooler import session_state_problem

    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    try:
        settings = Settings(database_url=f"postgresql+psycopg://postgres@127.0.0.1:"
                                         f"{port.getsockname()[1]}/nothing_here")
        with caplog.at_level("WARNING", logger="webapp.pooler"):
            assert session_state_problem(settings) is None
    finally:
        port.close()
    assert "could not look for a transaction pooler" in caplog.text


def test_session_pooling_needs_no_direct_url(bouncer: PgBouncer, fake_stripe: Any) -> None:
    env = worker_env(bouncer.url("session"), fake_stripe.base_url)
    done = cli("drain", "--once", env=env, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]


def test_drains_once_each_through_the_pooler_with_the_direct_url(
        bouncer: PgBouncer, pooled: Engine, pg_url: str, fake_stripe: Any,
        tmp_path: Path) -> None:
    direct = make_engine(pg_url)
    try:
        set_tenant(direct, "acme", stripe_customer_id="cus_acme", name=None, now=utcnow())
        # Enqueued inside the caller's pooled transactions: enqueue_usage (many times over, past
        # psycopg's prepare threshold), the SQL function, one rolled back, one duplicate.
        for i in range(40):
            with Session(pooled) as db, db.begin():
                enqueue_usage(db, tenant_id="acme", quantity=1 + i % 3,
                              idempotency_key=f"pooled:{i}", meter="api_requests")
        with Session(pooled) as db, db.begin():
            again = enqueue_usage(db, tenant_id="acme", quantity=1, idempotency_key="pooled:0",
                                  meter="api_requests")
            assert again.quantity == 1
        with pooled.begin() as conn:
            conn.execute(text("SELECT billing_outbox_enqueue('acme', 5, 'pooled:sql', "
                              "'api_requests', NULL)"))
        with pytest.raises(RuntimeError), Session(pooled) as db, db.begin():
            enqueue_usage(db, tenant_id="acme", quantity=1, idempotency_key="pooled:gone",
                          meter="api_requests")
            raise RuntimeError("the work failed")

        env = worker_env(bouncer.url("tx"), fake_stripe.base_url,
                         fake_stripe.meter_events_url, DATABASE_DIRECT_URL=pg_url)
        log = tmp_path / "worker.log"
        worker = start_worker(env, log)
        try:
            # A worker's poll, claim and maintenance statements run many times over, past
            # psycopg's prepare threshold (5), on whichever server connection is free.
            wait_for(lambda: fake_stripe.accept_count() >= 41, 60, message="41 accepted")
            time.sleep(3)
        finally:
            assert stop_process(worker) == 0, log.read_text()[-3000:]
        done = cli("drain", env=env, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "prepared statement" not in log.read_text()

        accepted = fake_stripe.accepted()
        assert set(accepted) == {f"pooled:{i}" for i in range(40)} | {"pooled:sql"}
        assert fake_stripe.accept_count() == 41
        with direct.connect() as conn:
            statuses = dict(conn.execute(select(OutboxEvent.status, func.count())
                                         .group_by(OutboxEvent.status)).all())
            assert statuses == {"sent": 41}
            # Nothing session-scoped stayed behind on the pooler's server connections.
            assert bouncer.server_pids(), "the pooler holds no server connection"
        assert bouncer.advisory_locks(direct) == 0
        assert bouncer.prepared_per_server() == [0] * bouncer.pool_size
        assert "prepared statement" not in bouncer.log()
        assert "prepared statement" not in done.stderr
    finally:
        direct.dispose()
