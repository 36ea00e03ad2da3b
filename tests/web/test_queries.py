"""The read side's building blocks, on both backends: timestamp buckets, UTC days, the
rollup fold, the keyset cursor and the requeue classification."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import literal, select

from webapp import queries
from webapp.models import utcnow
from webapp.outbox import ops
from webapp.outbox.states import ALL_STATUSES, DEAD_PAST_WINDOW


def test_epoch_bucket_and_utc_day(engine, seed) -> None:
    at = datetime(2026, 3, 4, 23, 59, 59, 999000, tzinfo=UTC)
    ev = seed.event(occurred_at=at, created_at=at)
    T = queries.T
    with engine.connect() as conn:
        row = conn.execute(select(queries.epoch_bucket(T.c.occurred_at, literal(60)),
                                  queries.epoch_bucket(T.c.occurred_at, literal(3600)),
                                  queries.utc_day(T.c.occurred_at)).where(T.c.id == ev)).one()
    assert row[0] == int(at.timestamp()) // 60
    assert row[1] == int(at.timestamp()) // 3600
    assert row[2] == "2026-03-04"


def test_fold_counts_each_sent_row_once(engine, seed) -> None:
    now = utcnow()
    margin = timedelta(minutes=15)
    seed.events(3, status="sent", sent_at=now - timedelta(hours=1), quantity=2)
    seed.events(2, status="sent", sent_at=now - timedelta(minutes=1), quantity=5)
    with engine.connect() as conn:
        assert queries.status_counts(conn)["sent"] == 5
    assert queries.refresh_rollups(engine, now=now, margin=margin)
    with engine.connect() as conn:
        mark = queries._state(conn, queries.SENT_USAGE)
        assert (mark.events, mark.quantity) == (3, 6)
        assert mark.at == (now - margin).replace(second=0, microsecond=0)
        assert queries.status_counts(conn)["sent"] == 5
    # folding again a bit later: only the new stretch; still 5
    queries.refresh_rollups(engine, now=now + timedelta(hours=1), margin=margin)
    with engine.connect() as conn:
        mark = queries._state(conn, queries.SENT_USAGE)
        assert (mark.events, mark.quantity) == (5, 16)
        assert queries.status_counts(conn)["sent"] == 5


def test_history_loaded_after_a_fold_is_still_counted_once(engine, seed) -> None:
    """Rows written later with a stamp older than the watermark (a back-fill, a data load)
    are caught by the id mark: live until the next fold, then folded exactly once."""
    now = utcnow()
    margin = timedelta(minutes=15)
    seed.events(2, status="sent", sent_at=now - timedelta(hours=3), quantity=1)
    queries.refresh_rollups(engine, now=now, margin=margin)
    late = seed.events(3, status="sent", sent_at=now - timedelta(days=2), quantity=10,
                       occurred_at=now - timedelta(days=2))
    start, end = (now - timedelta(days=3)).date(), now.date()
    with engine.connect() as conn:
        assert queries.status_counts(conn)["sent"] == 5
    assert queries.tenant_usage(engine, start=start, end=end).total("quantity", "sent") == 32
    queries.refresh_rollups(engine, now=now + timedelta(minutes=10), margin=margin)
    with engine.connect() as conn:
        mark = queries._state(conn, queries.SENT_USAGE)
        assert mark.events == 5 and mark.id >= max(late)
        assert queries.status_counts(conn)["sent"] == 5
    assert queries.tenant_usage(engine, start=start, end=end).total("quantity", "sent") == 32


def test_concurrent_folds_do_not_double_count(engine, seed) -> None:
    import threading

    now = utcnow()
    seed.events(20, status="sent", sent_at=now - timedelta(hours=2))
    errors: list[BaseException] = []

    def fold() -> None:
        try:
            queries.refresh_rollups(engine, now=now, margin=timedelta(minutes=15))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=fold) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    with engine.connect() as conn:
        assert queries._state(conn, queries.SENT_USAGE).events == 20
        assert queries.status_counts(conn)["sent"] == 20


def test_cursor_round_trip_and_garbage() -> None:
    c = queries.Cursor(datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC), 42)
    assert queries.Cursor.decode(c.encode()) == c
    for bad in ("", "x~1", "2026-01-01T00:00:00~x", "2026-01-01T00:00:00~1"):
        with pytest.raises(ValueError):
            queries.Cursor.decode(bad)


def test_requeue_class_mirrors_ops() -> None:
    now = utcnow()
    base = {"occurred_at": now, "dead_reason": "x", "first_unknown_at": None}
    assert queries.requeue_class(base, now=now, window_seconds=3600) == "ok"
    assert queries.requeue_class({**base, "dead_reason": DEAD_PAST_WINDOW}, now=now,
                                 window_seconds=3600) == "force"
    assert queries.requeue_class({**base, "first_unknown_at": now - timedelta(hours=2)},
                                 now=now, window_seconds=3600) == "force"
    assert queries.requeue_class({**base, "occurred_at": now - timedelta(days=35)}, now=now,
                                 window_seconds=3600) == "too_old"


def test_status_literals_are_checked() -> None:
    with pytest.raises(ValueError):
        queries.status_is("sent'; drop table x; --")
    with pytest.raises(ValueError):
        queries.sql_str("100%")


def test_waiting_predicate_is_the_complement_of_the_other_statuses() -> None:
    """ix_outbox_waiting_created's predicate names the statuses it leaves out; a new status
    must not slip into it unnoticed."""
    left_out = {"sent", "processing", "dead", "resolved"}
    assert set(ALL_STATUSES) - left_out == {"pending", "retrying"}
    assert all(f"'{s}'" in str(queries.WAITING_IDLE.compile(
        compile_kwargs={"literal_binds": True})) for s in left_out)


def test_events_in_flight_are_counted_by_every_read(engine, seed, now) -> None:
    """Events in flight are in none of the read-side indexes but the deadline one (a claim
    writes no other entry): every read that counts them must find them there."""
    flight = dict(status="processing", processing_deadline_at=now + timedelta(minutes=1),
                  claim_token="t", claimed_by="h:1:ab")
    seed.event(**flight, created_at=now - timedelta(hours=2),
               occurred_at=now - timedelta(days=30))                   # oldest; near the limit
    seed.event(**flight, occurred_at=now - timedelta(days=36))          # past the limit
    seed.events(2, status="pending", created_at=now - timedelta(minutes=1))
    seed.event(status="sent")
    with engine.connect() as conn:
        counts = queries.status_counts(conn)
        assert (counts["processing"], counts["pending"], counts["sent"]) == (2, 2, 1)
        assert queries.oldest_waiting(conn) == now - timedelta(hours=2)
        assert queries._age_limits(conn, now) == (1, 1)
    stats = ops.stats(engine, now=now)
    assert stats["counts"]["processing"] == 2
    assert stats["oldest_pending_age_seconds"] == 7200.0
