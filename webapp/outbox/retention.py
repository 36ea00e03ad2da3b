"""Retention: ``billing-outbox prune`` removes terminal rows past ``OUTBOX_RETENTION_DAYS``.

A row goes when it is ``sent``, ``resolved`` or ``cancelled`` (final: nothing moves it again,
except Stripe's report that a sent event was rejected, which comes within its 35 days), and
its last change (``updated_at``), its occurrence and, for a sent row, its send are all older
than the cutoff. ``dead`` and ``rejected`` rows wait for a person and are never pruned; rows in
flight or waiting are not terminal. A sent row goes only once the sent rollup holds it (its
send is behind the rollup's mark), so the rollup keeps counting it.

Each batch is one short transaction:

1. pick up to ``batch_size`` candidates through a partial index (``ix_outbox_sent_at`` for
   sent rows, ``ix_outbox_unsent`` for the others), on PostgreSQL ``FOR UPDATE SKIP LOCKED``:
   a row someone else holds is left for the next run, so a prune never waits on a lock and
   never holds one a drain pass wants (the drain claims pending and retrying rows only);
2. delete them with the status re-checked, ``RETURNING`` what they counted;
3. add those counts to ``usage_pruned_rollup`` (per UTC day of occurrence, tenant, meter and
   status) and to the ``pruned`` running total, and delete their calls (the attempts history
   goes with its event).

Usage for any period reads the live rows plus that rollup, so a prune never changes a total,
whatever commits meanwhile: the counts move in the transaction that removes the rows.

Why delete and not drop monthly partitions: see the README's "Delete or partition".
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, delete, func, select
from sqlalchemy import update as sa_update

from ..audit import write_audit
from ..status import PRUNABLE, SENT
from .rollups import SENT_USAGE, read_mark
from .sendable import NEEDS_A_PERSON
from .sql import (
    ATTEMPTS,
    EPOCH,
    PRUNED_ROLLUP,
    ROLLUP_STATE,
    STREAM_REQUESTS,
    T,
    as_utc,
    id_in,
    insert_for,
    status_in,
    status_is,
)

PRUNED = "pruned"
#: Rows per transaction: small enough that a batch commits in a few milliseconds.
BATCH_SIZE = 1000


@dataclass
class PruneResult:
    """What a prune removed (or, with ``dry_run``, would remove)."""

    as_of: datetime
    cutoff: datetime
    retention_days: int
    dry_run: bool
    pruned: int = 0
    by_status: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PRUNABLE, 0))
    attempts: int = 0
    #: Records of meter event stream requests sent before the cutoff (their reports are
    #: long in: Stripe keeps its events 30 days).
    stream_requests: int = 0
    kept_dead: int = 0
    kept_rejected: int = 0
    #: Sent rows past the cutoff the sent rollup does not hold yet: pruned once folded.
    waiting_for_fold: int = 0
    batches: int = 0
    seconds: float = 0.0
    #: True when ``max_seconds`` ran out first: the next run goes on.
    incomplete: bool = False

    def summary(self) -> str:
        """One line for people: what went, what stayed and why."""
        parts = ", ".join(f"{n:,} {s}" for s, n in self.by_status.items() if n)
        verb = "would remove" if self.dry_run else "removed"
        line = (f"{verb} {self.pruned:,} event{'s' if self.pruned != 1 else ''}"
                + (f" ({parts})" if parts else "")
                + ("" if self.dry_run else f" and {self.attempts:,} recorded calls")
                + f" last changed before {self.cutoff:%Y-%m-%d %H:%M} UTC"
                f" ({self.retention_days} days' retention)")
        kept = self.kept_dead + self.kept_rejected
        if kept:
            line += (f"; kept {self.kept_dead:,} dead and {self.kept_rejected:,} rejected "
                     "events that old: a person has to handle them")
        if self.waiting_for_fold:
            line += (f"; {self.waiting_for_fold:,} sent events wait for the usage rollup "
                     "and go at a later run")
        if self.incomplete:
            line += "; stopped at its time limit, the next run goes on"
        return line

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["as_of"] = self.as_of.isoformat()
        out["cutoff"] = self.cutoff.isoformat()
        out["seconds"] = round(self.seconds, 3)
        return out


def cutoff_for(as_of: datetime, retention_days: int) -> datetime:
    """Rows whose last change is before this are past retention."""
    return as_of - timedelta(days=retention_days)


def prune(engine: Engine, *, now: datetime, retention_days: int,
          batch_size: int = BATCH_SIZE, dry_run: bool = False,
          max_seconds: float | None = None, actor: str | None = None) -> PruneResult:
    """Remove terminal rows whose last change is more than ``retention_days`` before
    ``now``, in batches of ``batch_size``, each in a transaction of its own; with
    ``dry_run``, count them and change nothing. Stops early (``incomplete``) after
    ``max_seconds``. With ``actor``, a prune that removed anything is written to the audit
    log (one entry: the rows are gone, so it names counts and the cutoff, not ids)."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    started = time.monotonic()
    cutoff = cutoff_for(now, retention_days)
    result = PruneResult(as_of=now, cutoff=cutoff, retention_days=retention_days,
                         dry_run=dry_run)
    with engine.connect() as conn:
        mark = read_mark(conn, SENT_USAGE)
        result.kept_dead, result.kept_rejected = (
            int(conn.execute(select(func.count()).where(status_is(s), T.c.updated_at < cutoff))
                .scalar_one()) for s in NEEDS_A_PERSON)
        # Sent past the cutoff but not in the rollup: stamped after its watermark, or
        # written after its last fold. Two disjoint counts, each a short range of an index
        # (``ix_outbox_sent_at``, the primary key), never a scan of everything past it.
        result.waiting_for_fold = sum(int(conn.execute(select(func.count()).where(
            *_past(cutoff, SENT), *where)).scalar_one()) for where in (
                (T.c.sent_at >= mark.at,), (T.c.sent_at < mark.at, T.c.id > mark.id)))
        if dry_run:
            for status in PRUNABLE:
                n = int(conn.execute(select(func.count()).where(
                    *_candidates(conn, status, cutoff, mark))).scalar_one())
                result.by_status[status] = n
                result.pruned += n
            result.seconds = time.monotonic() - started
            return result
    for status in PRUNABLE:
        while True:
            if max_seconds is not None and time.monotonic() - started > max_seconds:
                result.incomplete = True
                break
            with engine.begin() as conn:
                removed, calls = _prune_batch(conn, status, cutoff, batch_size)
            if not removed:
                break
            result.batches += 1
            result.pruned += removed
            result.by_status[status] += removed
            result.attempts += calls
            if removed < batch_size:
                break
        if result.incomplete:
            break
    if not result.incomplete:
        with engine.begin() as conn:
            result.stream_requests = int(conn.execute(delete(STREAM_REQUESTS).where(
                STREAM_REQUESTS.c.sent_at < cutoff)).rowcount or 0)
    if result.pruned:
        with engine.begin() as conn:
            conn.execute(sa_update(ROLLUP_STATE).where(ROLLUP_STATE.c.name == PRUNED)
                         .values(watermark=now))
            if actor is not None:
                write_audit(conn, actor=actor, action="prune", now=now, note=result.summary())
    result.seconds = time.monotonic() - started
    return result


