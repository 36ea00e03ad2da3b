"""The heavy proofs: real ``billing-outbox worker`` processes against the in-test FakeStripe
(workers reach it over loopback), on PostgreSQL and SQLite, with crashes and faults.

Every test ends with the same two facts: every committed event is ``sent``, and Stripe (the
fake) accepted each identifier exactly once, with the customer, meter, value and timestamp
that were committed.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import start_worker, wait_for, worker_env
from sqlalchemy import Engine, func, insert, select
from sqlalchemy.orm import Session

from webapp.db import make_engine
from webapp.models import DeliveryAttempt, OutboxEvent, utcnow
from webapp.outbox import enqueue_usage
from webapp.outbox.enqueue import validate_usage
from webapp.outbox.operations import set_tenant

pytestmark = pytest.mark.slow

T = OutboxEvent.__table__
METERS = ("api_requests", "storage_gb")


@dataclass(frozen=True)
class Committed:
    key: str
    tenant: str
    customer: str
    meter: str
    quantity: int
    occurred_at: datetime


def customer_of(tenant: str) -> str:
    return f"cus_{tenant}"


def commit_events(engine: Engine, n: int, *, tenants: int = 20,
                  prefix: str = "ev") -> dict[str, Committed]:
    """Map ``tenants`` tenants and commit ``n`` events round-robin over tenants × meters (the
    interleaving that makes every batch span every lane).

    One bulk INSERT of exactly the row ``enqueue_usage`` writes (each event validated by the
    same ``validate_usage``): enqueue itself is proven in test_enqueue.py, and 5,000 ORM calls
    would cost this file seconds it does not need to spend.
    """
    now = utcnow()
    for t in range(tenants):
        set_tenant(engine, f"t{t:02d}", stripe_customer_id=customer_of(f"t{t:02d}"),
                   name=None, now=now)
    out: dict[str, Committed] = {}
    rows = []
    for i in range(n):
        tenant = f"t{i % tenants:02d}"
        meter = METERS[(i // tenants) % len(METERS)]
        c = Committed(key=f"{prefix}:{i}", tenant=tenant, customer=customer_of(tenant),
                      meter=meter, quantity=(i * 7919) % 100_000 + 1,
                      occurred_at=now - timedelta(seconds=i * 13, microseconds=i % 1000))
        validate_usage(tenant_id=c.tenant, quantity=c.quantity, idempotency_key=c.key,
                       meter=c.meter, occurred_at=c.occurred_at, now=now)
        rows.append(dict(tenant_id=c.tenant, meter=c.meter, quantity=c.quantity,
                         idempotency_key=c.key, occurred_at=c.occurred_at, status="pending",
                         attempt_count=0, call_count=0, key_generation=0, next_attempt_at=now,
                         created_at=now, updated_at=now))
        out[c.key] = c
    with engine.begin() as conn:
        conn.execute(insert(T), rows)
    # and one through the request path itself, so both kinds of row are drained
    extra = Committed(key=f"{prefix}:enqueued", tenant="t00", customer=customer_of("t00"),
                      meter=METERS[0], quantity=5, occurred_at=now - timedelta(minutes=1))
    with Session(engine) as db, db.begin():
        enqueue_usage(db, tenant_id=extra.tenant, quantity=extra.quantity,
                      idempotency_key=extra.key, meter=extra.meter,
                      occurred_at=extra.occurred_at)
    out[extra.key] = extra
    return out


def status_counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return dict(conn.execute(select(T.c.status, func.count()).group_by(T.c.status)).all())


def assert_delivered_exactly_once(fake: Any, committed: dict[str, Committed]) -> None:
    accepted = fake.accepted()
    assert fake.accept_count() == len(committed)
    assert set(accepted) == set(committed)
    wrong = []
    for key, c in committed.items():
        got = accepted[key]
        expected = (c.customer, c.meter, str(c.quantity), int(c.occurred_at.timestamp()))
        if (got.customer, got.event_name, got.value, got.timestamp) != expected:
            wrong.append((key, expected, got))
    assert wrong == []


class Workers:
    """Worker processes with their own log files; always reaped at the end."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env, self.logs = env, logs
        self.procs: list[subprocess.Popen[bytes]] = []
        self.killed: set[int] = set()

    def start(self, **extra: str) -> subprocess.Popen[bytes]:
        n = len(self.procs)
        path = self.logs / f"worker-{n}.log"
        proc = start_worker(dict(self.env, **extra), log_path=path)
        proc.log_path = path  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        return Path(proc.log_path).read_text(errors="replace")  # type: ignore[attr-defined]

    def wait_started(self, procs: list[subprocess.Popen[bytes]] | None = None) -> None:
        for p in procs or self.procs:
            wait_for(lambda p=p: "started" in self.log(p) or p.poll() is not None, 30,
                     message="a worker to start")
            assert p.poll() is None, self.log(p)

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.pid not in self.killed]

    def check_running(self) -> None:
        for p in self.alive():
            assert p.poll() is None, f"worker {p.pid} exited {p.returncode}:\n{self.log(p)}"

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        self.killed.add(proc.pid)

    def terminate_all(self, timeout: float = 15) -> dict[int, int | None]:
        """SIGTERM every live worker; their exit codes (None: did not exit in time)."""
        live = self.alive()
        for p in live:
            p.send_signal(signal.SIGTERM)
        codes: dict[int, int | None] = {}
        deadline = time.monotonic() + timeout
        for p in live:
            try:
                codes[p.pid] = p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[p.pid] = None
        return codes

    def cleanup(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)


