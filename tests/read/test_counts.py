"""The numbers several pages share (``webapp.read.counts``) and the keyset cursor
(``webapp.read.paging``), on both backends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from webapp.db import reading
from webapp.read import counts
from webapp.read.paging import Cursor
from webapp.read.stats import stats


def test_cursor_round_trip_and_garbage() -> None:
    c = Cursor(datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC), 42)
    assert Cursor.decode(c.encode()) == c
    for bad in ("", "x~1", "2026-01-01T00:00:00~x", "2026-01-01T00:00:00~1"):
        with pytest.raises(ValueError):
            Cursor.decode(bad)


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
    with reading(engine) as conn:
        by_status = counts.status_counts(conn)
        assert (by_status["processing"], by_status["pending"], by_status["sent"]) == (2, 2, 1)
        assert counts.oldest_waiting(conn) == now - timedelta(hours=2)
        assert counts.age_limits(conn, now) == (1, 1)
    printed = stats(engine, now=now)
    assert printed["counts"]["processing"] == 2
    assert printed["oldest_pending_age_seconds"] == 7200.0


def test_status_counts_and_age_limits_equal_a_plain_count(engine, seed, now) -> None:
    """Each status is counted apart (each through its own index) and the events past the
    35-day limit as all of them less those inside it: both must equal counting the rows,
    on the limit's and the warning's exact boundaries too, whether ``age_limits`` reads the
    totals itself or is handed them."""
    import random

    from webapp.outbox.states import ALL_STATUSES, MAX_AGE

    rng = random.Random(15)
    limit = now - MAX_AGE
    ages = [limit - timedelta(days=300), limit - timedelta(microseconds=1), limit,
            limit + timedelta(days=3), limit + counts.NEAR_LIMIT - timedelta(microseconds=1),
            limit + counts.NEAR_LIMIT, now - timedelta(hours=1)]
    flight = dict(processing_deadline_at=now + timedelta(minutes=1), claim_token="t",
                  claimed_by="h:1:ab")
    seeded: list[tuple[str, datetime]] = []
    for _ in range(120):
        status, at = rng.choice(ALL_STATUSES), rng.choice(ages)
        seed.event(status=status, occurred_at=at, created_at=at,
                   **(flight if status == "processing" else {}))
        seeded.append((status, at))
    open_ = [at for status, at in seeded if status in counts.UNSENT_OPEN + ("processing",)]
    want_near = sum(limit <= at < limit + counts.NEAR_LIMIT for at in open_)
    want_over = sum(at < limit for at in open_)
    assert want_near and want_over and len(open_) > want_near + want_over
    with reading(engine) as conn:
        by_status = counts.status_counts(conn)
        assert by_status == {s: sum(status == s for status, _ in seeded) for s in ALL_STATUSES}
        assert counts.age_limits(conn, now) == (want_near, want_over)
        assert counts.age_limits(conn, now, by_status) == (want_near, want_over)
