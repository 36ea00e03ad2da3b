"""Failed log-ins, counted per account and per client address in the database, so every
gunicorn worker and every replica sees the same count and the same lock.

A key (``account:<email>`` or ``address:<ip>``) collects failures in a window; at the limit it
is locked until ``locked_until``, and while it is, even the right password is refused. Each
count is one atomic statement (``INSERT … ON CONFLICT DO NOTHING`` then one ``UPDATE … RETURNING``),
so two processes failing at once both count.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import cast

from sqlalchemy import Connection, Engine, Table, case, delete, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from .models import LoginThrottle

THROTTLE = cast(Table, LoginThrottle.__table__)


@dataclass(frozen=True)
class Policy:
    """How many failures in how long lock a key, and for how long."""

    failures: int
    window: timedelta
    lock: timedelta


#: A person mistyping is never locked out by five tries in a quarter of an hour; a guesser is
#: held to 20 guesses an hour per account.
ACCOUNT = Policy(failures=5, window=timedelta(minutes=15), lock=timedelta(minutes=15))
#: One address may try more (an office behind one NAT), but not without end.
ADDRESS = Policy(failures=20, window=timedelta(minutes=15), lock=timedelta(minutes=15))


def account_key(email: str) -> str:
    return "account:" + (email or "").strip().lower()[:254]


def address_key(address: str | None) -> str:
    return "address:" + (address or "unknown")[:200]


def locked_until(engine: Engine, keys: list[str], *, now: datetime) -> datetime | None:
    """The latest lock among ``keys`` still in force at ``now``; None when none is."""
    with engine.connect() as conn:
        rows = conn.execute(select(THROTTLE.c.locked_until).where(
            THROTTLE.c.key.in_(keys), THROTTLE.c.locked_until > now)).scalars().all()
    return max(rows) if rows else None


def record_failure(conn: Connection, key: str, policy: Policy, *,
                   now: datetime) -> datetime | None:
    """Count one failure for ``key`` in the caller's transaction; when it reaches the limit,
    lock the key and return until when (None otherwise, or when it was locked already)."""
    row = {"key": key, "failures": 0, "window_started_at": now, "locked_until": None}
    ins = pg_insert(THROTTLE) if conn.dialect.name == "postgresql" else sqlite_insert(THROTTLE)
    conn.execute(ins.values(**row).on_conflict_do_nothing(index_elements=["key"]))
    stale = THROTTLE.c.window_started_at <= now - policy.window
    failures = case((stale, 1), else_=THROTTLE.c.failures + 1)
    result = conn.execute(
        update(THROTTLE).where(THROTTLE.c.key == key).values(
            failures=failures,
            window_started_at=case((stale, now), else_=THROTTLE.c.window_started_at),
            locked_until=case((failures >= policy.failures, now + policy.lock),
                              else_=THROTTLE.c.locked_until))
        .returning(THROTTLE.c.failures, THROTTLE.c.locked_until)).one()
    count, until = int(result[0]), result[1]
    return until if count == policy.failures else None


def clear(conn: Connection, key: str) -> None:
    """Forget a key's failures (an account's, after its right password got through)."""
    conn.execute(delete(THROTTLE).where(THROTTLE.c.key == key))


#: Entries whose window began this long ago and that hold no lock are forgotten.
FORGET_AFTER = timedelta(days=1)


def forget_stale(engine: Engine, *, now: datetime) -> int:
    """Delete the entries that neither count toward a window nor hold a lock any more (the
    pruner calls this), so the table holds only recent failures. How many went."""
    with engine.begin() as conn:
        gone = conn.execute(delete(THROTTLE).where(
            THROTTLE.c.window_started_at < now - FORGET_AFTER,
            (THROTTLE.c.locked_until.is_(None)) | (THROTTLE.c.locked_until < now))).rowcount
    return int(gone or 0)