@pytest.fixture
def workers_factory(tmp_path: Path) -> Iterator[Any]:
    made: list[Workers] = []

    def make(env: dict[str, str]) -> Workers:
        w = Workers(env, tmp_path)
        made.append(w)
        return w

    yield make
    for w in made:
        w.cleanup()


def wait_all_sent(engine: Engine, total: int, workers: Workers, timeout: float) -> None:
    def done() -> bool:
        workers.check_running()
        return status_counts(engine).get("sent", 0) == total

    try:
        wait_for(done, timeout, interval=0.25, message=f"all {total} events sent")
    except AssertionError as exc:
        with engine.connect() as conn:
            stuck = conn.execute(select(T.c.idempotency_key, T.c.status, T.c.attempt_count,
                                        T.c.call_count, T.c.dead_reason, T.c.last_outcome,
                                        T.c.last_http_status, T.c.last_error_message)
                                 .where(T.c.status != "sent").limit(5)).all()
        raise AssertionError(f"{exc}\nstatuses: {status_counts(engine)}; "
                             f"for instance {[tuple(r) for r in stuck]}") from None


def assert_clean_shutdown(workers: Workers) -> None:
    # a worker still importing has no SIGTERM handler yet: the contract is about running ones
    workers.wait_started(workers.alive())
    codes = workers.terminate_all(15)
    assert codes and all(code == 0 for code in codes.values()), codes
    for p in workers.procs:
        text = workers.log(p)
        if p.pid not in workers.killed:
            assert "Traceback" not in text, text[-4000:]
            assert "database is locked" not in text, text[-4000:]
            assert "stopped" in text, text[-2000:]


def distinct_workers(engine: Engine) -> int:
    a = DeliveryAttempt.__table__
    with engine.connect() as conn:
        return conn.execute(select(func.count(func.distinct(a.c.worker)))).scalar_one()


@pytest.fixture
def fake(fake_stripe: Any) -> Any:
    for meter in METERS:
        fake_stripe.add_meter(meter)
    return fake_stripe


