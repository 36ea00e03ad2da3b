"""Worker memory: peak RSS (``VmHWM`` of /proc/<pid>/status) of one worker process while it
drains 100,000 events.

The worker is ``python -m bench.noop_worker``: the process ``billing-outbox worker`` builds
(``create_app`` from the environment, the app's ``Drainer`` with its engine, pool, lane locks
and ``OUTBOX_CONCURRENCY`` sending threads, ``run_drainer`` until SIGTERM) with a **no-op
gateway** instead of the SDK: through the fake Stripe a single worker manages some 500 events/s
on this machine class, so 3 × 100,000 would take most of the 15-minute budget. The real-SDK
worker's peak RSS is measured by every end-to-end run (10,000 events) and shown there.

The events are 10,000 enqueued by the real ``enqueue_usage`` (200 tenants × 2 meters), copied
ten times with distinct identifiers. Checks as in ``bench.e2e``: every identifier handed to the
gateway exactly once, every row ``sent``, one attempt each, a clean exit on SIGTERM.
"""

from __future__ import annotations

from typing import Any

from .common import (
    METERS,
    BenchDatabase,
    Row,
    SectionResults,
    copied_keys,
    make_template,
    verdict,
)
from .e2e import NOOP_WORKER, TENANTS, drain_with_worker, worker_env

COPIES = 10
CONCURRENCY = 64
BATCH = 500
MAX_RPS = 10_000      # the most STRIPE_MAX_REQUESTS_PER_SECOND accepts
FLOOR_MB = 150


class MemoryResults(SectionResults):
    """The memory section's figures."""


def run(db: BenchDatabase, *, events: int, runs: int, log: Any = print) -> MemoryResults:
    per_copy = max(1, events // COPIES)
    log(f"memory: enqueueing {per_copy:,} events with enqueue_usage ({TENANTS} tenants × "
        f"{len(METERS)} meters); each run drains {COPIES} copies = {per_copy * COPIES:,}")
    template, keys = make_template(db, per_copy, TENANTS, METERS)
    expected = copied_keys(keys, COPIES)
    res = MemoryResults(events=len(expected), runs=runs)
    for i in range(runs):
        with db.outbox_schema("mem", template, COPIES) as url:
            env = worker_env(url, "http://127.0.0.1:9", OUTBOX_CONCURRENCY=str(CONCURRENCY),
                             OUTBOX_BATCH_SIZE=str(BATCH),
                             STRIPE_MAX_REQUESTS_PER_SECOND=str(MAX_RPS))
            r = drain_with_worker(url, None, expected, env=env, label="memory",
                                  command=NOOP_WORKER)
        res.raw.append(r)
        for key in ("hwm_mb", "rate", "cpu_per_1000", "threads"):
            res.fig(key).add(r[key])
        log(f"memory run {i + 1}/{runs}: peak RSS {r['hwm_mb']:.1f} MB, "
            f"{r['rate']:,.0f} events/s, {r['cpu_per_1000']:.2f} CPU s/1000")
    return res


def rows(res: MemoryResults) -> list[Row]:
    f = res.fig
    return [Row("Worker memory", f"peak RSS (VmHWM) of one worker draining {res.events:,} "
                                 f"events (the worker's Drainer with a no-op gateway, "
                                 f"concurrency {CONCURRENCY}, batch {BATCH})",
                f("hwm_mb").fmt(1, " MB"), f"< {FLOOR_MB} MB",
                verdict(f("hwm_mb").median < FLOOR_MB),
                f"at {f('rate').fmt(0, ' ev/s')}; CPU {f('cpu_per_1000').fmt(2, ' s')} "
                f"per 1,000 events; the real-SDK worker's peak RSS is in the end-to-end rows",
                floor_name=f"worker peak RSS < {FLOOR_MB} MB")]
