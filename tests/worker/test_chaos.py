"""Issue 3, chaos: everything at once on PostgreSQL, against the fake with faults on.

About 2,000 events are enqueued by two threads WHILE three real worker processes drain them;
some transactions roll back after ``enqueue_usage`` (their keys must never reach Stripe), some
enqueue a key again (alone, or racing the other thread for it). The fake answers with random
5xx (applied or not), lost responses, 429s with Retry-After and 503s, and goes down twice for a
moment. Workers are SIGKILLed at random and restarted. At the end every worker gets SIGTERM.

What must hold: the fake's accepted set equals the committed set exactly, values included
(customer, meter, value, timestamp), nothing is dead or stuck, and no two calls of one
(customer, meter) lane were ever in flight at once.

Run once per ``STRIPE_METER_EVENT_API``: with ``v2_stream`` the same faults meet stream
requests, and every session token is expired now and then while the workers send. And once
more in ``v1`` through Debian's PgBouncer in transaction mode (issue 33): the workers and the
enqueuers on the pooler, the lane and shard locks on ``DATABASE_DIRECT_URL``; the pooler drops
every connection for a moment (``KILL``, then ``RESUME``); no advisory lock may ever be seen
on one of its server connections, none prepared statement be left there, and no log mention
a prepared statement.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from conftest import start_worker, wait_for, worker_env
from sqlalchemy import Engine, func, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from support.fake_stripe import FakeStripe
from support.pgbouncer import in_front_of

from webapp.db import make_engine
from webapp.models import OutboxEvent, utcnow
from webapp.outbox import enqueue_usage, operations

pytestmark = pytest.mark.slow

T = OutboxEvent.__table__
SEED = int(os.environ.get("CHAOS_SEED", "20260503"))
TARGET = 2000
ENQUEUE_SECONDS = 28.0
KILLS_UNTIL = 24.0     # the last SIGKILLed claims come back 23 s later
CUSTOMERS = [f"cus_chaos{i}" for i in range(5)]
METERS = ("api_requests", "storage_gb")
TIMEOUT = "3"          # STRIPE_TIMEOUT_SECONDS: calls never time out against the fake
CLAIM_TIMEOUT = "23"   # the shortest claim config.validate accepts for that timeout, rounded up

@pytest.fixture
def pg(pg_url: str) -> Iterator[Engine]:
    eng = make_engine(pg_url, pool_size=5, max_overflow=5)
    yield eng
    eng.dispose()


def _pid(worker: str | None) -> int | None:
    """The process id in a worker's name (``host:pid:…``)."""
    try:
        return int((worker or "").split(":")[1])
    except (IndexError, ValueError):
        return None


