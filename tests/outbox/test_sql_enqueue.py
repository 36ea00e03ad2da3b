"""``billing_outbox_enqueue(…)`` against ``enqueue_usage``, on PostgreSQL: one table of cases
through both doors — each refuses the same input naming the same field (SQLSTATE 22023, its
``COLUMN`` the field), accepts the same, and finds the same event again — then the same key
with other content (23505, the same words), the caller's transaction (commit and roll back),
two transactions racing with one key, and the default meter the project recorded."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

from webapp.models import OutboxEvent
from webapp.outbox import enqueue_usage
from webapp.outbox.enqueue import IdempotencyConflict, InvalidUsage
from webapp.outbox.producers import record_default_meter

OK = None


class Ago(timedelta):
    """A time relative to the moment a case runs (never to when the module was imported: a
    suite under load may reach a case many minutes later)."""


def _at(given: dict[str, Any]) -> dict[str, Any]:
    """``given`` with each :class:`Ago` made a time, as of now."""
    now = datetime.now(UTC)
    return {k: now - v if isinstance(v, Ago) else v for k, v in given.items()}


#: (label, arguments, the field refused or OK). The same for both doors.
CASES: list[tuple[str, dict[str, Any], str | None]] = [
    ("plain", {}, OK),
    ("a non-ASCII tenant", {"tenant_id": "Zürich-租户-🚀"}, OK),
    ("the largest quantity", {"quantity": 10**15 - 1}, OK),
    ("34 days old", {"occurred_at": Ago(days=34)}, OK),
    ("a minute ahead", {"occurred_at": Ago(minutes=-1)}, OK),
    ("a meter named", {"meter": "storage_gb"}, OK),
    ("no tenant", {"tenant_id": None}, "tenant_id"),
    ("an empty tenant", {"tenant_id": ""}, "tenant_id"),
    ("a tenant of 101 characters", {"tenant_id": "t" * 101}, "tenant_id"),
    ("a tenant of 100 characters", {"tenant_id": "t" * 100}, OK),
    ("a newline in the tenant", {"tenant_id": "a\nb"}, "tenant_id"),
    ("a leading space", {"tenant_id": " acme"}, "tenant_id"),
    ("a trailing space", {"tenant_id": "acme "}, "tenant_id"),
    ("a no-break space", {"tenant_id": "ac\u00a0me"}, "tenant_id"),
    ("a zero-width space", {"tenant_id": "ac\u200bme"}, "tenant_id"),
    ("an unassigned code point", {"tenant_id": "ac\u0378me"}, "tenant_id"),
    ("a private-use character", {"tenant_id": "ac\ue000me"}, "tenant_id"),
    ("a right-to-left override", {"tenant_id": "ac\u202eme"}, "tenant_id"),
    ("an inner space", {"tenant_id": "acme corp"}, OK),
    ("no key", {"idempotency_key": None}, "idempotency_key"),
    ("a non-ASCII key", {"idempotency_key": "clé-1"}, "idempotency_key"),
    ("a tab in the key", {"idempotency_key": "k\t1"}, "idempotency_key"),
    ("a key of 101 characters", {"idempotency_key": "k" * 101}, "idempotency_key"),
    ("an empty meter", {"meter": ""}, "meter"),
    ("a meter with a space before", {"meter": " api"}, "meter"),
    ("no quantity", {"quantity": None}, "quantity"),
    ("zero", {"quantity": 0}, "quantity"),
    ("negative", {"quantity": -5}, "quantity"),
    ("16 digits", {"quantity": 10**15}, "quantity"),
    ("36 days old", {"occurred_at": Ago(days=36)}, "occurred_at"),
    ("ten minutes ahead", {"occurred_at": Ago(minutes=-10)}, "occurred_at"),
]


def arguments(i: int, given: dict[str, Any]) -> dict[str, Any]:
    return {"tenant_id": "acme", "quantity": 3, "idempotency_key": f"case:{i}", "meter": None,
            "occurred_at": None, **given}


def through_python(engine: Engine, args: dict[str, Any]) -> int:
    with Session(engine) as s, s.begin():
        return enqueue_usage(s, **args).id


def through_sql(engine: Engine, args: dict[str, Any]) -> int:
    with engine.begin() as conn:
        return int(conn.execute(text(
            "SELECT billing_outbox_enqueue(:tenant_id, :quantity, :idempotency_key, :meter, "
            ":occurred_at)"), args).scalar_one())


def sql_error(exc: BaseException) -> psycopg.Error:
    orig = getattr(exc, "orig", exc)
    assert isinstance(orig, psycopg.Error), exc
    return orig


@pytest.mark.parametrize(("label", "given", "refused"), CASES, ids=[c[0] for c in CASES])
def test_both_doors_take_and_refuse_the_same(pg: Engine, label: str, given: dict[str, Any],
                                             refused: str | None) -> None:
    i = CASES.index((label, given, refused))
    given = _at(given)
    py_args = arguments(i, given)
    sql_args = {**py_args, "idempotency_key": py_args["idempotency_key"]}
    if refused is None:
        sql_args["idempotency_key"] = f"sql:{i}"
        py_id = through_python(pg, py_args)
        sql_id = through_sql(pg, sql_args)
        with pg.connect() as conn:
            rows = {r.id: r for r in conn.execute(select(OutboxEvent.__table__)
                                                  .where(OutboxEvent.id.in_([py_id, sql_id])))}
        a, b = rows[py_id], rows[sql_id]
        for col in ("tenant_id", "meter", "quantity", "status", "attempt_count", "call_count",
                    "key_generation", "stripe_customer_id"):
            assert getattr(a, col) == getattr(b, col), col
        if given.get("occurred_at") is not None:
            assert a.occurred_at == b.occurred_at == given["occurred_at"]
        # The same key with the same content again: the same event, through either door.
        assert through_sql(pg, py_args) == py_id
        assert through_python(pg, sql_args) == sql_id
        return
    with pytest.raises(InvalidUsage) as py_refusal:
        through_python(pg, py_args)
    assert py_refusal.value.field == refused
    with pytest.raises(Exception) as sql_refusal:  # noqa: B017,PT011 - checked below
        through_sql(pg, sql_args)
    err = sql_error(sql_refusal.value)
    assert err.sqlstate == "22023"
    assert err.diag.column_name == refused
    assert err.diag.message_primary is not None
    assert err.diag.message_primary.startswith(f"{refused}: ")
    if given.get(refused) is not None:  # the words too (Python says "NoneType" for null)
        assert err.diag.message_primary == str(py_refusal.value)


def test_the_same_key_with_other_content_is_refused_in_the_same_words(pg: Engine) -> None:
    NOW = datetime.now(UTC)  # noqa: N806 - one moment for the whole test
    first = through_python(pg, arguments(0, {"occurred_at": NOW}))
    for change, fields in (({"quantity": 4}, "quantity"),
                           ({"tenant_id": "globex", "meter": "storage_gb"}, "tenant_id, meter"),
                           ({"occurred_at": NOW + timedelta(seconds=2)}, "occurred_at")):
        args = arguments(0, {"occurred_at": NOW, **change})
        with pytest.raises(IdempotencyConflict) as py_conflict:
            through_python(pg, args)
        with pytest.raises(Exception) as sql_conflict:  # noqa: B017,PT011 - checked below
            through_sql(pg, args)
        err = sql_error(sql_conflict.value)
        assert err.sqlstate == "23505"
        assert err.diag.message_primary == str(py_conflict.value)
        assert err.diag.message_primary.endswith(f"event {first} with a different {fields}")
    # Within the same second, and with no time given, it is the same event.
    assert through_sql(pg, arguments(0, {"occurred_at": NOW.replace(microsecond=0)
                                         if NOW.microsecond else NOW})) == first
    assert through_sql(pg, arguments(0, {})) == first


def test_it_commits_and_rolls_back_with_the_caller(pg: Engine) -> None:
    with pg.connect() as conn:
        conn.execute(text("SELECT billing_outbox_enqueue('acme', 1, 'rolled-back')"))
        conn.rollback()
        kept = int(conn.execute(text("SELECT billing_outbox_enqueue('acme', 1, 'kept')"))
                   .scalar_one())
        conn.commit()
    with pg.connect() as conn:
        keys = set(conn.execute(select(OutboxEvent.idempotency_key)).scalars())
        assert keys == {"kept"}
        row = conn.execute(select(OutboxEvent.__table__).where(OutboxEvent.id == kept)).one()
    assert (row.status, row.meter, row.quantity) == ("pending", "api_requests", 1)
    assert abs((row.occurred_at - datetime.now(UTC)).total_seconds()) < 60


def test_two_transactions_with_one_key_make_one_event(pg: Engine) -> None:
    """The second waits for the first; when it commits, the second finds its event."""
    first = pg.connect()
    first.execute(text("SELECT billing_outbox_enqueue('acme', 7, 'raced')"))
    got: list[Any] = []

    def second() -> None:
        with pg.connect() as conn:
            got.append(conn.execute(text("SELECT billing_outbox_enqueue('acme', 7, 'raced')"))
                       .scalar_one())
            conn.commit()

    t = threading.Thread(target=second)
    t.start()
    t.join(timeout=1.0)
    assert t.is_alive(), "the second transaction waits for the first"
    first.commit()
    t.join(timeout=10)
    with pg.connect() as conn:
        ids = conn.execute(select(OutboxEvent.id).where(
            OutboxEvent.idempotency_key == "raced")).scalars().all()
    first.close()
    assert got == ids and len(ids) == 1


def test_the_default_meter_is_the_one_the_project_recorded(pg: Engine) -> None:
    record_default_meter(pg, "storage_gb", now=datetime.now(UTC))
    with pg.begin() as conn:
        event_id = conn.execute(text("SELECT billing_outbox_enqueue('acme', 1, 'm1')")
                                ).scalar_one()
        meter = conn.execute(select(OutboxEvent.meter).where(OutboxEvent.id == event_id)
                             ).scalar_one()
    assert meter == "storage_gb"


def test_a_callers_search_path_cannot_redirect_it(pg: Engine) -> None:
    """A table of the same name earlier on the caller's path is not the one written."""
    with pg.begin() as conn:
        conn.execute(text("CREATE TEMP TABLE stripe_usage_outbox (id bigint) ON COMMIT DROP"))
        conn.execute(text("SELECT billing_outbox_enqueue('acme', 1, 'pinned')"))
        assert conn.execute(text("SELECT count(*) FROM pg_temp.stripe_usage_outbox")
                            ).scalar_one() == 0
    with pg.connect() as conn:
        assert conn.execute(select(OutboxEvent.id).where(
            OutboxEvent.idempotency_key == "pinned")).scalar() is not None