def _past(cutoff: datetime, status: str) -> list[Any]:
    """Terminal rows of ``status`` last changed, occurred (and sent) before ``cutoff``."""
    where = [status_is(status), T.c.updated_at < cutoff, T.c.occurred_at < cutoff]
    if status == SENT:
        where.append(T.c.sent_at < cutoff)
    return where


def _candidates(conn: Connection, status: str, cutoff: datetime, mark: Any) -> list[Any]:
    """What a prune (and its dry run) removes of ``status``."""
    where = _past(cutoff, status)
    if status == SENT:  # only what the sent rollup holds
        where += [T.c.sent_at < mark.at, T.c.id <= mark.id]
    if conn.dialect.name != "postgresql":
        # SQLite hands out max(id) + 1 when a table has no AUTOINCREMENT: deleting the newest
        # event or call would give its id to the next one, and ids name events in links, the
        # audit log and the rollups' id marks. The newest of each stays (until newer come).
        newest_call = select(ATTEMPTS.c.event_id).order_by(ATTEMPTS.c.id.desc()).limit(1)
        where += [T.c.id < select(func.max(T.c.id)).scalar_subquery(),
                  T.c.id != func.coalesce(newest_call.scalar_subquery(), 0)]
    return where


def _prune_batch(conn: Connection, status: str, cutoff: datetime,
                 batch_size: int) -> tuple[int, int]:
    """One batch of ``status`` rows: delete, count into the rollup, delete their calls.
    Returns (events, calls) removed."""
    mark = read_mark(conn, SENT_USAGE)  # only ever moves forward: what it held, it holds
    order = T.c.sent_at if status == SENT else T.c.occurred_at
    pick = (select(T.c.id).where(*_candidates(conn, status, cutoff, mark))
            .order_by(order).limit(batch_size))
    if conn.dialect.name == "postgresql":
        pick = pick.with_for_update(skip_locked=True)
    ids = [int(i) for i in conn.execute(pick).scalars()]
    if not ids:
        return 0, 0
    gone = conn.execute(
        delete(T).where(id_in(conn, T.c.id, ids), status_in((status,)))
        .returning(T.c.id, T.c.tenant_id, T.c.stripe_customer_id, T.c.meter, T.c.quantity,
                   T.c.occurred_at, T.c.status)).all()
    if not gone:
        return 0, 0
    _count_pruned(conn, gone)
    calls = conn.execute(delete(ATTEMPTS).where(
        id_in(conn, ATTEMPTS.c.event_id, [int(r.id) for r in gone]))).rowcount
    return len(gone), int(calls or 0)


