"""The Retries page: attempt-count histograms (retrying now, dead now, the latest sent)
and the events waiting for their next attempt."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, cast, func, select

from ..db import reading
from ..outbox.sql import IDLE_UNSENT, T, row_dict, sql_str, status_in, status_is
from ..status import DEAD, RETRYING, SENT, WAITING


@dataclass(frozen=True)
class Histogram:
    """Events by attempt count, each split by a key (outcome class or error code)."""

    label: str
    rows: dict[int, dict[str, int]]     # attempt_count -> key -> events
    keys: list[str]
    #: The status all its events have (its bars link to them), None for a sample.
    status: str | None = None

    @property
    def total(self) -> int:
        return sum(sum(r.values()) for r in self.rows.values())

    @property
    def max_bar(self) -> int:
        return max((sum(r.values()) for r in self.rows.values()), default=0)


@dataclass(frozen=True)
class RetriesPage:
    now: datetime
    split: str
    histograms: list[Histogram]
    retrying: list[dict[str, Any]]
    retrying_total: int


SPLITS = {"outcome": "outcome class", "code": "error code"}
#: The sent histogram looks at this many of the latest sent events (bounded at any volume).
RECENT_SENT = 2000


def retries(engine: Engine, *, now: datetime, split: str = "outcome",
            limit: int = 100) -> RetriesPage:
    """Attempt-count histograms (retrying now, dead now, sent in the last 24 h) and the
    retrying events by next attempt time."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}")
    key = (func.coalesce(T.c.last_outcome, sql_str("none")) if split == "outcome" else
           func.coalesce(T.c.last_error_code, cast(T.c.last_http_status, T.c.last_error_code.type),
                         sql_str("none")))
    recent = (select(T.c.id).where(status_is(SENT), T.c.sent_at.is_not(None))
              .order_by(T.c.sent_at.desc()).limit(RECENT_SENT).scalar_subquery())
    groups = (("Retrying now", (status_is(RETRYING), IDLE_UNSENT), RETRYING),
              ("Dead now", (status_is(DEAD), IDLE_UNSENT), DEAD),
              (f"Last {RECENT_SENT:,} sent", (T.c.id.in_(recent),), None))
    with reading(engine) as conn:
        histograms = [_histogram(conn, label, where, key, status)
                      for label, where, status in groups]
        rows = conn.execute(
            select(T.c.id, T.c.tenant_id, T.c.meter, T.c.quantity, T.c.attempt_count,
                   T.c.call_count, T.c.next_attempt_at, T.c.last_outcome, T.c.last_error_code,
                   T.c.last_http_status, T.c.last_error_message, T.c.first_unknown_at,
                   T.c.occurred_at)
            .where(status_in(WAITING), T.c.status == RETRYING)
            .order_by(T.c.next_attempt_at, T.c.id).limit(limit)).all()
        total = int(conn.execute(select(func.count()).where(status_is(RETRYING), IDLE_UNSENT))
                    .scalar_one())
    return RetriesPage(now, split, histograms, [row_dict(r) for r in rows], total)


def _histogram(conn: Connection, label: str, where: Sequence[Any], key: Any,
               status: str | None = None) -> Histogram:
    inner = select(T.c.attempt_count.label("n"), key.label("k")).where(*where).subquery()
    rows: dict[int, dict[str, int]] = defaultdict(dict)
    keys: dict[str, int] = defaultdict(int)
    for n, k, c in conn.execute(select(inner.c.n, inner.c.k, func.count())
                                .group_by(inner.c.n, inner.c.k)):
        rows[int(n)][str(k)] = int(c)
        keys[str(k)] += int(c)
    ordered = sorted(keys, key=lambda k: (-keys[k], k))
    return Histogram(label, dict(sorted(rows.items())), ordered, status)
