"""``enqueue_usage``: the request path's only call, on SQLite and PostgreSQL.

It runs in the caller's transaction, never commits, makes no network call, deduplicates by
key, refuses a key reused with other content, and names the bad field of bad input.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from conftest import wait_for
from sqlalchemy import Engine, create_engine, event, func, inspect, select, text
from sqlalchemy.orm import Session

from webapp.db import make_engine
from webapp.models import OutboxEvent, utcnow
from webapp.outbox import IdempotencyConflict, InvalidUsage, enqueue_usage


def count_rows(engine: Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(OutboxEvent)).scalar_one()


@pytest.fixture
def observer(db_url: str) -> Iterator[Engine]:
    """A second, independent connection pool that sees only committed data. Plain engine
    (no BEGIN IMMEDIATE on SQLite), so reading never waits on the writer under test."""
    eng = create_engine(db_url)
    yield eng
    eng.dispose()


def enqueue(db: Session, **overrides: Any) -> OutboxEvent:
    args: dict[str, Any] = dict(tenant_id="acme", quantity=3, idempotency_key="usage_log:1",
                                meter="api_requests")
    args.update(overrides)
    return enqueue_usage(db, **args)


# -- transactions ---------------------------------------------------------------------------------

def test_row_written_with_its_fields(engine: Engine) -> None:
    when = utcnow() - timedelta(hours=1)
    with Session(engine) as db, db.begin():
        row = enqueue(db, occurred_at=when)
        row_id = row.id
    with Session(engine) as db:
        got = db.get(OutboxEvent, row_id)
        assert got is not None
        assert (got.tenant_id, got.quantity, got.meter, got.idempotency_key) == (
            "acme", 3, "api_requests", "usage_log:1")
        assert got.status == "pending"
        assert got.attempt_count == 0 and got.call_count == 0 and got.key_generation == 0
        assert got.occurred_at == when
        assert got.occurred_at.tzinfo is not None
        assert got.stripe_customer_id is None
        assert got.next_attempt_at <= utcnow()


def test_returned_event_is_the_sessions_own_row(engine: Engine) -> None:
    """The new row comes back as the session's persistent object, loaded, nothing pending:
    the session's queries and ``get`` hand back that same object, a change to it is flushed
    like any loaded row's, and a rollback takes it with the row."""
    with Session(engine) as db, db.begin():
        row = enqueue(db)
        state = inspect(row)
        assert state.persistent and not state.modified and not db.new and not db.dirty
        assert db.get(OutboxEvent, row.id) is row
        assert db.scalars(select(OutboxEvent).where(
            OutboxEvent.idempotency_key == "usage_log:1")).one() is row
        assert enqueue(db) is row                         # the duplicate finds the same object
        assert row.status == "pending" and row.tenant_id == "acme" and row.source is None
        row.quantity = 4                                  # an ordinary change, flushed at commit
        row_id = row.id
    with Session(engine) as db:
        assert db.get(OutboxEvent, row_id).quantity == 4  # type: ignore[union-attr]

    with Session(engine) as db:
        db.begin()
        gone = enqueue(db, idempotency_key="usage_log:2")
        gone_id = gone.id
        db.rollback()
        assert inspect(gone).expired                     # as every row the session loaded
        assert db.get(OutboxEvent, gone_id) is None