# -- many workers, no faults ----------------------------------------------------------------------
def test_pg_four_workers_5000_events(pg_url: str, fake: Any, workers_factory: Any) -> None:
    engine = make_engine(pg_url)
    try:
        fake.set_latency(0.01)   # calls of one lane from two processes would overlap visibly
        workers = workers_factory(worker_env(pg_url, fake.base_url, OUTBOX_CONCURRENCY="8",
                                             OUTBOX_BATCH_SIZE="100"))
        for _ in range(4):
            workers.start()
        workers.wait_started()   # all four are polling when the events are committed
        committed = commit_events(engine, 5000)
        total = len(committed)
        assert total == 5001
        wait_all_sent(engine, total, workers, timeout=50)
        assert_delivered_exactly_once(fake, committed)
        assert fake.overlaps() == {}
        assert fake.calls() == total   # no faults: not one call wasted
        # several processes really sent (how the work splits between them is up to timing)
        assert distinct_workers(engine) >= 2
        assert_clean_shutdown(workers)
        assert status_counts(engine) == {"sent": total}
    finally:
        engine.dispose()


def test_sqlite_three_workers_1000_events(sqlite_url: str, fake: Any,
                                          workers_factory: Any) -> None:
    engine = make_engine(sqlite_url)
    try:
        # a little latency, as real Stripe has: calls of one lane from two processes would
        # then overlap visibly
        fake.set_latency(0.02)
        workers = workers_factory(worker_env(sqlite_url, fake.base_url, OUTBOX_CONCURRENCY="8",
                                             OUTBOX_BATCH_SIZE="100"))
        for _ in range(3):
            workers.start()
        workers.wait_started()
        committed = commit_events(engine, 1000)
        wait_all_sent(engine, len(committed), workers, timeout=50)
        assert_delivered_exactly_once(fake, committed)
        assert fake.overlaps() == {}
        assert fake.calls() == len(committed)
        assert distinct_workers(engine) >= 2
        assert_clean_shutdown(workers)
    finally:
        engine.dispose()


# -- a worker dies holding claimed events ---------------------------------------------------------
def test_pg_worker_killed_holding_claims(pg_url: str, fake: Any, workers_factory: Any) -> None:
    """SIGKILL a worker mid-batch: its claimed events (some already accepted by Stripe, not
    yet recorded) come back after the claim deadline, a second worker resends them, and the
    identifier makes each resend harmless. Nothing is lost, nothing is billed twice."""
    engine = make_engine(pg_url)
    n = 200
    try:
        committed = commit_events(engine, n - 1, tenants=10)
        assert len(committed) == n
        fake.set_latency(0.5)
        env = worker_env(pg_url, fake.base_url, OUTBOX_CONCURRENCY="4",
                         OUTBOX_BATCH_SIZE="100", STRIPE_TIMEOUT_SECONDS="1",
                         OUTBOX_CLAIM_TIMEOUT_SECONDS="19")
        workers = workers_factory(env)
        first = workers.start()

        def mid_batch() -> bool:
            workers.check_running()
            counts = status_counts(engine)
            return counts.get("processing", 0) > 0 and fake.accept_count() >= 5

        wait_for(mid_batch, 30, interval=0.05, message="the first worker to be mid-batch")
        workers.kill(first)
        killed_mono, killed_wall = time.monotonic(), utcnow()
        with engine.connect() as conn:
            held = {r.idempotency_key: r.processing_deadline_at for r in conn.execute(
                select(T.c.idempotency_key, T.c.processing_deadline_at)
                .where(T.c.status == "processing"))}
        accepted_before = set(fake.accepted())
        # the worker records a batch only when it is done: what Stripe accepted is still held
        assert held and accepted_before
        assert accepted_before <= set(held)
        assert status_counts(engine).get("sent", 0) == 0
        calls_before = len(fake.request_log())

        fake.set_latency(0.0)
        workers.start()
        wait_all_sent(engine, n, workers, timeout=45)
        assert_delivered_exactly_once(fake, committed)
        assert fake.overlaps() == {}
        later = fake.request_log()[calls_before:]
        resent: dict[str, list[dict[str, Any]]] = {}
        for entry in later:
            resent.setdefault(entry["identifier"], []).append(entry)
        # every event Stripe had before the crash was sent again, and harmlessly so: a replay
        # of the saved 200 or the duplicate-identifier 400, never a second accept
        assert set(accepted_before) <= set(resent)
        for key in accepted_before:
            assert all(e["replayed"] or e["status"] == 400 for e in resent[key]), resent[key]
        # no held event was sent again before its claim deadline (the fake's clock is this
        # process's monotonic clock; the deadline is wall-clock time in the database)
        for key, deadline in held.items():
            due = killed_mono + (deadline - killed_wall).total_seconds()
            for e in resent.get(key, []):
                assert e["started"] >= due - 0.5, (key, e["started"] - due)
        with engine.connect() as conn:
            rescued = conn.execute(select(T.c.idempotency_key, T.c.first_unknown_at)
                                   .where(T.c.idempotency_key.in_(list(held)))).all()
        # rescued events start their dedupe-window clock at the claim
        assert all(r.first_unknown_at is not None for r in rescued)
        assert_clean_shutdown(workers)
    finally:
        engine.dispose()