@pytest.fixture
def pg(pg_url: str) -> Iterator[Engine]:
    from webapp.db import make_engine

    eng = make_engine(pg_url)
    yield eng
    eng.dispose()


def test_a_draining_process_records_its_default_meter(pg: Engine, pg_url: str) -> None:
    """Each drainer records its STRIPE_METER_EVENT_NAME as it starts; the function follows."""
    from conftest import make_settings

    from webapp.worker import Drainer

    drainer = Drainer(pg, make_settings(pg_url, stripe_meter_event_name="compute_minutes"),
                      None)
    drainer.announce("worker")
    try:
        with pg.begin() as conn:
            event_id = conn.execute(text("SELECT billing_outbox_enqueue('acme', 2, 'dm')")
                                    ).scalar_one()
            assert conn.execute(select(OutboxEvent.meter).where(OutboxEvent.id == event_id)
                                ).scalar_one() == "compute_minutes"
    finally:
        drainer.close()


def test_a_default_meter_not_recorded_at_start_is_recorded_later(
        pg: Engine, pg_url: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The database did not answer as the drainer started (a pooler dropping its connections,
    a failover): the warning says so, and a later pass records the meter."""
    from conftest import make_settings
    from sqlalchemy.exc import OperationalError

    from webapp.worker import Drainer
    from webapp.worker import drainer as drainer_module

    real = drainer_module.record_default_meter
    calls = []

    def flaky(engine: Engine, meter: str, *, now: Any) -> None:
        calls.append(meter)
        if len(calls) == 1:
            raise OperationalError("SELECT", {}, Exception("server closed the connection"))
        real(engine, meter, now=now)

    monkeypatch.setattr(drainer_module, "record_default_meter", flaky)
    clock = [1000.0]
    drainer = Drainer(pg, make_settings(pg_url, stripe_meter_event_name="gpu_seconds"), None,
                      monotonic=lambda: clock[0])
    try:
        with caplog.at_level("WARNING", logger="webapp.worker.drainer"):
            drainer.announce("worker")
        assert "the database did not answer: OperationalError" in caplog.text
        assert "db upgrade" not in caplog.text
        drainer.drain_once()
        assert len(calls) == 1  # not before the retry is due
        clock[0] += drainer_module.METER_RECORD_RETRY_SECONDS
        drainer.drain_once()
        drainer.drain_once()
        assert calls == ["gpu_seconds", "gpu_seconds"]
        with pg.begin() as conn:
            event_id = conn.execute(text("SELECT billing_outbox_enqueue('acme', 2, 'late')")
                                    ).scalar_one()
            assert conn.execute(select(OutboxEvent.meter).where(OutboxEvent.id == event_id)
                                ).scalar_one() == "gpu_seconds"
    finally:
        drainer.close()


def test_the_documented_grants_let_a_producer_enqueue_and_nothing_else(pg: Engine) -> None:
    import secrets

    from webapp.outbox.sql_enqueue import grant_statements

    role = f"producer_{secrets.token_hex(4)}"
    with pg.begin() as conn:
        schema = conn.execute(text("SELECT current_schema()")).scalar_one()
        conn.execute(text(f'CREATE ROLE "{role}"'))
    try:
        with pg.begin() as conn:
            for statement in grant_statements(schema, role):
                conn.execute(text(statement))
        with pg.begin() as conn:
            conn.execute(text(f'SET LOCAL ROLE "{role}"'))
            first = conn.execute(text("SELECT billing_outbox_enqueue('acme', 1, 'g1')")
                                 ).scalar_one()
            assert conn.execute(text("SELECT billing_outbox_enqueue('acme', 1, 'g1')")
                                ).scalar_one() == first
        for forbidden in ("SELECT status FROM stripe_usage_outbox",
                          "SELECT stripe_customer_id FROM stripe_usage_outbox",
                          "UPDATE stripe_usage_outbox SET quantity = 2",
                          "DELETE FROM stripe_usage_outbox",
                          "SELECT * FROM billing_tenants"):
            with pytest.raises(Exception) as refused, pg.begin() as conn:  # noqa: PT011
                conn.execute(text(f'SET LOCAL ROLE "{role}"'))
                conn.execute(text(forbidden))
            assert sql_error(refused.value).sqlstate == "42501", forbidden
    finally:
        with pg.begin() as conn:
            conn.execute(text(f'DROP OWNED BY "{role}"'))
            conn.execute(text(f'DROP ROLE "{role}"'))


def test_its_events_say_they_came_from_sql(pg: Engine) -> None:
    with pg.begin() as conn:
        event_id = conn.execute(text("SELECT billing_outbox_enqueue('acme', 1, 'src')")
                                ).scalar_one()
        assert conn.execute(select(OutboxEvent.source).where(OutboxEvent.id == event_id)
                            ).scalar_one() == "sql"
