"""Retention (``webapp.outbox.retention``) on both backends.

The property: after any sequence of enqueues, drains (sent and dead), folds, cancels,
resolves, clock jumps and prunes, usage for any period equals a plain count of the rows
still there plus the rows pruned so far (each with the status it had when it went). Every
pruned row was terminal and past retention, and took its recorded calls with it; nothing
else was touched."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from webapp.models import DeliveryAttempt, OutboxEvent, utcnow
from webapp.outbox import rollups
from webapp.outbox.claims import claim_batch
from webapp.outbox.operations import record_cancelled, resolve
from webapp.outbox.record import record_outcomes
from webapp.outbox.retention import PRUNABLE, prune, pruned_totals
from webapp.read.tenants import usage_in

from .helpers import OK, PERM, POLICY, attempt, taken

T = OutboxEvent.__table__
A = DeliveryAttempt.__table__
TENANTS = ("acme", "globex", "initech")
METERS = ("api_requests", "tokens")
RETENTION = 40
MARGIN = timedelta(minutes=15)


def _snapshot(engine: Any) -> dict[int, tuple[str, str, str, str, int, datetime]]:
    with engine.connect() as conn:
        return {int(r.id): (r.tenant_id, r.meter, r.occurred_at.astimezone(UTC).date()
                            .isoformat(), r.status, int(r.quantity),
                            r.updated_at.astimezone(UTC))
                for r in conn.execute(select(T.c.id, T.c.tenant_id, T.c.meter, T.c.occurred_at,
                                             T.c.status, T.c.quantity, T.c.updated_at))}


def _expected(rows: dict[int, Any], gone: dict[int, Any], start: date,
              end: date) -> Counter[tuple[str, str, str, str]]:
    out: Counter[tuple[str, str, str, str]] = Counter()
    for tenant, meter, day, status, quantity, _ in list(rows.values()) + list(gone.values()):
        if start.isoformat() <= day <= end.isoformat():
            out[(tenant, meter, status, "events")] += 1
            out[(tenant, meter, status, "units")] += quantity
    return out


def _usage(engine: Any, start: date, end: date) -> Counter[tuple[str, str, str, str]]:
    with engine.connect() as conn:
        usage = usage_in(conn, start=start, end=end, in_flight_apart=True)
    out: Counter[tuple[str, str, str, str]] = Counter()
    for r in usage.rows:
        for status, n in r.events.items():
            if n:
                out[(r.tenant_id, r.meter, status, "events")] += n
        for status, q in r.quantity.items():
            if q:
                out[(r.tenant_id, r.meter, status, "units")] += q
    return out


def _summed_by(engine: Any, table: Any, key: str, cut: int) -> Counter[tuple[str, ...]]:
    """A sent rollup's events ("n") and units ("q") per tenant, meter and the first ``cut``
    characters of its ``key`` column (a day's month: 7; a month's year: 4)."""
    out: Counter[tuple[str, ...]] = Counter()
    with engine.connect() as conn:
        for k, t, m, n, q in conn.execute(select(table.c[key], table.c.tenant_id,
                                                 table.c.meter, table.c.events,
                                                 table.c.quantity)):
            out[(k[:cut], t, m, "n")] += int(n)
            out[(k[:cut], t, m, "q")] += int(q)
    return out


def _monthly_matches_daily(engine: Any) -> None:
    """Each level of the sent rollup sums the one below it, and the day totals sum every
    tenant's day."""
    from webapp.outbox.sql import SENT_DAY, SENT_MONTHLY, SENT_ROLLUP, SENT_YEARLY

    assert +_summed_by(engine, SENT_ROLLUP, "day", 7) == +_summed_by(
        engine, SENT_MONTHLY, "month", 7)
    assert +_summed_by(engine, SENT_MONTHLY, "month", 4) == +_summed_by(
        engine, SENT_YEARLY, "year", 4)
    with engine.connect() as conn:
        by_day: Counter[tuple[str, str]] = Counter()
        for day, n, q in conn.execute(select(SENT_ROLLUP.c.day, SENT_ROLLUP.c.events,
                                             SENT_ROLLUP.c.quantity)):
            by_day[(day, "n")] += int(n)
            by_day[(day, "q")] += int(q)
        totals: Counter[tuple[str, str]] = Counter()
        for day, n, q in conn.execute(select(SENT_DAY.c.day, SENT_DAY.c.events,
                                             SENT_DAY.c.quantity)):
            totals[(day, "n")] += int(n)
            totals[(day, "q")] += int(q)
    assert +by_day == +totals


