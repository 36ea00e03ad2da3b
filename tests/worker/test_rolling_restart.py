"""A rolling restart, as a deploy does it: while events keep coming, a new generation of
workers starts and the old one gets SIGTERM, one process at a time, twice over. Each old
worker exits 0 having given back every claim it held (none left ``processing`` under its
name, so none waits for its claim to expire), and every committed event reaches Stripe once:
nothing lost, nothing doubled, no two calls of one lane in flight at once. Directly on
PostgreSQL, and through PgBouncer in transaction mode with ``DATABASE_DIRECT_URL``."""

from __future__ import annotations

import subprocess
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from conftest import start_worker, wait_for, worker_env
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session
from support.pgbouncer import in_front_of

from webapp.db import make_engine
from webapp.models import OutboxEvent, utcnow
from webapp.outbox import enqueue_usage
from webapp.outbox.operations import set_tenant

pytestmark = pytest.mark.slow

T = OutboxEvent.__table__
TENANTS = 6
#: Long enough that a claim left behind would outlast the test's wait for the last event.
CLAIM_TIMEOUT = "120"


class Producer(threading.Thread):
    """Enqueues one event every few milliseconds until told to stop."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(daemon=True)
        self.engine = engine
        self.keys: list[str] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            n = 0
            while not self.stop.is_set():
                key = f"deploy-{n}"
                with Session(self.engine) as db, db.begin():
                    enqueue_usage(db, tenant_id=f"t{n % TENANTS}", quantity=1 + n % 5,
                                  idempotency_key=key)
                self.keys.append(key)
                n += 1
                time.sleep(0.004)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def is_up(engine: Engine, pid: int) -> bool:
    """Whether the worker with process id ``pid`` is in its loop (its SIGTERM handler is in
    place): its first heartbeat is written from there. A busy machine can take seconds to
    start a Python process; terminated before, it would die of the signal's default."""
    from webapp.models import DrainerHeartbeat

    with engine.connect() as conn:
        names = conn.execute(select(DrainerHeartbeat.__table__.c.name)).scalars().all()
    return any(name.split(":")[1:2] == [str(pid)] for name in names)


def held_by(engine: Engine, pid: int) -> int:
    """Claims still ``processing`` under the worker with process id ``pid``."""
    with engine.connect() as conn:
        names = conn.execute(select(T.c.claimed_by).where(T.c.status == "processing")
                             ).scalars().all()
    return sum(1 for name in names if (name or "").split(":")[1:2] == [str(pid)])


@pytest.mark.parametrize("through_pooler", [False, True], ids=["direct", "pgbouncer"])
def test_rolling_restart_loses_and_doubles_nothing(pg_url: str, fake_stripe: Any,
                                                   tmp_path: Path, through_pooler: bool) -> None:
    direct = make_engine(pg_url)
    with ExitStack() as stack:
        stack.callback(direct.dispose)
        for i in range(TENANTS):
            set_tenant(direct, f"t{i}", stripe_customer_id=f"cus_deploy{i}", name=None,
                       now=utcnow())
        database_url, extra, producers = pg_url, {}, direct
        bouncer = None
        if through_pooler:
            bouncer = stack.enter_context(in_front_of(pg_url, pool_size=8))
            database_url, extra = bouncer.url("tx"), {"DATABASE_DIRECT_URL": pg_url}
            producers = make_engine(database_url, connect_args={"prepare_threshold": None})
            stack.callback(producers.dispose)
        fake_stripe.set_latency(0.03)  # calls are in flight when SIGTERM comes
        env = worker_env(database_url, fake_stripe.base_url, fake_stripe.meter_events_url,
                         **extra, OUTBOX_CLAIM_TIMEOUT_SECONDS=CLAIM_TIMEOUT,
                         OUTBOX_BATCH_SIZE="50", OUTBOX_CONCURRENCY="4",
                         OUTBOX_POLL_INTERVAL_SECONDS="0.1")
        started: list[subprocess.Popen[bytes]] = []

        def start(generation: int, i: int) -> subprocess.Popen[bytes]:
            proc = start_worker(env, tmp_path / f"gen{generation}-{i}.log")
            started.append(proc)
            return proc

        def kill_leftovers() -> None:
            for proc in started:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=10)

        stack.callback(kill_leftovers)
        producer = Producer(producers)
        producer.start()
        stack.callback(producer.stop.set)

        current = [start(0, i) for i in range(3)]
        retired: list[tuple[int, int | None, int]] = []  # (pid, exit code, claims left)
        for generation in (1, 2):
            time.sleep(3)
            wait_for(lambda: fake_stripe.accept_count() > 0, 30, message="sending")
            fresh = []
            for i, old in enumerate(current):
                fresh.append(start(generation, i))  # the new one first, then the old goes
                time.sleep(0.5)
                wait_for(lambda p=old.pid: is_up(direct, p), 60,  # type: ignore[misc]
                         message=f"worker {old.pid} in its loop")
                old.terminate()
                code = old.wait(timeout=40)
                retired.append((old.pid, code, held_by(direct, old.pid)))
            current = fresh
        time.sleep(2)
        producer.stop.set()
        producer.join(timeout=10)
        assert producer.error is None, repr(producer.error)
        committed = set(producer.keys)
        assert len(committed) > 500

        def all_sent() -> bool:
            with direct.connect() as conn:
                return dict(conn.execute(select(T.c.status, func.count())
                                         .group_by(T.c.status)).all()) == {
                    "sent": len(committed)}

        # Well before any claim could expire (120 s): nothing waited for the rescuer.
        wait_for(all_sent, 30, interval=0.2, message="every committed event sent")
        for proc in current:
            wait_for(lambda p=proc.pid: is_up(direct, p), 60,  # type: ignore[misc]
                     message=f"worker {proc.pid} in its loop")
            proc.terminate()
            retired.append((proc.pid, proc.wait(timeout=40), held_by(direct, proc.pid)))

        assert [(code, left) for _, code, left in retired] == [(0, 0)] * 9, retired
        accepted = fake_stripe.accepted()
        assert set(accepted) == committed
        assert fake_stripe.accept_count() == len(committed)
        assert fake_stripe.overlaps() == {}
        logs = "\n".join(p.read_text() for p in tmp_path.glob("gen*.log"))
        assert "whose claim expired" not in logs  # the rescuer had nothing to bring back
        assert "Traceback" not in logs
        # Each generation really sent: a deploy in the middle of the traffic.
        with direct.connect() as conn:
            from webapp.models import DeliveryAttempt

            senders = set(conn.execute(select(DeliveryAttempt.worker).distinct()).scalars())
        assert len({name.split(":")[1] for name in senders}) >= 6, senders
        if bouncer is not None:
            assert bouncer.advisory_locks(direct) == 0
            assert bouncer.prepared_per_server() == [0] * bouncer.pool_size
            assert "prepared statement" not in logs + bouncer.log()
