"""Drain core throughput on a large table (issue 15): a batch of pending events drained by
the real worker loop with a no-op gateway, alone or while a maintenance operation (the
product's prune, a partition being dropped) runs beside it.

The batch is inserted by set-based SQL (the columns ``enqueue_usage`` writes), after the
table's current largest id, for 20 tenants the load already mapped, over 2 meters: the same
shape as ``bench/drain.py``'s 20,000 events (batch 1000, concurrency 1, one process). The
rate runs from the first claim to the commit of the last outcome of *the batch*, seen by a
watcher polling every 10 ms for a row past the mark still waiting (the loaded table has its
own in-flight rows of the last hour; the worker may take a few of them too: counted apart).
Each batch identifier must reach the gateway exactly once.

Beside the rate: every pass's duration (claim, calls, outcomes of one batch), as the worker
measures it, and — sampled from ``pg_stat_activity`` every 20 ms by the parent — the oldest
open transaction of the worker's connections and how many samples found one of them waiting
on a lock.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import text

from .common import BenchFailure, check_exactly_once, map_tenants
from .drain import CTX, NoopGateway, _get, drain_settings

DRAIN_TENANTS = 20
BATCH = 1000
KEY_PREFIX = "drain-bench:"

INSERT_BATCH = """
INSERT INTO stripe_usage_outbox (tenant_id, meter, quantity, idempotency_key, occurred_at,
    status, attempt_count, call_count, next_attempt_at, key_generation, created_at, updated_at)
SELECT 'tenant-' || lpad(((g - 1) % :tenants)::text, :digits, '0'),
       CASE WHEN ((g - 1) / :tenants) % 2 = 0 THEN 'api_requests' ELSE 'tokens' END,
       1 + g % 7, :prefix || g, CAST(:now AS timestamptz), 'pending', 0, 0,
       CAST(:now AS timestamptz), 0, CAST(:now AS timestamptz), CAST(:now AS timestamptz)