class World:
    """The random history one test run plays."""

    def __init__(self, engine: Any, seed: Any, rng: random.Random, start: datetime) -> None:
        self.engine, self.seed, self.rng, self.t = engine, seed, rng, start
        self.gone: dict[int, Any] = {}
        self.pruned = 0

    def enqueue(self) -> None:
        for _ in range(self.rng.randint(1, 12)):
            back = timedelta(minutes=self.rng.randint(0, 600))
            self.seed.event(now=self.t - back, tenant_id=self.rng.choice(TENANTS),
                            meter=self.rng.choice(METERS), quantity=self.rng.randint(1, 9))

    def drain(self) -> None:
        claim = claim_batch(self.engine, worker="w", limit=self.rng.randint(1, 25), now=self.t,
                            claim_timeout_seconds=60)
        tries = [attempt(claim, i, OK if self.rng.random() < 0.85 else PERM, self.t)
                 for i in range(len(claim.events))]
        if tries:
            record_outcomes(self.engine, claim, tries, now=self.t, policy=POLICY)

    def fold(self) -> None:
        rollups.fold(self.engine, now=self.t, margin=MARGIN)

    def _some(self, status: str) -> list[int]:
        with self.engine.connect() as conn:
            ids = [int(i) for i in conn.execute(select(T.c.id).where(T.c.status == status))
                   .scalars()]
        return self.rng.sample(ids, min(len(ids), self.rng.randint(0, 4)))

    def cancel(self) -> None:
        if ids := self._some("sent"):
            record_cancelled(self.engine, taken(ids), actor="t@example.com", reason="duplicate",
                             note="test", now=self.t)

    def resolve(self) -> None:
        if ids := self._some("dead"):
            resolve(self.engine, ids, actor="t@example.com", reason="written_off",
                    note="test", now=self.t)

    def later(self) -> None:
        self.t += timedelta(days=self.rng.randint(1, 20), minutes=self.rng.randint(0, 1440))

    def prune(self) -> None:
        before = _snapshot(self.engine)
        with self.engine.connect() as conn:
            calls_before = {int(e): int(n) for e, n in conn.execute(
                select(A.c.event_id, func.count()).group_by(A.c.event_id))}
        result = prune(self.engine, now=self.t, retention_days=RETENTION,
                       batch_size=self.rng.choice((1, 3, 1000)))
        after = _snapshot(self.engine)
        went = {i: before[i] for i in before.keys() - after.keys()}
        cutoff = self.t - timedelta(days=RETENTION)
        for _, _, _, status, _, updated in went.values():
            assert status in PRUNABLE
            assert updated < cutoff
        assert result.pruned == len(went)
        assert result.attempts == sum(calls_before.get(i, 0) for i in went)
        with self.engine.connect() as conn:
            left = {int(e) for e in conn.execute(select(A.c.event_id).distinct()).scalars()}
        assert not left & went.keys(), "a pruned event's calls were left behind"
        assert {i for i in calls_before if i not in went} <= left, "other calls went"
        self.gone.update(went)
        self.pruned += len(went)

    def check(self, first: date, last: date) -> None:
        rows = _snapshot(self.engine)
        assert not rows.keys() & self.gone.keys(), "a pruned event's id was given again"
        periods = [(first, last)]
        # whole months (read from the monthly rollup) with ragged days either side
        a = min(first + timedelta(days=self.rng.randint(0, 40)), last)
        periods += [(a.replace(day=1), last), (a, last), (a.replace(day=1),
                    (a.replace(day=28) + timedelta(days=4)).replace(day=1) - timedelta(days=1))]
        for _ in range(3):
            a = first + timedelta(days=self.rng.randint(0, (last - first).days))
            b = a + timedelta(days=self.rng.randint(0, 60))
            periods.append((a, b))
        for a, b in periods:
            assert _usage(self.engine, a, b) == _expected(rows, self.gone, a, b), (a, b)
        _monthly_matches_daily(self.engine)