class Fleet:
    """Three worker processes; kill and restart them at will."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env, self.logs = env, logs
        self.procs: list[subprocess.Popen[bytes]] = []
        self.retired: list[subprocess.Popen[bytes]] = []
        self.started = 0
        self.kills = 0
        self.stranded = 0    # claims left behind by a SIGKILL
        self._numbers: dict[int, int] = {}

    def start(self) -> subprocess.Popen[bytes]:
        self.started += 1
        proc = start_worker(self.env, self.logs / f"worker{self.started}.log")
        self._numbers[proc.pid] = self.started
        return proc

    def up(self, n: int) -> None:
        self.procs = [self.start() for _ in range(n)]

    def kill_one(self, rng: random.Random, engine: Engine) -> None:
        """SIGKILL a worker, one caught holding claims if any does within three seconds (a
        busy machine's workers claim less often), and start another. Counts the claims the
        kill stranded (still ``processing`` under the dead worker's name): only the rescuer
        can bring those back."""
        deadline = time.monotonic() + 3.0
        while True:
            holding = self._holding(engine)
            if holding or time.monotonic() >= deadline:
                break
            time.sleep(0.01)
        i = rng.choice(sorted(holding)) if holding else rng.randrange(len(self.procs))
        victim = self.procs[i]
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        self.kills += 1
        self.stranded += sum(1 for h in self._claimers(engine) if _pid(h) == victim.pid)
        self.retired.append(victim)
        self.procs[i] = self.start()

    @staticmethod
    def _claimers(engine: Engine) -> list[str]:
        with engine.connect() as conn:
            return list(conn.execute(select(T.c.claimed_by).where(T.c.status == "processing"))
                        .scalars())

    def _holding(self, engine: Engine) -> set[int]:
        pids = {_pid(h) for h in self._claimers(engine)}
        return {i for i, p in enumerate(self.procs) if p.pid in pids}

    def terminate_all(self, timeout: float) -> list[int | None]:
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        return codes

    def diagnose(self, engine: Engine) -> str:
        """What a failure needs: counts, stuck rows, the workers' state and log tails."""
        with engine.connect() as conn:
            counts = dict(conn.execute(select(T.c.status, func.count())
                                       .group_by(T.c.status)).all())
            stuck = conn.execute(select(
                T.c.id, T.c.status, T.c.attempt_count, T.c.call_count, T.c.last_outcome,
                T.c.next_attempt_at, T.c.processing_deadline_at, T.c.claimed_by,
                T.c.dead_reason).where(T.c.status != "sent").limit(10)).all()
            control = conn.execute(text("SELECT * FROM outbox_control")).all()
        lines = [f"at {utcnow()}: counts {counts}; control {control}", f"stuck {stuck}"]
        for p in self.procs:
            log = Path(self.logs / f"worker{self._numbers[p.pid]}.log")
            tail = log.read_text().splitlines()[-15:] if log.exists() else []
            lines.append(f"pid {p.pid} exit {p.poll()}:\n  " + "\n  ".join(tail))
        return "\n".join(lines)

    def cleanup(self) -> None:
        for p in self.procs + self.retired:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)


class Enqueuer(threading.Thread):
    """Enqueues in small transactions; records what committed and what rolled back."""

    def __init__(self, name: str, engine: Engine, rng: random.Random, quota: int,
                 shared: list[tuple[str, int, int, int]], stop: threading.Event,
                 base: datetime) -> None:
        super().__init__(name=name, daemon=True)
        self.engine, self.rng, self.quota, self.shared, self.stop = (
            engine, rng, quota, shared, stop)
        #: The instant the items' ages count back from, the same for every enqueuer (they
        #: share items): a duplicate matches exactly.
        self.base = base
        self.committed: dict[str, tuple[str, str, int, int]] = {}
        self.rolled_back: set[str] = set()
        self.items: dict[str, tuple[str, int, int, int]] = {}
        self.duplicates = 0
        #: Transactions a database error cut short (the pooler dropping every connection):
        #: whether the last ones committed is read back from the table afterwards.
        self.db_errors = 0
        self.uncertain: dict[str, tuple[str, str, int, int]] = {}
        self.error: BaseException | None = None
        self._n = 0

    def _fresh(self) -> tuple[str, int, int, int]:
        self._n += 1
        return (f"{self.name}-{self._n}", self.rng.randrange(len(CUSTOMERS) * len(METERS)),
                self.rng.randint(1, 10**9), self.rng.randint(60, 2 * 86400))

    def _enqueue(self, db: Session, item: tuple[str, int, int, int]) -> tuple[str, str, int, int]:
        key, lane, quantity, age = item
        tenant, meter = f"tenant{lane // len(METERS)}", METERS[lane % len(METERS)]
        at = self.base - timedelta(seconds=age)  # fixed per item: a duplicate matches exactly
        enqueue_usage(db, tenant_id=tenant, quantity=quantity, idempotency_key=key,
                      meter=meter, occurred_at=at)
        return (CUSTOMERS[lane // len(METERS)], meter, quantity, int(at.timestamp()))

    def run(self) -> None:
        try:
            started = time.monotonic()
            while len(self.committed) < self.quota and not self.stop.is_set():
                # Pace the quota over ENQUEUE_SECONDS, so the enqueues overlap the whole drain.
                due = started + ENQUEUE_SECONDS * len(self.committed) / self.quota
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(min(0.05, wait))
                    continue
                roll = self.rng.random()
                try:
                    if roll < 0.12:
                        self._rollback_tx()
                    else:
                        self._commit_tx(with_duplicate=roll < 0.3)
                except DBAPIError:
                    self.db_errors += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def _rollback_tx(self) -> None:
        items = [self._fresh() for _ in range(self.rng.randint(1, 4))]
        db = Session(self.engine)
        try:
            db.begin()
            for item in items:
                self._enqueue(db, item)
            db.flush()
            time.sleep(self.rng.uniform(0.0, 0.05))  # visible to nobody, for a while
            db.rollback()
        finally:
            db.close()
        self.rolled_back |= {item[0] for item in items}

    def _commit_tx(self, *, with_duplicate: bool) -> None:
        items = [self._fresh() for _ in range(self.rng.randint(1, 6))]
        if with_duplicate:
            # The same key again in a later transaction: one of ours, or a shared key that the
            # other thread enqueues too (the two may race).
            if self.committed and self.rng.random() < 0.5:
                key = self.rng.choice(sorted(self.committed))
                items.append(self.items[key])
            else:
                items.append(self.rng.choice(self.shared))
            self.duplicates += 1
        done: dict[str, tuple[str, str, int, int]] = {}
        try:
            with Session(self.engine) as db, db.begin():
                for item in items:
                    done[item[0]] = self._enqueue(db, item)
        except DBAPIError:
            # Cut short: committed or not, as the table will say.
            self.uncertain.update((item[0], self._expected(item)) for item in items)
            raise
        self.items.update((item[0], item) for item in items)
        self.committed.update(done)

    def _expected(self, item: tuple[str, int, int, int]) -> tuple[str, str, int, int]:
        key, lane, quantity, age = item
        at = self.base - timedelta(seconds=age)
        return (CUSTOMERS[lane // len(METERS)], METERS[lane % len(METERS)], quantity,
                int(at.timestamp()))

    def settle_uncertain(self, engine: Engine) -> None:
        """What the table holds of the transactions cut short counts as committed."""
        if not self.uncertain:
            return
        with engine.connect() as conn:
            there = set(conn.execute(select(T.c.idempotency_key).where(
                T.c.idempotency_key.in_(list(self.uncertain)))).scalars())
        for key, expected in self.uncertain.items():
            if key in there:
                self.committed[key] = expected
            else:
                self.rolled_back.add(key)


#: When every stream session token expires (seconds into the run), in ``v2_stream`` mode.
TOKEN_EXPIRIES = (5.0, 13.0, 21.0)


#: Through the pooler: when it drops every connection, and for how long (seconds).
POOLER_OUTAGE = (14.0, 1.0)


@pytest.mark.parametrize(("api", "through_pooler"),
                         [("v1", False), ("v2_stream", False), ("v1", True)],
                         ids=["v1", "v2_stream", "v1-pgbouncer"])
def test_chaos(pg_url: str, pg: Engine, fake_stripe: FakeStripe, tmp_path: Path,
               api: str, through_pooler: bool) -> None:
    with ExitStack() as stack:
        run_chaos(pg_url, pg, fake_stripe, tmp_path, api, stack if through_pooler else None)


def run_chaos(pg_url: str, pg: Engine, fake_stripe: FakeStripe, tmp_path: Path, api: str,
              pooler_stack: ExitStack | None) -> None:
    rng = random.Random(SEED)
    stream = api == "v2_stream"
    bouncer = None
    producers, database_url, extra = pg, pg_url, {}
    if pooler_stack is not None:
        bouncer = pooler_stack.enter_context(in_front_of(pg_url, pool_size=8))
        database_url, extra = bouncer.url("tx"), {"DATABASE_DIRECT_URL": pg_url}
        # The application's own engine on the pooler, as docs/deployment.md says to make it.
        producers = make_engine(database_url, pool_size=5, max_overflow=5,
                                connect_args={"prepare_threshold": None})
        pooler_stack.callback(producers.dispose)
    advisory_seen = 0
    for meter in METERS:
        fake_stripe.add_meter(meter)
    fake_stripe.set_latency(0.002)
    for i, customer in enumerate(CUSTOMERS):
        operations.set_tenant(pg, f"tenant{i}", stripe_customer_id=customer,
                              name=None, now=utcnow())
    fake_stripe.set_faults(error_5xx_rate=0.04, apply_before_5xx_rate=0.5,
                           drop_response_rate=0.04, rate_limit_rate=0.04, retry_after=0.2,
                           unavailable_rate=0.02)
    env = worker_env(database_url, fake_stripe.base_url, fake_stripe.meter_events_url, **extra,
                     STRIPE_TIMEOUT_SECONDS=TIMEOUT,
                     OUTBOX_CLAIM_TIMEOUT_SECONDS=CLAIM_TIMEOUT, OUTBOX_BATCH_SIZE="40",
                     OUTBOX_CONCURRENCY="4", OUTBOX_POLL_INTERVAL_SECONDS="0.1",
                     STRIPE_METER_EVENT_API=api)
    fleet = Fleet(env, tmp_path)
    shared = [(f"shared-{i}", rng.randrange(len(CUSTOMERS) * len(METERS)),
               rng.randint(1, 10**9), rng.randint(60, 86400)) for i in range(40)]
    stop = threading.Event()
    base = utcnow().replace(microsecond=0)
    enqueuers = [Enqueuer(f"e{i}", producers, random.Random(SEED + i + 1), TARGET // 2, shared,
                          stop, base) for i in range(2)]
    pooler_down = False
    try:
        fleet.up(3)
        t0 = time.monotonic()
        for e in enqueuers:
            e.start()
        outages = [(9.0, 1.5), (19.0, 1.0)]
        next_kill = t0 + rng.uniform(2.0, 4.0)
        # One of each kind of fault for certain, beside the random ones: on a busy machine
        # fewer requests go out (streams carry 100 events each), and a 2% kind may not come up.
        queued = False
        expiries = list(TOKEN_EXPIRIES) if stream else []
        while any(e.is_alive() for e in enqueuers) and time.monotonic() - t0 < 60:
            now = time.monotonic()
            if expiries and now - t0 >= expiries[0]:
                fake_stripe.expire_stream_tokens()
                expiries.pop(0)
            if not queued and now - t0 >= 5.0:
                for kind in ("503", "drop", "500"):
                    fake_stripe.fail_next(kind)
                fake_stripe.fail_next("429", retry_after=0.2)
                queued = True
            if now >= next_kill and now - t0 < KILLS_UNTIL:
                fleet.kill_one(rng, pg)
                next_kill = now + rng.uniform(2.0, 5.0)
            for start, length in outages:
                if start <= now - t0 < start + length:
                    fake_stripe.set_outage(True)
                    break
            else:
                fake_stripe.set_outage(False)
            if bouncer is not None:
                down = POOLER_OUTAGE[0] <= now - t0 < sum(POOLER_OUTAGE)
                if down != pooler_down:
                    bouncer.admin("KILL tx" if down else "RESUME tx")
                    pooler_down = down
                if not down:
                    advisory_seen = max(advisory_seen, bouncer.advisory_locks(pg))
            time.sleep(0.05)
        stop.set()
        for e in enqueuers:
            e.join(timeout=10)
            assert e.error is None, repr(e.error)
            e.settle_uncertain(pg)
            if bouncer is None:
                assert e.db_errors == 0, e.db_errors
        if bouncer is not None and pooler_down:
            bouncer.admin("RESUME tx")
        fake_stripe.set_outage(False)
        fake_stripe.set_faults()

        committed: dict[str, tuple[str, str, int, int]] = {}
        for e in enqueuers:
            committed.update(e.committed)
        rolled_back = set().union(*(e.rolled_back for e in enqueuers))
        assert len(committed) >= TARGET - len(shared) and rolled_back
        assert not rolled_back & set(committed)

        def settled() -> bool:
            with pg.connect() as conn:
                counts = dict(conn.execute(
                    select(T.c.status, func.count()).group_by(T.c.status)).all())
            return counts == {"sent": len(committed)}

        # Claims of the last SIGKILLed worker come back after their deadline (23 s).
        try:
            wait_for(settled, 55, interval=0.5, message="every committed event sent")
        except AssertionError:
            raise AssertionError(fleet.diagnose(pg)) from None
        assert all(p.poll() is None for p in fleet.procs), fleet.diagnose(pg)
        if bouncer is not None:
            advisory_seen = max(advisory_seen, bouncer.advisory_locks(pg))
        codes = fleet.terminate_all(timeout=15)
        assert codes == [0, 0, 0]
    finally:
        stop.set()
        fake_stripe.set_outage(False)
        fleet.cleanup()

    with pg.connect() as conn:
        in_db = set(conn.execute(select(T.c.idempotency_key)).scalars())
    assert in_db == set(committed)
    accepted = fake_stripe.accepted()
    assert {k: (a.customer, a.event_name, int(a.value), a.timestamp)
            for k, a in accepted.items()} == committed
    assert fake_stripe.accept_count() == len(committed)
    seen = {e["identifier"] for e in fake_stripe.request_log()}
    seen |= {i for e in fake_stripe.stream_log() for i in e["identifiers"]}
    assert not seen & rolled_back
    assert fake_stripe.overlaps() == {}

    # The chaos really happened.
    log = fake_stripe.stream_log() if stream else fake_stripe.request_log()
    faults = Counter(e["fault"] for e in log if e["fault"])
    assert fleet.kills >= 5, fleet.kills
    assert fleet.stranded > 0, "no SIGKILL caught a worker holding claims"
    rescued = sum(int(line.split("rescued ")[1].split()[0])
                  for log in tmp_path.glob("worker*.log")
                  for line in log.read_text().splitlines()
                  if "WARNING" in line and "rescued " in line)
    assert rescued > 0  # a killed worker held claims; they came back after their deadline
    assert faults["drop"] and faults["429"] and faults["503"], faults
    assert faults["500"] + faults["502"] + faults["504"] > 0, faults
    if stream:
        assert fake_stripe.calls() == 0  # nothing went through v1
        assert fake_stripe.stream_duplicates() > 0  # resent after a lost answer, skipped
        expired = [e for e in log if e["status"] == 401]
        assert expired, "no request met an expired session"
        # Every worker alive at the end made a session, and the expiries made more (a worker
        # killed on a busy machine before its first request made none).
        assert fake_stripe.stream_sessions() > fleet.started - fleet.kills
    else:
        assert fake_stripe.duplicate_identifier_rejections() > 0
    assert sum(e.duplicates for e in enqueuers) > 20
    if bouncer is not None:
        # Session state stayed off the pooler: no advisory lock on its server connections
        # at any look, no statement prepared there, none of the errors crossed statements give.
        assert advisory_seen == 0
        assert bouncer.advisory_locks(pg) == 0
        assert bouncer.prepared_per_server() == [0] * bouncer.pool_size
        logs = [log.read_text() for log in tmp_path.glob("worker*.log")] + [bouncer.log()]
        assert not [line for text_ in logs for line in text_.splitlines()
                    if "prepared statement" in line]
        # The outage happened: the pooler dropped the clients' connections (the workers' and
        # the enqueuers' pooled ones), and everything above still held.
        dropped = [line for line in bouncer.log().splitlines()
                   if " C-0x" in line and "closing because: database removed" in line]
        assert len(dropped) >= 3, bouncer.log()[-3000:]
    # Requests from several workers at once (v2 packs a pass's lanes into few requests).
    assert fake_stripe.max_in_flight() >= (2 if stream else 3)