# -- faults and kills -----------------------------------------------------------------------------
def test_pg_faults_and_kills(pg_url: str, fake: Any, workers_factory: Any) -> None:
    engine = make_engine(pg_url)
    n = 1000
    try:
        committed = commit_events(engine, n - 1, tenants=20)
        assert len(committed) == n
        fake.set_faults(error_5xx_rate=0.1, drop_response_rate=0.05, rate_limit_rate=0.05)
        env = worker_env(pg_url, fake.base_url, OUTBOX_CONCURRENCY="8",
                         OUTBOX_BATCH_SIZE="50", STRIPE_TIMEOUT_SECONDS="1",
                         OUTBOX_CLAIM_TIMEOUT_SECONDS="19", OUTBOX_MAX_ATTEMPTS="30")
        workers = workers_factory(env)
        for _ in range(3):
            workers.start()
        workers.wait_started()
        kills = 0
        outages = 0
        for round_ in range(4):
            # let some work happen, then kill the oldest live worker and start a replacement
            target = status_counts(engine).get("sent", 0) + 60
            wait_for(lambda t=target: status_counts(engine).get("sent", 0) >= t
                     or status_counts(engine).get("sent", 0) == n, 30, interval=0.1,
                     message="progress between kills")
            if round_ in (1, 2):
                fake.set_outage(True)
                outages += 1
                time.sleep(1.0)  # an outage window of about a second (a duration, not a wait)
                fake.set_outage(False)
            victim = workers.alive()[0]
            workers.kill(victim)
            kills += 1
            workers.start()
        assert kills == 4 and outages == 2
        fake.set_faults()
        wait_all_sent(engine, n, workers, timeout=60)
        assert_delivered_exactly_once(fake, committed)
        assert fake.overlaps() == {}
        assert fake.calls() > n   # the faults really happened
        assert fake.duplicate_identifier_rejections() > 0 or any(
            e["replayed"] for e in fake.request_log())
        with engine.connect() as conn:
            dead = conn.execute(select(func.count()).select_from(T)
                                .where(T.c.status == "dead")).scalar_one()
        assert dead == 0
        assert_clean_shutdown(workers)
    finally:
        engine.dispose()


def test_fake_never_answers_a_request_whose_body_was_cut(fake: Any) -> None:
    """The faults test's outages cut connections mid-request. A server that did not receive
    the whole body never saw the request: the client must get no answer (a dropped
    connection, "outcome unknown"), not a 400 about a body it sent in full."""
    with socket.create_connection(("127.0.0.1", fake.port), timeout=5) as sock:
        sock.sendall(b"POST /v1/billing/meter_events HTTP/1.1\r\nHost: x\r\n"
                     b"Authorization: Bearer sk_test_123\r\nIdempotency-Key: cut-1\r\n"
                     b"Content-Type: application/x-www-form-urlencoded\r\n"
                     b"Content-Length: 120\r\n\r\nevent_name=api_requests")
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(4096) == b""
    assert fake.calls() == 0
    assert fake.accept_count() == 0