@pytest.mark.parametrize("run", range(6))
def test_usage_equals_rows_plus_pruned_after_random_history(engine, seed, run) -> None:
    rng = random.Random(1500 + run)
    start = utcnow().replace(microsecond=0) - timedelta(days=200)
    for t in TENANTS:
        seed.tenant(t, f"cus_{t}")
    world = World(engine, seed, rng, start)
    # some history the product did not write itself: terminal rows of every kind, old
    for status in ("sent", "dead", "resolved", "rejected", "cancelled"):
        for _ in range(rng.randint(2, 8)):
            when = start - timedelta(days=rng.randint(0, 30))
            seed.event(now=when, status=status, tenant_id=rng.choice(TENANTS),
                       meter=rng.choice(METERS), quantity=rng.randint(1, 9))
    steps = [world.enqueue, world.drain, world.fold, world.cancel, world.resolve,
             world.later, world.later, world.prune, world.prune]
    for _ in range(14):
        rng.choice(steps)()
        world.check((start - timedelta(days=31)).date(), world.t.date())
    # and at the end, always: a fold, then a prune far ahead removes every terminal row
    world.t += timedelta(days=RETENTION + 2)
    world.fold()
    world.prune()
    world.check((start - timedelta(days=31)).date(), world.t.date())
    with engine.connect() as conn:
        left = {int(i) for i in conn.execute(select(T.c.id).where(T.c.status.in_(PRUNABLE)))
                .scalars()}
        newest = {int(i) for i in conn.execute(
            select(A.c.event_id).order_by(A.c.id.desc()).limit(1)).scalars()}
        newest |= {int(conn.execute(select(func.max(T.c.id))).scalar_one())}
        events, _, at = pruned_totals(conn)
    # SQLite keeps the newest event and the newest call's event (their ids would be reused)
    assert left <= (newest if engine.dialect.name == "sqlite" else set()), left
    assert events == world.pruned
    assert world.pruned == 0 or at is not None


def test_prune_keeps_dead_rejected_waiting_and_recent(engine, seed) -> None:
    now = utcnow()
    old = now - timedelta(days=RETENTION + 5)
    keep = {s: seed.event(now=old, status=s) for s in ("dead", "rejected", "pending",
                                                       "retrying")}
    keep["processing"] = seed.event(now=old, status="processing",
                                    processing_deadline_at=now + timedelta(minutes=1))
    recent = seed.event(now=now - timedelta(days=RETENTION - 1), status="sent")
    # sent long ago but changed lately (a support note, a reconciliation): kept
    touched = seed.event(now=old, status="sent", updated_at=now - timedelta(days=2))
    doomed = {s: seed.event(now=old, status=s) for s in PRUNABLE}
    seed.attempt(doomed["sent"], attempted_at=old)
    seed.attempt(keep["dead"], attempted_at=old)
    keep["newest"] = seed.event(now=now)
    rollups.fold(engine, now=now, margin=MARGIN)
    preview = prune(engine, now=now, retention_days=RETENTION, dry_run=True)
    assert (preview.pruned, preview.kept_dead, preview.kept_rejected) == (3, 1, 1)
    assert len(_snapshot(engine)) == 11, "a dry run removed rows"
    result = prune(engine, now=now, retention_days=RETENTION, actor="cli:test")
    assert result.pruned == 3 and result.attempts == 1
    assert result.by_status == {"sent": 1, "resolved": 1, "cancelled": 1}
    left = _snapshot(engine)
    assert set(left) == set(keep.values()) | {recent, touched}
    with engine.connect() as conn:
        assert [int(e) for e in conn.execute(select(A.c.event_id)).scalars()] == [keep["dead"]]
    again = prune(engine, now=now, retention_days=RETENTION)
    assert again.pruned == 0


