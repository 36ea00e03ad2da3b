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
