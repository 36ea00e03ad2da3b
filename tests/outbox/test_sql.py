"""The SQL building blocks (``webapp.outbox.sql``) on both backends: timestamp buckets, UTC
days, and the literal predicates the partial indexes depend on."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import literal, select

from webapp.db import reading
from webapp.outbox import sql
from webapp.outbox.states import ALL_STATUSES


def test_epoch_bucket_and_utc_day(engine, seed) -> None:
    at = datetime(2026, 3, 4, 23, 59, 59, 999000, tzinfo=UTC)
    ev = seed.event(occurred_at=at, created_at=at)
    T = sql.T
    with reading(engine) as conn:
        row = conn.execute(select(sql.epoch_bucket(T.c.occurred_at, literal(60)),
                                  sql.epoch_bucket(T.c.occurred_at, literal(3600)),
                                  sql.utc_day(T.c.occurred_at)).where(T.c.id == ev)).one()
    assert row[0] == int(at.timestamp()) // 60
    assert row[1] == int(at.timestamp()) // 3600
    assert row[2] == "2026-03-04"


def test_status_literals_are_checked() -> None:
    with pytest.raises(ValueError):
        sql.status_is("sent'; drop table x; --")
    with pytest.raises(ValueError):
        sql.sql_str("100%")


def test_waiting_predicate_is_the_complement_of_the_other_statuses() -> None:
    """ix_outbox_waiting_created's predicate names the statuses it leaves out; a new status
    must not slip into it unnoticed."""
    left_out = {"sent", "processing", "dead", "resolved", "rejected", "cancelled"}
    assert set(ALL_STATUSES) - left_out == {"pending", "retrying"}
    assert all(f"'{s}'" in str(sql.WAITING_IDLE.compile(
        compile_kwargs={"literal_binds": True})) for s in left_out)