def test_sent_rows_wait_until_the_rollup_holds_them(engine, seed) -> None:
    now = utcnow()
    old = now - timedelta(days=RETENTION + 3)
    sent = seed.event(now=old, status="sent", quantity=7)
    seed.event(now=now)
    first = prune(engine, now=now, retention_days=RETENTION)
    assert (first.pruned, first.waiting_for_fold) == (0, 1)
    assert "wait for the usage rollup" in first.summary()
    rollups.fold(engine, now=now, margin=MARGIN)
    second = prune(engine, now=now, retention_days=RETENTION)
    assert second.pruned == 1 and sent not in _snapshot(engine)
    day = old.date()
    usage = _usage(engine, day, day)
    assert usage[("acme", "api_requests", "sent", "units")] == 7
    # a rebuild of the rollups keeps what was pruned
    rollups.rebuild(engine, now=now, margin=MARGIN)
    assert _usage(engine, day, day) == usage


def test_prune_refuses_a_batch_size_below_one(engine) -> None:
    with pytest.raises(ValueError):
        prune(engine, now=utcnow(), retention_days=RETENTION, batch_size=0)


def test_a_pruned_events_id_is_never_given_again(engine, seed) -> None:
    """SQLite gives max(id) + 1 to a new row when the table has no AUTOINCREMENT: the newest
    event (and the newest call's event) stay so that no id names two events."""
    now = utcnow()
    old = now - timedelta(days=RETENTION + 3)
    ids = seed.events(3, now=old, status="resolved")
    seed.attempt(ids[1], attempted_at=old)
    preview = prune(engine, now=now, retention_days=RETENTION, dry_run=True)
    result = prune(engine, now=now, retention_days=RETENTION)
    assert preview.pruned == result.pruned      # a dry run counts what a prune removes
    kept = set(_snapshot(engine))
    if engine.dialect.name == "sqlite":
        assert kept == {ids[1], ids[2]} and result.pruned == 1
    else:
        assert kept == set() and result.pruned == 3
    with engine.connect() as conn:
        highest_call = conn.execute(select(func.max(A.c.id))).scalar()
    new = seed.event(now=now)
    seed.attempt(new, attempted_at=now)
    assert new > max(ids)
    with engine.connect() as conn:
        assert conn.execute(select(func.max(A.c.id))).scalar_one() > (highest_call or 0)


def test_whole_months_read_the_monthly_rollup_and_agree_with_the_rows(engine, seed) -> None:
    """Sent events on every day of three months, folded, then some cancelled: any period —
    whole months, ragged ends, one day — gives what counting the rows gives."""
    start = datetime(2026, 3, 1, 12, tzinfo=UTC)
    ids = [seed.event(now=start + timedelta(days=i, hours=h), status="sent", quantity=i % 4 + h,
                      tenant_id=("acme", "globex")[h % 2]) for i in range(92) for h in (0, 1)]
    rollups.fold(engine, now=start + timedelta(days=100), margin=MARGIN)
    record_cancelled(engine, taken(ids[::7]), actor="t", reason="duplicate", note="n",
                     now=start + timedelta(days=100))
    rows = _snapshot(engine)
    d = date
    for a, b in ((d(2026, 3, 1), d(2026, 5, 31)), (d(2026, 3, 15), d(2026, 5, 2)),
                 (d(2026, 4, 1), d(2026, 4, 30)), (d(2026, 4, 15), d(2026, 4, 15)),
                 (d(2026, 2, 27), d(2026, 6, 3))):
        assert _usage(engine, a, b) == _expected(rows, {}, a, b), (a, b)
    _monthly_matches_daily(engine)


def test_stream_request_records_go_once_past_retention(engine) -> None:
    """What ties a stream request's key to its events is kept while Stripe may still report
    on it, and goes with the rows past retention."""
    from webapp.models import StreamRequest

    now = utcnow()
    table = StreamRequest.__table__
    with engine.begin() as conn:
        conn.execute(table.insert(), [
            dict(idempotency_key="bo-stream-old", sent_at=now - timedelta(days=RETENTION + 1),
                 event_ids="1:00000000", events=1, stripe_request_id=None),
            dict(idempotency_key="bo-stream-new", sent_at=now - timedelta(days=RETENTION - 1),
                 event_ids="2:00000000", events=1, stripe_request_id=None)])
    assert prune(engine, now=now, retention_days=RETENTION, dry_run=True).stream_requests == 0
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(table)).scalar_one() == 2
    assert prune(engine, now=now, retention_days=RETENTION).stream_requests == 1
    with engine.connect() as conn:
        assert list(conn.execute(select(table.c.idempotency_key)).scalars()) == ["bo-stream-new"]
