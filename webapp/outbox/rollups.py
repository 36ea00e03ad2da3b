"""Rollups of final facts, so the dashboard never counts the sent rows on a poll.

Sent events are folded into ``usage_sent_rollup`` (per UTC day of occurrence, tenant, the
Stripe customer the event went to, and meter) with a running total, and calls to Stripe into
``attempt_rollup`` (per outcome and latency bucket) for /metrics. An event that leaves
``sent`` (Stripe rejected it, a person cancelled it) is taken out again in the same
transaction (:func:`unfold_sent`). A rollup's *mark* says what it holds: rows stamped
(``sent_at``/``attempted_at``) before its watermark **and** with an id up to its id mark. A
read adds the rollup to the rows outside it — stamped after the watermark, or written after
the last fold (a back-fill of history is caught this way) — reading the mark in the same
snapshot (``webapp.db.reading``), so a fold that commits meanwhile is never counted twice nor
missed. Reads are therefore exact however stale the rollups are; staleness costs only time.

The watermark trails ``now`` by a margin longer than a worker can take between stamping a row
and committing it (at least 15 minutes, and at least twice the claim timeout). Folding is the
folder service's job (``webapp.worker.folder``), never a page view's: :func:`fold` writes,
everything else here only reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Connection, Engine, case, delete, func, literal_column, select
from sqlalchemy import update as sa_update

from ..status import SENT
from .sql import (
    ATTEMPT_ROLLUP,
    ATTEMPTS,
    EPOCH,
    PRUNED_ROLLUP,
    ROLLUP_STATE,
    SENT_DAY,
    SENT_MONTHLY,
    SENT_ROLLUP,
    SENT_YEARLY,
    T,
    as_utc,
    insert_for,
    int_sum,
    status_is,
    utc_day,
)

SENT_USAGE = "sent_usage"
ATTEMPT_CALLS = "attempts"
ROLLUPS = (SENT_USAGE, ATTEMPT_CALLS)
#: A fold runs only when a rollup lags its target by this much: the rows past the watermark
#: stay a few minutes' worth.
FOLD_EVERY = timedelta(minutes=5)
#: Upper bounds (ms) of the send-latency histogram's buckets (/metrics shows seconds).
LATENCY_BUCKETS_MS = (25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)


@dataclass(frozen=True)
class Mark:
    """Where a rollup stands: rows stamped before ``at`` whose id is at most ``id`` are in it
    (the id catches rows written later with an old stamp, e.g. history loaded by hand);
    ``events``/``quantity`` total what it holds."""

    at: datetime = EPOCH
    id: int = 0
    events: int = 0
    quantity: int = 0


def read_mark(conn: Connection, name: str) -> Mark:
    """A rollup's mark, in the caller's snapshot. Read it in the same snapshot as the rows
    past it, so a fold committing in between is seen entirely or not at all."""
    row = conn.execute(select(ROLLUP_STATE.c.watermark, ROLLUP_STATE.c.id_mark,
                              ROLLUP_STATE.c.events, ROLLUP_STATE.c.quantity)
                       .where(ROLLUP_STATE.c.name == name)).first()
    if row is None:
        return Mark()
    return Mark(as_utc(row.watermark) or EPOCH, int(row.id_mark), int(row.events),
                int(row.quantity))


def live_sent(mark: Mark) -> ColumnElement[bool]:
    """Sent events not in the rollup: stamped at or after its watermark, or written after
    its last fold (a small range of ``ix_outbox_sent_at`` OR'ed with one of the primary key)."""
    return status_is(SENT) & ((T.c.sent_at >= mark.at) | (T.c.id > mark.id))


def live_attempts(mark: Mark) -> ColumnElement[bool]:
    """Calls not in the attempt rollup."""
    return (ATTEMPTS.c.attempted_at >= mark.at) | (ATTEMPTS.c.id > mark.id)


def latency_bucket() -> ColumnElement[int]:
    """The index of a call's latency bucket in :data:`LATENCY_BUCKETS_MS`; its length for
    slower calls; -1 for a call without a duration."""
    whens: list[tuple[Any, Any]] = [(ATTEMPTS.c.duration_ms.is_(None), literal_column("-1"))]
    whens += [(ATTEMPTS.c.duration_ms <= literal_column(str(ms)), literal_column(str(i)))
              for i, ms in enumerate(LATENCY_BUCKETS_MS)]
    return case(*whens, else_=literal_column(str(len(LATENCY_BUCKETS_MS))))


def sent_total(conn: Connection) -> int:
    """Every sent event: the folded total plus the rows not folded yet."""
    mark = read_mark(conn, SENT_USAGE)
    live = conn.execute(select(func.count()).where(live_sent(mark)))
    return mark.events + int(live.scalar_one())


def fold_margin(claim_timeout_seconds: float) -> timedelta:
    """How far the rollups' watermark trails ``now``: longer than a worker can hold a stamp
    before committing it (its claim), with room to spare."""
    return max(timedelta(minutes=15), timedelta(seconds=2 * claim_timeout_seconds + 60))


def fold_target(now: datetime, margin: timedelta) -> datetime:
    """The watermark a fold at ``now`` moves the rollups to."""
    return (now - margin).replace(second=0, microsecond=0)


def fold(engine: Engine, *, now: datetime, margin: timedelta) -> bool:
    """Fold closed stretches of sent events and attempts into the rollups, if they lag by
    more than :data:`FOLD_EVERY`. Cheap when fresh (one small read). Returns whether it
    folded. Concurrent callers are safe: one folds, the others skip it (PostgreSQL) or wait
    for it and then find nothing to do (SQLite serializes writers)."""
    target = fold_target(now, margin)
    with engine.connect() as conn:
        marks = {name: as_utc(at) for name, at in
                 conn.execute(select(ROLLUP_STATE.c.name, ROLLUP_STATE.c.watermark)).all()}
    if all((at := marks.get(n)) is not None and target - at < FOLD_EVERY for n in ROLLUPS):
        return False
    with engine.begin() as conn:
        for name, fold_one in ((SENT_USAGE, _fold_sent), (ATTEMPT_CALLS, _fold_attempts)):
            mark = _lock_mark(conn, name)
            if mark is not None and mark.at < target:
                fold_one(conn, mark, target)
    return True


def rebuild(engine: Engine, *, now: datetime, margin: timedelta) -> None:
    """Empty the rollups and fold everything again."""
    with engine.begin() as conn:
        conn.execute(delete(SENT_ROLLUP))
        conn.execute(delete(SENT_MONTHLY))
        conn.execute(delete(SENT_YEARLY))
        conn.execute(delete(SENT_DAY))
        conn.execute(delete(ATTEMPT_ROLLUP))
        conn.execute(sa_update(ROLLUP_STATE).where(ROLLUP_STATE.c.name.in_(ROLLUPS))
                     .values(watermark=EPOCH, id_mark=0, events=0, quantity=0))
        # Pruned sent events have no rows left to fold: their counts come back from the
        # pruned-usage rollup (webapp.outbox.retention).
        pruned = [(str(d), t, c, m, int(n), int(q)) for d, t, c, m, n, q in conn.execute(
            select(PRUNED_ROLLUP.c.day, PRUNED_ROLLUP.c.tenant_id,
                   PRUNED_ROLLUP.c.stripe_customer_id, PRUNED_ROLLUP.c.meter,
                   PRUNED_ROLLUP.c.events, PRUNED_ROLLUP.c.quantity)
            .where(PRUNED_ROLLUP.c.status == SENT))]
        add_sent(conn, pruned)
        conn.execute(sa_update(ROLLUP_STATE).where(ROLLUP_STATE.c.name == SENT_USAGE)
                     .values(events=sum(g[4] for g in pruned),
                             quantity=sum(g[5] for g in pruned)))
    fold(engine, now=now, margin=margin)


def _lock_mark(conn: Connection, name: str) -> Mark | None:
    """The rollup's mark, locked for this transaction; None if another folder holds it."""
    conn.execute(insert_for(conn, ROLLUP_STATE).values(name=name, watermark=EPOCH, id_mark=0,
                                                       events=0, quantity=0)
                 .on_conflict_do_nothing(index_elements=[ROLLUP_STATE.c.name]))
    stmt = select(ROLLUP_STATE.c.name).where(ROLLUP_STATE.c.name == name)
    if conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update(skip_locked=True)
    if conn.execute(stmt).first() is None:
        return None
    return read_mark(conn, name)


def _fold_sent(conn: Connection, mark: Mark, high: datetime) -> None:
    """Move the sent rows stamped before ``high`` (and written before this fold) from "live"
    into the rollup. The totals added are the sums of exactly the rows written, so the
    running total always equals the rollup, whatever commits meanwhile."""
    last_id = int(conn.execute(select(func.coalesce(func.max(T.c.id), 0))).scalar_one())
    day = utc_day(T.c.occurred_at)
    inner = select(day.label("day"), T.c.tenant_id, customer_key(T.c.stripe_customer_id),
                   T.c.meter, T.c.quantity).where(
        live_sent(mark), T.c.sent_at < high, T.c.id <= last_id).subquery()
    groups = conn.execute(
        select(inner.c.day, inner.c.tenant_id, inner.c.customer, inner.c.meter,
               func.count().label("events"), int_sum(inner.c.quantity).label("quantity"))
        .group_by(inner.c.day, inner.c.tenant_id, inner.c.customer, inner.c.meter)).all()
    add_sent(conn, [(str(g.day), g.tenant_id, g.customer, g.meter, int(g.events),
                     int(g.quantity)) for g in groups])
    conn.execute(sa_update(ROLLUP_STATE).where(ROLLUP_STATE.c.name == SENT_USAGE).values(
        watermark=high, id_mark=last_id,
        events=ROLLUP_STATE.c.events + sum(int(g.events) for g in groups),
        quantity=ROLLUP_STATE.c.quantity + sum(int(g.quantity) for g in groups)))


def customer_key(column: Any) -> Any:
    """The rollups' customer key of an event: its Stripe customer, ``""`` where it has none."""
    return func.coalesce(column, "").label("customer")


def add_sent(conn: Connection,
             groups: Sequence[tuple[str, str, str, str, int, int]]) -> None:
    """Add (day, tenant, customer, meter, events, units) to the daily sent rollup, its
    monthly and yearly twins and the all-tenant day totals, in the caller's transaction;
    negative numbers take away."""
    if not groups:
        return
    months: dict[tuple[str, str, str, str], list[int]] = {}
    years: dict[tuple[str, str, str, str], list[int]] = {}
    days: dict[str, list[int]] = {}
    for day, tenant, customer, meter, events, quantity in groups:
        for by, group in ((months, (day[:7], tenant, customer, meter)),
                          (years, (day[:4], tenant, customer, meter))):
            counts = by.setdefault(group, [0, 0])
            counts[0] += events
            counts[1] += quantity
        total = days.setdefault(day, [0, 0])
        total[0] += events
        total[1] += quantity
    ins = insert_for(conn, SENT_DAY)
    conn.execute(ins.on_conflict_do_update(
        index_elements=[SENT_DAY.c.day],
        set_={"events": SENT_DAY.c.events + ins.excluded.events,
              "quantity": SENT_DAY.c.quantity + ins.excluded.quantity}),
        [dict(day=k, events=v[0], quantity=v[1]) for k, v in sorted(days.items())])
    for table, key, rows in (
            (SENT_ROLLUP, "day", [dict(day=d, tenant_id=t, stripe_customer_id=c, meter=m,
                                       events=n, quantity=q) for d, t, c, m, n, q in groups]),
            (SENT_MONTHLY, "month", [dict(month=k[0], tenant_id=k[1], stripe_customer_id=k[2],
                                          meter=k[3], events=v[0], quantity=v[1])
                                     for k, v in sorted(months.items())]),
            (SENT_YEARLY, "year", [dict(year=k[0], tenant_id=k[1], stripe_customer_id=k[2],
                                        meter=k[3], events=v[0], quantity=v[1])
                                   for k, v in sorted(years.items())])):
        ins = insert_for(conn, table)
        conn.execute(ins.on_conflict_do_update(
            index_elements=[table.c[key], table.c.tenant_id, table.c.stripe_customer_id,
                            table.c.meter],
            set_={"events": table.c.events + ins.excluded.events,
                  "quantity": table.c.quantity + ins.excluded.quantity}), rows)


def _fold_attempts(conn: Connection, mark: Mark, high: datetime) -> None:
    """The same for calls to Stripe, by outcome and latency bucket."""
    last_id = int(conn.execute(select(func.coalesce(func.max(ATTEMPTS.c.id), 0))).scalar_one())
    inner = select(ATTEMPTS.c.outcome, latency_bucket().label("bucket"),
                   ATTEMPTS.c.duration_ms).where(
        live_attempts(mark), ATTEMPTS.c.attempted_at < high,
        ATTEMPTS.c.id <= last_id).subquery()
    groups = conn.execute(
        select(inner.c.outcome, inner.c.bucket, func.count().label("attempts"),
               int_sum(inner.c.duration_ms).label("duration_ms"))
        .group_by(inner.c.outcome, inner.c.bucket)).all()
    if groups:
        ins = insert_for(conn, ATTEMPT_ROLLUP)
        conn.execute(ins.on_conflict_do_update(
            index_elements=[ATTEMPT_ROLLUP.c.outcome, ATTEMPT_ROLLUP.c.bucket],
            set_={"attempts": ATTEMPT_ROLLUP.c.attempts + ins.excluded.attempts,
                  "duration_ms": ATTEMPT_ROLLUP.c.duration_ms + ins.excluded.duration_ms}),
            [dict(g._mapping) for g in groups])
    conn.execute(sa_update(ROLLUP_STATE).where(ROLLUP_STATE.c.name == ATTEMPT_CALLS).values(
        watermark=high, id_mark=last_id,
        events=ROLLUP_STATE.c.events + sum(int(g.attempts) for g in groups)))


def lock_sent_mark(conn: Connection) -> Mark:
    """The sent-usage rollup's mark, locked until the caller's transaction ends (a fold waits,
    or skips its turn). Take it *before* moving events out of ``sent``: then a fold either
    finished first (and :func:`unfold_sent` takes out what it folded) or runs after (and no
    longer sees them as sent)."""
    conn.execute(insert_for(conn, ROLLUP_STATE).values(name=SENT_USAGE, watermark=EPOCH,
                                                       id_mark=0, events=0, quantity=0)
                 .on_conflict_do_nothing(index_elements=[ROLLUP_STATE.c.name]))
    conn.execute(select(ROLLUP_STATE.c.name).where(ROLLUP_STATE.c.name == SENT_USAGE)
                 .with_for_update())
    return read_mark(conn, SENT_USAGE)


def unfold_sent(conn: Connection, mark: Mark, rows: Sequence[Any]) -> int:
    """Take events that just left ``sent`` (rejected, cancelled) out of the rollup if it
    holds them, under the lock of :func:`lock_sent_mark`. ``rows`` carry ``id``, ``sent_at``,
    ``occurred_at``, ``tenant_id``, ``stripe_customer_id``, ``meter``, ``quantity`` as they
    were while sent. Returns how many were folded and taken out."""
    folded = [r for r in rows if (at := as_utc(r.sent_at)) is not None and at < mark.at
              and int(r.id) <= mark.id]
    if not folded:
        return 0
    groups: dict[tuple[str, str, str, str], list[int]] = {}
    for r in folded:
        day = (as_utc(r.occurred_at) or EPOCH).date().isoformat()
        counts = groups.setdefault((day, r.tenant_id, r.stripe_customer_id or "", r.meter),
                                   [0, 0])
        counts[0] += 1
        counts[1] += int(r.quantity)
    add_sent(conn, [(day, tenant, customer, meter, -events, -quantity)
                    for (day, tenant, customer, meter), (events, quantity)
                    in sorted(groups.items())])
    conn.execute(sa_update(ROLLUP_STATE).where(ROLLUP_STATE.c.name == SENT_USAGE).values(
        events=ROLLUP_STATE.c.events - len(folded),
        quantity=ROLLUP_STATE.c.quantity - sum(int(r.quantity) for r in folded)))
    return len(folded)
