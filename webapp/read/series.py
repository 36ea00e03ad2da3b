"""Time series for the dashboard's charts: the ranges a person can pick (1 h, 24 h, 7 d,
30 d), each with its bucket size, and sent events per bucket.

Short ranges count the sent rows by the time they were sent (a range scan of
``ix_outbox_sent_at``: a day's rows at most). Long ranges would scan a month of rows, so they
read the sent-usage rollup instead, which is kept per UTC day of *occurrence* (the day Stripe
bills an event for) — plus the few sent rows not folded yet. A long range's bars are
therefore "sent events by the day they occurred", and the charts say so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Select, func, literal, literal_column, select, union_all

from ..outbox.rollups import SENT_USAGE, live_sent, read_mark
from ..outbox.sql import SENT_DAY, SENT_ROLLUP, T, epoch_bucket, int_sum, status_is, utc_day
from ..status import SENT


@dataclass(frozen=True)
class Bucket:
    """One bar: the bucket's start (UTC) and what it counts."""

    start: datetime
    count: int


@dataclass(frozen=True)
class Range:
    """A range a chart can show: ``span`` split into buckets of ``bucket``."""

    key: str            # the query parameter's value
    label: str          # "last 24 hours"
    span: timedelta
    bucket: timedelta
    by_day: bool        # read from the daily rollup (by the day events occurred)

    @property
    def buckets(self) -> int:
        return int(self.span / self.bucket)

    @property
    def bucket_label(self) -> str:
        return {60: "minute", 3600: "hour", 86400: "day"}[int(self.bucket.total_seconds())]


RANGES: dict[str, Range] = {r.key: r for r in (
    Range("1h", "last hour", timedelta(hours=1), timedelta(minutes=1), False),
    Range("24h", "last 24 hours", timedelta(hours=24), timedelta(hours=1), False),
    Range("7d", "last 7 days", timedelta(days=7), timedelta(days=1), True),
    Range("30d", "last 30 days", timedelta(days=30), timedelta(days=1), True),
)}
DEFAULT_RANGE = "24h"


def sent_series(conn: Connection, now: datetime, rng: Range) -> list[Bucket]:
    """Sent events per bucket of ``rng``, the last ``rng.buckets`` buckets up to ``now``
    (the last one partial), zero-filled."""
    if rng.by_day:
        return sent_by_occurrence_day(conn, now.astimezone(UTC).date(), rng.buckets)
    return sent_by_time_sent(conn, now, int(rng.bucket.total_seconds()), rng.buckets)


def sent_by_time_sent(conn: Connection, now: datetime, seconds: int,
                      count: int) -> list[Bucket]:
    """Sent events per ``seconds``-long bucket of ``sent_at``, the last ``count`` buckets up
    to now (a range scan of ``ix_outbox_sent_at``), zero-filled."""
    last = math.floor(now.timestamp() / seconds)
    first = last - count + 1
    since = datetime.fromtimestamp(first * seconds, UTC)
    inner = (select(epoch_bucket(T.c.sent_at, literal(seconds)).label("b"))
             .where(status_is(SENT), T.c.sent_at >= since).subquery())
    got = {int(b): int(n) for b, n in conn.execute(
        select(inner.c.b, func.count()).group_by(inner.c.b))}
    return [Bucket(datetime.fromtimestamp(k * seconds, UTC), got.get(k, 0))
            for k in range(first, last + 1)]


def sent_by_occurrence_day(conn: Connection, last_day: date, days: int,
                           tenant_id: str | None = None) -> list[Bucket]:
    """Sent events per UTC day of occurrence, the ``days`` days up to ``last_day``: the
    rollup's days plus the rows not folded yet, read with its mark in one snapshot (the
    caller's ``reading`` connection), zero-filled."""
    first_day = last_day - timedelta(days=days - 1)
    lo = datetime(first_day.year, first_day.month, first_day.day, tzinfo=UTC)
    hi = datetime(last_day.year, last_day.month, last_day.day, tzinfo=UTC) + timedelta(days=1)
    mark = read_mark(conn, SENT_USAGE)
    # Every tenant: the day totals (one row a day); one tenant: its rows of the daily rollup
    # (ix_usage_sent_rollup_tenant).
    table = SENT_DAY if tenant_id is None else SENT_ROLLUP
    folded: Select[Any, Any] = select(
        table.c.day.label("day"), table.c.events.label("events")).where(
        table.c.day >= first_day.isoformat(), table.c.day <= last_day.isoformat())
    live: Select[Any, Any] = select(
        utc_day(T.c.occurred_at).label("day"), literal_column("1").label("events")).where(
        live_sent(mark), T.c.occurred_at >= lo, T.c.occurred_at < hi)
    if tenant_id is not None:
        folded = folded.where(SENT_ROLLUP.c.tenant_id == tenant_id)
        live = live.where(T.c.tenant_id == tenant_id)
    both = union_all(folded, live).subquery()
    got = {str(d): int(n) for d, n in conn.execute(
        select(both.c.day, int_sum(both.c.events)).group_by(both.c.day))}
    out = []
    for i in range(days):
        day = first_day + timedelta(days=i)
        out.append(Bucket(datetime(day.year, day.month, day.day, tzinfo=UTC),
                          got.get(day.isoformat(), 0)))
    return out