def test_meter_defaults_to_env(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRIPE_METER_EVENT_NAME", "custom_meter")
    with Session(engine) as db, db.begin():
        row = enqueue_usage(db, tenant_id="acme", quantity=1, idempotency_key="k-default")
        assert row.meter == "custom_meter"


def test_rolled_back_with_the_callers_transaction(engine: Engine) -> None:
    with Session(engine) as db:
        db.begin()
        enqueue(db)
        db.flush()
        db.rollback()
    assert count_rows(engine) == 0

    class Boom(Exception):
        pass

    with pytest.raises(Boom), Session(engine) as db, db.begin():
        enqueue(db, idempotency_key="k2")
        raise Boom
    assert count_rows(engine) == 0


def test_never_commits(engine: Engine, observer: Engine) -> None:
    commits: list[object] = []

    def on_commit(conn: object) -> None:
        commits.append(conn)

    event.listen(engine, "commit", on_commit)
    try:
        with Session(engine) as db:
            db.begin()
            row = enqueue(db)
            assert row.id is not None
            assert db.in_transaction()
            assert commits == []
            with observer.connect() as conn:
                seen = conn.execute(text("SELECT count(*) FROM stripe_usage_outbox")).scalar()
            assert seen == 0
            db.commit()
            assert len(commits) == 1
    finally:
        event.remove(engine, "commit", on_commit)
    with observer.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM stripe_usage_outbox")).scalar() == 1


def test_no_network(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    # A closed port: nothing listens there.
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    closed_port = probe.getsockname()[1]
    probe.close()
    monkeypatch.setenv("STRIPE_API_BASE", f"http://127.0.0.1:{closed_port}")
    monkeypatch.setenv("STRIPE_API_KEY", "sk_test_nonetwork_0000")
    attempts: list[object] = []

    def refuse(self: socket.socket, address: object) -> None:
        attempts.append(address)
        raise AssertionError(f"enqueue_usage opened a socket to {address}")

    with Session(engine) as db:
        db.begin()
        db.connection()  # the database connection itself is made before the patch
        monkeypatch.setattr(socket.socket, "connect", refuse)
        monkeypatch.setattr(socket.socket, "connect_ex", refuse)
        row_id = enqueue(db).id
        again_id = enqueue(db).id
        db.commit()
        monkeypatch.undo()
    assert attempts == []
    assert row_id == again_id
    assert count_rows(engine) == 1


# -- idempotency ----------------------------------------------------------------------------------

def test_duplicate_key_returns_same_row(engine: Engine) -> None:
    when = utcnow() - timedelta(minutes=5)
    with Session(engine) as db, db.begin():
        first = enqueue(db, occurred_at=when).id
    with Session(engine) as db, db.begin():
        second = enqueue(db, occurred_at=when).id
        # twice within one transaction too
        third = enqueue(db, occurred_at=when).id
    assert first == second == third
    assert count_rows(engine) == 1


def test_omitted_occurred_at_does_not_conflict(engine: Engine) -> None:
    when = utcnow() - timedelta(days=2)
    with Session(engine) as db, db.begin():
        first = enqueue(db, occurred_at=when).id
    with Session(engine) as db, db.begin():
        row = enqueue(db)  # occurred_at omitted: "now", but the caller did not say
        assert row.id == first
        assert row.occurred_at == when
    assert count_rows(engine) == 1


def test_subsecond_difference_is_the_same_event(engine: Engine) -> None:
    # Stripe receives whole seconds; a sub-second difference sends the same params.
    when = utcnow().replace(microsecond=100_000) - timedelta(minutes=1)
    with Session(engine) as db, db.begin():
        first = enqueue(db, occurred_at=when).id
    with Session(engine) as db, db.begin():
        assert enqueue(db, occurred_at=when + timedelta(milliseconds=500)).id == first


@pytest.mark.parametrize(("field", "change"), [
    ("tenant_id", {"tenant_id": "globex"}),
    ("meter", {"meter": "storage_gb"}),
    ("quantity", {"quantity": 4}),
    ("occurred_at", {"occurred_at": "later"}),
])
def test_same_key_different_content_conflicts(engine: Engine, observer: Engine, field: str,
                                              change: dict[str, Any]) -> None:
    when = utcnow() - timedelta(hours=3)
    with Session(engine) as db, db.begin():
        original = enqueue(db, occurred_at=when).id
    if change.get("occurred_at") == "later":
        change = {"occurred_at": when + timedelta(seconds=1)}
    args = {"occurred_at": when, **change}
    with Session(engine) as db, db.begin():
        with pytest.raises(IdempotencyConflict) as info:
            enqueue(db, **args)
        assert info.value.existing.id == original
    assert info.value.differences == [field]
    assert field in str(info.value)
    assert "usage_log:1" in str(info.value)
    with observer.connect() as conn:
        row = conn.execute(text("SELECT tenant_id, meter, quantity FROM stripe_usage_outbox"
                                )).one()
    assert tuple(row) == ("acme", "api_requests", 3)


def test_conflict_names_every_differing_field(engine: Engine) -> None:
    with Session(engine) as db, db.begin():
        enqueue(db)
    with Session(engine) as db, db.begin(), pytest.raises(IdempotencyConflict) as info:
        enqueue(db, tenant_id="globex", quantity=9)
    assert info.value.differences == ["tenant_id", "quantity"]


def test_callers_transaction_survives_a_refusal(engine: Engine) -> None:
    """Like a savepoint: a conflict or bad input leaves the caller's other work committable
    (on PostgreSQL a failed statement would otherwise abort the whole transaction)."""
    with Session(engine) as db, db.begin():
        enqueue(db, idempotency_key="taken")
    with Session(engine) as db, db.begin():
        kept = enqueue(db, idempotency_key="mine", quantity=5).id
        with pytest.raises(IdempotencyConflict):
            enqueue(db, idempotency_key="taken", quantity=6)
        with pytest.raises(InvalidUsage):
            enqueue(db, idempotency_key="bad", quantity=0)
        also = enqueue(db, idempotency_key="mine-too", quantity=7).id
    with Session(engine) as db:
        keys = set(db.scalars(select(OutboxEvent.idempotency_key)))
    assert keys == {"taken", "mine", "mine-too"}
    assert kept != also


# -- validation -----------------------------------------------------------------------------------

def _ago(**kw: float) -> datetime:
    return utcnow() - timedelta(**kw)


INVALID = [
    ("quantity-zero", {"quantity": 0}, "quantity"),
    ("quantity-negative", {"quantity": -1}, "quantity"),
    ("quantity-bool", {"quantity": True}, "quantity"),
    ("quantity-float", {"quantity": 1.5}, "quantity"),
    ("quantity-str", {"quantity": "3"}, "quantity"),
    ("quantity-16-digits", {"quantity": 10**15}, "quantity"),
    ("key-empty", {"idempotency_key": ""}, "idempotency_key"),
    ("key-101-chars", {"idempotency_key": "k" * 101}, "idempotency_key"),
    ("key-non-ascii", {"idempotency_key": "ké"}, "idempotency_key"),
    ("key-control-char", {"idempotency_key": "a\nb"}, "idempotency_key"),
    ("key-none", {"idempotency_key": None}, "idempotency_key"),
    ("tenant-empty", {"tenant_id": ""}, "tenant_id"),
    ("meter-empty", {"meter": ""}, "meter"),
    ("naive-datetime", {"occurred_at": datetime(2026, 1, 1, 12, 0)}, "occurred_at"),
    ("36-days-old", {"occurred_at": "36d"}, "occurred_at"),
    ("6-minutes-ahead", {"occurred_at": "+6m"}, "occurred_at"),
    ("not-a-datetime", {"occurred_at": "2026-01-01T00:00:00Z"}, "occurred_at"),
]


def _resolve_time(overrides: dict[str, Any]) -> dict[str, Any]:
    out = dict(overrides)
    if out.get("occurred_at") == "36d":
        out["occurred_at"] = _ago(days=36)
    elif out.get("occurred_at") == "+6m":
        out["occurred_at"] = utcnow() + timedelta(minutes=6)
    return out


@pytest.mark.parametrize(("overrides", "field"), [c[1:] for c in INVALID],
                         ids=[c[0] for c in INVALID])
def test_invalid_usage_names_the_field(engine: Engine, overrides: dict[str, Any],
                                       field: str) -> None:
    with Session(engine) as db, db.begin():
        with pytest.raises(InvalidUsage) as info:
            enqueue(db, **_resolve_time(overrides))
        assert info.value.field == field
        assert str(info.value).startswith(f"{field}:")
    assert count_rows(engine) == 0


VALID = [
    ("quantity-15-digits", {"quantity": 10**15 - 1}),
    ("quantity-one", {"quantity": 1}),
    ("key-100-chars", {"idempotency_key": "k" * 100}),
    ("key-printable-punctuation", {"idempotency_key": "usage_log:42/a-b.c~"}),
    # Times relative to the clock are read when the test runs, not at import.
    ("34-days-old", {"occurred_at": lambda: _ago(days=34)}),
    ("4-minutes-ahead", {"occurred_at": lambda: utcnow() + timedelta(minutes=4)}),
    ("other-timezone", {"occurred_at": lambda: datetime.now(UTC).astimezone(
        timezone(timedelta(hours=-7)))}),
]


@pytest.mark.parametrize("overrides", [c[1] for c in VALID], ids=[c[0] for c in VALID])
def test_valid_edges_accepted(engine: Engine, overrides: dict[str, Any]) -> None:
    overrides = {k: v() if callable(v) else v for k, v in overrides.items()}
    with Session(engine) as db, db.begin():
        row = enqueue(db, **overrides)
        row_id = row.id
    with Session(engine) as db:
        got = db.get(OutboxEvent, row_id)
        assert got is not None
        for name, value in overrides.items():
            assert getattr(got, name) == value


# -- PostgreSQL: two real concurrent transactions ------------------------------------------------

def _backend_waiting_on_lock(engine: Engine, pid: int) -> bool:
    with engine.connect() as conn:
        row = conn.execute(text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :p"),
                           {"p": pid}).first()
    return row is not None and row[0] == "Lock"


class _Second(threading.Thread):
    """Enqueues in a transaction of its own and reports its backend pid first."""

    def __init__(self, engine: Engine, **kw: Any) -> None:
        super().__init__(daemon=True)
        self.engine, self.kw = engine, kw
        self.pid: int | None = None
        self.ready = threading.Event()
        self.row_id: int | None = None
        self.error: BaseException | None = None
        self.existing_id: int | None = None

    def run(self) -> None:
        try:
            with Session(self.engine) as db, db.begin():
                self.pid = db.execute(text("SELECT pg_backend_pid()")).scalar_one()
                self.ready.set()
                try:
                    self.row_id = enqueue(db, **self.kw).id
                except IdempotencyConflict as exc:
                    self.existing_id = exc.existing.id
                    raise
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.error = exc
        finally:
            self.ready.set()


@pytest.fixture
def pg_engine(pg_url: str) -> Iterator[Engine]:
    eng = make_engine(pg_url)
    yield eng
    eng.dispose()


@pytest.mark.parametrize("first_commits", [True, False], ids=["first-commits", "first-rolls-back"])
def test_pg_concurrent_same_key(pg_engine: Engine, first_commits: bool) -> None:
    when = utcnow() - timedelta(minutes=1)
    with Session(pg_engine) as first:
        first.begin()
        first_id = enqueue(first, occurred_at=when).id
        second = _Second(pg_engine, occurred_at=when)
        second.start()
        assert second.ready.wait(10)
        assert second.pid is not None
        # The second INSERT waits on the first's uncommitted key.
        wait_for(lambda: _backend_waiting_on_lock(pg_engine, second.pid), 10,
                 message="the second transaction to wait on the first's lock")
        assert second.is_alive() and second.row_id is None
        if first_commits:
            first.commit()
        else:
            first.rollback()
        second.join(10)
    assert not second.is_alive()
    assert second.error is None, repr(second.error)
    assert count_rows(pg_engine) == 1
    with pg_engine.connect() as conn:
        only_id = conn.execute(select(OutboxEvent.id)).scalar_one()
    assert second.row_id == only_id
    if first_commits:
        assert only_id == first_id
    else:
        assert only_id != first_id


def test_pg_concurrent_same_key_different_content_conflicts(pg_engine: Engine) -> None:
    with Session(pg_engine) as first:
        first.begin()
        first_id = enqueue(first, quantity=3).id
        second = _Second(pg_engine, quantity=4)
        second.start()
        assert second.ready.wait(10)
        assert second.pid is not None
        wait_for(lambda: _backend_waiting_on_lock(pg_engine, second.pid), 10,
                 message="the second transaction to wait on the first's lock")
        first.commit()
        second.join(10)
    assert isinstance(second.error, IdempotencyConflict)
    assert second.error.differences == ["quantity"]
    assert second.existing_id == first_id
    assert count_rows(pg_engine) == 1
