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