FROM generate_series(1, :n) AS g
"""


def tenant(i: int, digits: int) -> str:
    return f"tenant-{i:0{digits}d}"


def map_drain_tenants(engine: Any, digits: int) -> None:
    """Map the batch's tenants (an empty schema has none) with the product's operation."""
    map_tenants(engine, [tenant(i, digits) for i in range(DRAIN_TENANTS)])


def settle(engine: Any, url: str) -> int:
    """Drain, untimed, whatever of the loaded rows is due (retries of the last hour come
    due as the section runs), so the timed drain has its batch to itself. Returns how many
    events were taken."""
    from webapp.worker import Drainer

    drainer = Drainer(engine, drain_settings(url, BATCH), NoopGateway(), check_meters=False)
    # A one-off, as the ``drain`` command is: it takes no share of the lane shards. Holding
    # one (on a connection left open in the pool) counted it as a second worker, and the
    # timed drainer left "its" shards alone for SHORT_OF_SHARE_SECONDS (5 s) each run.
    drainer.shards = False
    taken = 0
    try:
        while True:
            claimed = drainer.drain_once().claimed
            taken += claimed
            if not claimed:
                return taken
    finally:
        drainer.close()


def insert_batch(engine: Any, n: int, digits: int, now: datetime,
                 tag: str) -> tuple[int, list[str]]:
    """Settle what is due, take the deferrer's turn (the worker's deferrer puts off unmapped
    tenants' events every minute), then insert ``n`` pending events past the current largest
    id: (mark, identifiers)."""
    from webapp.models import utcnow
    from webapp.outbox.deferred import defer_unsendable

    settle(engine, engine.url.render_as_string(hide_password=False))
    defer_unsendable(engine, now=utcnow())
    prefix = f"{KEY_PREFIX}{tag}:"
    with engine.begin() as conn:
        mark = int(conn.execute(text(
            "SELECT coalesce(max(id), 0) FROM stripe_usage_outbox")).scalar_one())
        conn.execute(text(INSERT_BATCH), {"tenants": DRAIN_TENANTS, "digits": digits,
                                          "prefix": prefix, "now": now, "n": n})
    with engine.connect() as conn:
        conn.execute(text("ANALYZE stripe_usage_outbox"))
        conn.commit()
    return mark, [f"{prefix}{g}" for g in range(1, n + 1)]


def _child(url: str, mark: int, batch: int, ready: Any, go: Any, out: Any) -> None:
    try:
        from webapp.db import make_engine
        from webapp.worker import Drainer, freeze_startup_objects, run_drainer

        tag = f"bench-scale-drain-{os.getpid()}"
        engine = make_engine(url, connect_args={"application_name": tag})
        gateway = NoopGateway()
        drainer = Drainer(engine, drain_settings(url, batch), gateway, check_meters=False)
        passes: list[int] = []
        close = drainer.close_pass

        def close_pass(p: Any) -> None:
            close(p)
            if p.summary.claimed:
                passes.append(p.summary.duration_ms)

        drainer.close_pass = close_pass  # type: ignore[method-assign]
        watcher = make_engine(url, pool_size=1, connect_args={"application_name": "bench-watch"})
        for e in (engine, watcher):
            with e.connect() as conn:
                conn.execute(text("SELECT 1"))
        freeze_startup_objects()
        ready.put(tag)
        go.wait()
        t_first = time.monotonic()
        worker = threading.Thread(target=run_drainer, args=(drainer,), name="bench-worker")
        worker.start()
        with watcher.connect() as conn:
            while True:
                time.sleep(0.01)
                left = conn.execute(text(
                    "SELECT EXISTS (SELECT 1 FROM stripe_usage_outbox WHERE id > :mark "
                    "AND status IN ('pending', 'retrying', 'processing'))"),
                    {"mark": mark}).scalar()
                conn.rollback()
                if not left:
                    t_last = time.monotonic()
                    break
                if not worker.is_alive():
                    raise BenchFailure("the drainer stopped before the batch was sent")
        drainer.request_stop()
        worker.join(timeout=60)
        watcher.dispose()
        engine.dispose()
        out.put({"t_first": t_first, "t_last": t_last, "seen": gateway.seen,
                 "passes": passes})
    except BaseException as exc:  # report, never hang the parent
        out.put({"error": f"{type(exc).__name__}: {exc}"})
        raise


class _Sampler(threading.Thread):
    """The worker's backends in ``pg_stat_activity`` every 20 ms: the oldest open
    transaction seen, and the samples that found one waiting on a lock."""

    def __init__(self, admin_engine: Any, tag: str) -> None:
        super().__init__(daemon=True)
        self.engine, self.tag = admin_engine, tag
        self.stop = threading.Event()
        self.max_xact_ms = 0.0
        self.lock_waits = 0
        self.samples = 0

    def run(self) -> None:
        with self.engine.connect() as conn:
            while not self.stop.is_set():
                row = conn.execute(text(
                    "SELECT coalesce(max(extract(epoch FROM clock_timestamp() - xact_start)), 0),"
                    " count(*) FILTER (WHERE wait_event_type = 'Lock') "
                    "FROM pg_stat_activity WHERE application_name = :t "
                    "AND xact_start IS NOT NULL"), {"t": self.tag}).one()
                conn.rollback()
                self.samples += 1
                self.max_xact_ms = max(self.max_xact_ms, float(row[0]) * 1000)
                self.lock_waits += int(row[1] > 0)
                time.sleep(0.02)


def drain_batch(url: str, admin_engine: Any, mark: int, keys: list[str], *,
                during: Callable[[], Any] | None = None, lead: float = 1.0,
                timeout: float = 900) -> dict[str, Any]:
    """Drain the batch past ``mark`` in a child process; with ``during``, run it in a thread
    first and start the drain ``lead`` seconds later. Returns the figures."""
    ready, out, go = CTX.Queue(), CTX.Queue(), CTX.Event()
    proc = CTX.Process(target=_child, args=(url, mark, BATCH, ready, go, out), daemon=True)
    proc.start()
    op: dict[str, Any] = {}
    thread = None
    try:
        tag = _get(ready, [proc], 120, "started")
        sampler = _Sampler(admin_engine, tag)
        if during is not None:
            def run_op() -> None:
                op["t0"] = time.monotonic()
                try:
                    op["result"] = during()
                except BaseException as exc:  # noqa: BLE001 - reported in the figures
                    op["error"] = f"{type(exc).__name__}: {exc}"
                op["t1"] = time.monotonic()

            thread = threading.Thread(target=run_op, daemon=True)
            thread.start()
            time.sleep(lead)
        sampler.start()
        go.set()
        res = _get(out, [proc], timeout, "finished")
        sampler.stop.set()
        sampler.join(timeout=10)
        proc.join(timeout=60)
        if "error" in res:
            raise BenchFailure("drain process failed: " + res["error"])
        if thread is not None:
            thread.join()
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
    mine = set(keys)
    check_exactly_once("drain batch", [k for k in res["seen"] if k in mine], keys)
    elapsed = res["t_last"] - res["t_first"]
    fig = {"rate": len(keys) / elapsed, "elapsed": elapsed, "events": len(keys),
           "others": sum(1 for k in res["seen"] if k not in mine),
           "max_pass_ms": max(res["passes"] or [0]),
           "median_pass_ms": sorted(res["passes"])[len(res["passes"]) // 2]
           if res["passes"] else 0,
           "max_xact_ms": sampler.max_xact_ms, "lock_wait_samples": sampler.lock_waits,
           "samples": sampler.samples}
    if during is not None:
        fig["op_seconds"] = op.get("t1", 0.0) - op.get("t0", 0.0)
        fig["op_error"] = op.get("error")
        fig["op_result"] = op.get("result")
        # Share of the drain that ran while the operation was still running.
        overlap = min(res["t_last"], op.get("t1", 0.0)) - max(res["t_first"], op.get("t0", 0.0))
        fig["overlap"] = max(0.0, overlap) / elapsed
    return fig
