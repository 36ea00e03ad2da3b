"""The rollups (``webapp.outbox.rollups``) on both backends: each sent row folded exactly once,
history loaded after a fold still counted once, concurrent folds never double-count, and
reads exact however stale the rollups are."""

from __future__ import annotations

from datetime import timedelta

from webapp.db import reading
from webapp.models import utcnow
from webapp.outbox import rollups
from webapp.read import counts
from webapp.read.tenants import tenant_usage


def test_fold_counts_each_sent_row_once(engine, seed) -> None:
    now = utcnow()
    margin = timedelta(minutes=15)
    seed.events(3, status="sent", sent_at=now - timedelta(hours=1), quantity=2)
    seed.events(2, status="sent", sent_at=now - timedelta(minutes=1), quantity=5)
    with reading(engine) as conn:
        assert counts.status_counts(conn)["sent"] == 5
    assert rollups.fold(engine, now=now, margin=margin)
    with reading(engine) as conn:
        mark = rollups.read_mark(conn, rollups.SENT_USAGE)
        assert (mark.events, mark.quantity) == (3, 6)
        assert mark.at == (now - margin).replace(second=0, microsecond=0)
        assert counts.status_counts(conn)["sent"] == 5
    # folding again a bit later: only the new stretch; still 5
    rollups.fold(engine, now=now + timedelta(hours=1), margin=margin)
    with reading(engine) as conn:
        mark = rollups.read_mark(conn, rollups.SENT_USAGE)
        assert (mark.events, mark.quantity) == (5, 16)
        assert counts.status_counts(conn)["sent"] == 5


def test_history_loaded_after_a_fold_is_still_counted_once(engine, seed) -> None:
    """Rows written later with a stamp older than the watermark (a back-fill, a data load)
    are caught by the id mark: live until the next fold, then folded exactly once."""
    now = utcnow()
    margin = timedelta(minutes=15)
    seed.events(2, status="sent", sent_at=now - timedelta(hours=3), quantity=1)
    rollups.fold(engine, now=now, margin=margin)
    late = seed.events(3, status="sent", sent_at=now - timedelta(days=2), quantity=10,
                       occurred_at=now - timedelta(days=2))
    start, end = (now - timedelta(days=3)).date(), now.date()
    with reading(engine) as conn:
        assert counts.status_counts(conn)["sent"] == 5
    assert tenant_usage(engine, start=start, end=end).total("quantity", "sent") == 32
    rollups.fold(engine, now=now + timedelta(minutes=10), margin=margin)
    with reading(engine) as conn:
        mark = rollups.read_mark(conn, rollups.SENT_USAGE)
        assert mark.events == 5 and mark.id >= max(late)
        assert counts.status_counts(conn)["sent"] == 5
    assert tenant_usage(engine, start=start, end=end).total("quantity", "sent") == 32


def test_concurrent_folds_do_not_double_count(engine, seed) -> None:
    import threading

    now = utcnow()
    seed.events(20, status="sent", sent_at=now - timedelta(hours=2))
    errors: list[BaseException] = []

    def fold() -> None:
        try:
            rollups.fold(engine, now=now, margin=timedelta(minutes=15))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=fold) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    with reading(engine) as conn:
        assert rollups.read_mark(conn, rollups.SENT_USAGE).events == 20
        assert counts.status_counts(conn)["sent"] == 20


def test_folds_racing_cancels_and_sends_count_each_event_once(engine, seed) -> None:
    """Folds stepping through a stretch of sent events while other threads cancel some of
    them (out of ``sent``, and out of the rollup if folded) and send new ones: at the end the
    rollup plus the rows past it equal a plain count of the sent rows, per day, tenant and
    meter. Each cancel takes the rollup's mark lock first, so a fold either finished before
    it (and the cancel takes the event out) or runs after it (and no longer sees it sent)."""
    import random
    import threading

    from sqlalchemy import func, select

    from webapp.models import OutboxEvent
    from webapp.outbox.operations import record_cancelled

    from .helpers import taken

    T = OutboxEvent.__table__
    base = utcnow().replace(second=0, microsecond=0) - timedelta(days=3)
    ids = []
    for i in range(600):
        at = base + timedelta(minutes=i)
        ids.append(seed.event(status="sent", now=at, quantity=i % 5 + 1,
                              tenant_id=("acme", "globex")[i % 2],
                              occurred_at=at - timedelta(hours=i % 30)))
    errors: list[BaseException] = []
    stop = threading.Event()

    def run(body) -> None:
        try:
            body()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
            stop.set()

    def folds() -> None:
        for step in range(1, 130):
            rollups.fold(engine, now=base + timedelta(minutes=5 * step + 15),
                         margin=timedelta(minutes=15))

    def cancels() -> None:
        rng = random.Random(7)
        while not stop.is_set():
            record_cancelled(engine, taken(rng.sample(ids, 3)), actor="t", reason="duplicate",
                             note="race", now=utcnow())

    def sends() -> None:
        n = 0
        while not stop.is_set() and n < 200:
            seed.event(status="sent", now=base + timedelta(minutes=n * 3), quantity=2)
            n += 1

    workers = [threading.Thread(target=run, args=(b,)) for b in (cancels, sends)]
    for t in workers:
        t.start()
    run(folds)
    stop.set()
    for t in workers:
        t.join()
    assert not errors, errors
    rollups.fold(engine, now=utcnow(), margin=timedelta(minutes=15))
    start, end = (base - timedelta(days=2)).date(), utcnow().date()
    usage = tenant_usage(engine, start=start, end=end)
    with engine.connect() as conn:
        counted = {(t, m): (int(n), int(q)) for t, m, n, q in conn.execute(
            select(T.c.tenant_id, T.c.meter, func.count(), func.sum(T.c.quantity))
            .where(T.c.status == "sent").group_by(T.c.tenant_id, T.c.meter))}
        cancelled = conn.execute(select(func.count()).where(T.c.status == "cancelled"))
        assert cancelled.scalar_one() > 0
        mark = rollups.read_mark(conn, rollups.SENT_USAGE)
    got = {(r.tenant_id, r.meter): (r.events["sent"], r.quantity["sent"]) for r in usage.rows
           if r.events["sent"]}
    assert got == counted
    assert mark.events == sum(n for n, _ in counted.values())
