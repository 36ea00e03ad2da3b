"""``/metrics``' numbers: aggregates only, never a row, a tenant or a key. Counters come from
the rollups plus the few rows past their mark, so they only ever grow."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, func, literal_column, select, union_all

from ..db import reading
from ..outbox.control import pause_state
from ..outbox.rollups import (
    ATTEMPT_CALLS,
    LATENCY_BUCKETS_MS,
    latency_bucket,
    live_attempts,
    read_mark,
)
from ..outbox.sql import ATTEMPT_ROLLUP, ATTEMPTS, int_sum
from .counts import age_limits, oldest_waiting, status_counts


@dataclass(frozen=True)
class Metrics:
    counts: dict[str, int]
    oldest_waiting_age: float | None
    paused: bool
    attempts: dict[str, int]                 # outcome -> calls, ever
    latency_buckets: list[tuple[float, int]]  # (upper bound in seconds, cumulative calls)
    latency_count: int
    latency_sum_seconds: float
    near_limit: int
    over_limit: int


def metrics(engine: Engine, *, now: datetime) -> Metrics:
    """Aggregates for /metrics: never a row, a tenant or a key."""
    with reading(engine) as conn:
        counts = status_counts(conn)
        oldest = oldest_waiting(conn)
        paused = pause_state(conn).paused  # the switch; whether sending is fine: /health
        near, over = age_limits(conn, now, counts)
        live = select(ATTEMPTS.c.outcome, latency_bucket().label("bucket"),
                      literal_column("1").label("attempts"),
                      func.coalesce(ATTEMPTS.c.duration_ms, 0).label("duration_ms")).where(
            live_attempts(read_mark(conn, ATTEMPT_CALLS)))
        folded = select(ATTEMPT_ROLLUP.c.outcome, ATTEMPT_ROLLUP.c.bucket,
                        ATTEMPT_ROLLUP.c.attempts, ATTEMPT_ROLLUP.c.duration_ms)
        both = union_all(folded, live).subquery()
        rows = conn.execute(select(both.c.outcome, both.c.bucket, int_sum(both.c.attempts),
                                   int_sum(both.c.duration_ms))
                            .group_by(both.c.outcome, both.c.bucket)).all()
    attempts: dict[str, int] = defaultdict(int)
    per_bucket = [0] * (len(LATENCY_BUCKETS_MS) + 1)
    total_ms = 0
    for outcome, bucket, n, ms in rows:
        attempts[str(outcome)] += int(n)
        if int(bucket) >= 0:
            per_bucket[int(bucket)] += int(n)
            total_ms += int(ms)
    cumulative, running = [], 0
    for i, ms in enumerate(LATENCY_BUCKETS_MS):
        running += per_bucket[i]
        cumulative.append((ms / 1000, running))
    count = running + per_bucket[-1]
    age = None if oldest is None else max(0.0, (now - oldest).total_seconds())
    return Metrics(counts, age, paused, dict(attempts), cumulative, count, total_ms / 1000,
                   near, over)
