"""A prune under a running drain, on PostgreSQL, with a real ``billing-outbox worker``.

The prune here holds every batch's transaction open far longer than a real one does (its row
locks on the rows it deletes, its upserts of the pruned-usage rollup), while the worker
drains thousands of events. The worker's connections carry ``lock_timeout = 1s``: any wait of
more than a second on a lock fails its statement, and the log would show it. A sampler
watches ``pg_blocking_pids`` the whole time: no backend ever waits on the prune's. Every
event is still sent exactly once, nothing waiting or in flight is touched, and usage for the
pruned period is the same after."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any
from urllib.parse import quote

import pytest
from conftest import wait_for, worker_env
from sqlalchemy import func, insert, select, text

from webapp.db import make_engine
from webapp.models import DeliveryAttempt, utcnow
from webapp.outbox import retention, rollups
from webapp.read.tenants import tenant_usage

from .test_processes import (
    METERS,
    T,
    assert_clean_shutdown,
    assert_delivered_exactly_once,
    commit_events,
    fake,  # noqa: F401 - the fixture
    workers_factory,  # noqa: F401 - the fixture
)

pytestmark = pytest.mark.slow

OLD = 12_000
HOLD_SECONDS = 0.25


def _old_history(engine: Any) -> None:
    """Sent events from two months ago, with their calls, folded into the rollup."""
    then = utcnow() - timedelta(days=60)
    rows = [dict(tenant_id=f"t{i % 20:02d}", meter=METERS[i % 2], quantity=i % 7 + 1,
                 idempotency_key=f"old:{i}", occurred_at=then - timedelta(seconds=i),
                 status="sent", attempt_count=1, call_count=1, key_generation=0,
                 next_attempt_at=then, sent_at=then, last_outcome="delivered",
                 stripe_customer_id=f"cus_t{i % 20:02d}", created_at=then, updated_at=then)
            for i in range(OLD)]
    with engine.begin() as conn:
        ids = [int(i) for i in conn.execute(insert(T).returning(T.c.id), rows).scalars()]
        conn.execute(insert(DeliveryAttempt.__table__), [
            dict(event_id=i, attempted_at=then, duration_ms=80, worker="old", outcome="delivered",
                 counted=True, http_status=200, applied=True) for i in ids[::3]])
    rollups.fold(engine, now=utcnow(), margin=timedelta(minutes=15))


def _numbers(usage: Any) -> dict[tuple[str, str], tuple[dict[str, int], dict[str, int]]]:
    return {(r.tenant_id, r.meter): (r.events, r.quantity) for r in usage.rows}


def _with_lock_timeout(url: str) -> str:
    assert "options=" in url
    return url + quote(" -clock_timeout=1000")


def test_prune_under_a_running_drain_never_blocks_it(pg_url: str, fake: Any,  # noqa: F811
                                                     workers_factory: Any,  # noqa: F811
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    engine = make_engine(pg_url)
    try:
        _old_history(engine)
        span = dict(start=(utcnow() - timedelta(days=70)).date(),
                    end=(utcnow() - timedelta(days=50)).date())
        before = _numbers(tenant_usage(engine, **span))
        fake.set_latency(0.005)
        # the worker's own pruner finds nothing (a long retention): the test's prune is the
        # one under watch
        workers = workers_factory(worker_env(_with_lock_timeout(pg_url), fake.base_url,
                                             OUTBOX_CONCURRENCY="8", OUTBOX_BATCH_SIZE="100",
                                             OUTBOX_RETENTION_DAYS="3650"))
        workers.start()
        workers.wait_started()

        prune_pids: set[int] = set()
        real = retention._count_pruned

        def slow_count(conn: Any, rows: Any) -> None:
            real(conn, rows)
            prune_pids.add(int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one()))
            time.sleep(HOLD_SECONDS)   # locks held, as a slow disk or a huge batch would

        monkeypatch.setattr(retention, "_count_pruned", slow_count)
        blocked: list[tuple[Any, ...]] = []
        watching = threading.Event()
        watching.set()

        def sample() -> None:
            with make_engine(pg_url).connect() as conn:
                while watching.is_set():
                    for pid in list(prune_pids):
                        blocked.extend(tuple(r) for r in conn.execute(text(
                            "SELECT pid, wait_event_type, left(query, 80) FROM pg_stat_activity"
                            " WHERE :p = ANY(pg_blocking_pids(pid))"), {"p": pid}))
                    conn.rollback()
                    time.sleep(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()
        result: list[retention.PruneResult] = []
        pruner = threading.Thread(target=lambda: result.append(retention.prune(
            engine, now=utcnow(), retention_days=40, batch_size=500)))
        pruner.start()
        wait_for(lambda: bool(prune_pids), 30, message="the prune's first batch")
        committed = commit_events(engine, 3000)      # the drain runs while the prune does
        keys = list(committed)

        def all_sent() -> bool:
            workers.check_running()
            with engine.connect() as conn:
                return int(conn.execute(select(func.count()).where(
                    T.c.idempotency_key.in_(keys), T.c.status == "sent")).scalar_one()) == len(
                    keys)

        wait_for(all_sent, 90, interval=0.25, message="every new event sent")
        drained_while_pruning = pruner.is_alive()
        pruner.join(120)
        watching.clear()
        sampler.join(10)

        assert drained_while_pruning, "the drain finished after the prune: nothing was proven"
        assert result and result[0].pruned == OLD and result[0].attempts == OLD // 3
        assert blocked == [], f"backends waited on the prune: {blocked[:5]}"
        assert_delivered_exactly_once(fake, committed)
        assert _numbers(tenant_usage(engine, **span)) == before
        with engine.connect() as conn:
            left = dict(conn.execute(select(T.c.status, func.count()).group_by(T.c.status))
                        .all())
        assert left == {"sent": len(committed)}
        assert_clean_shutdown(workers)
        log = workers.log(workers.procs[0])
        assert "lock timeout" not in log and "canceling statement" not in log, log[-3000:]
    finally:
        engine.dispose()