def _count_pruned(conn: Connection, rows: Sequence[Any]) -> None:
    """Add the removed rows' counts to the pruned-usage rollup and the running total."""
    groups: dict[tuple[str, str, str, str, str], list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        day = (as_utc(r.occurred_at) or EPOCH).date().isoformat()
        g = groups[(day, r.tenant_id, r.stripe_customer_id or "", r.meter, r.status)]
        g[0] += 1
        g[1] += int(r.quantity)
    ins = insert_for(conn, PRUNED_ROLLUP)
    conn.execute(ins.on_conflict_do_update(
        index_elements=[PRUNED_ROLLUP.c.day, PRUNED_ROLLUP.c.tenant_id,
                        PRUNED_ROLLUP.c.stripe_customer_id, PRUNED_ROLLUP.c.meter,
                        PRUNED_ROLLUP.c.status],
        set_={"events": PRUNED_ROLLUP.c.events + ins.excluded.events,
              "quantity": PRUNED_ROLLUP.c.quantity + ins.excluded.quantity}),
        [{"day": d, "tenant_id": t, "stripe_customer_id": c, "meter": m, "status": s,
          "events": n, "quantity": q} for (d, t, c, m, s), (n, q) in sorted(groups.items())])
    conn.execute(insert_for(conn, ROLLUP_STATE).values(
        name=PRUNED, watermark=EPOCH, id_mark=0, events=0, quantity=0)
        .on_conflict_do_nothing(index_elements=[ROLLUP_STATE.c.name]))
    conn.execute(sa_update(ROLLUP_STATE).where(ROLLUP_STATE.c.name == PRUNED).values(
        events=ROLLUP_STATE.c.events + len(rows),
        quantity=ROLLUP_STATE.c.quantity + sum(int(r.quantity) for r in rows)))


def pruned_totals(conn: Connection) -> tuple[int, int, datetime | None]:
    """Events and units pruned so far, and when the last prune removed any."""
    row = conn.execute(select(ROLLUP_STATE.c.events, ROLLUP_STATE.c.quantity,
                              ROLLUP_STATE.c.watermark)
                       .where(ROLLUP_STATE.c.name == PRUNED)).first()
    if row is None:
        return 0, 0, None
    at = as_utc(row.watermark)
    return int(row.events), int(row.quantity), (None if at == EPOCH else at)
