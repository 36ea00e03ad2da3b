"""Late usage, on both databases: which events are late (sent after their invoice was
finalized, or still unsent in a finalized period), and what a person does about them —
billed on the next invoice under a new identifier, or written off — each once, audited,
refused for an event that is not late."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine, func, select
from support.billing_rows import finalized_period

from webapp.models import AuditEntry
from webapp.outbox import late
from webapp.outbox.operations import OperationError

from .helpers import T0, T

AUDIT = AuditEntry.__table__


def _setup(engine: Engine, *, period_open: bool = True) -> dict[str, list[int]]:
    return finalized_period(engine, now=T0, period_open=period_open)


def _late_ids(engine: Engine) -> list[int]:
    with engine.connect() as conn:
        return [e.id for e in late.late_events(conn)]


def test_late_is_what_came_after_the_finalization(engine: Engine) -> None:
    ids = _setup(engine)
    assert _late_ids(engine) == ids["sent_late"] + ids["unsent"]


def test_bill_next_sends_each_again_in_the_open_period_once(engine: Engine) -> None:
    ids = _setup(engine)
    now = T0 + timedelta(minutes=1)
    result = late.bill_next(engine, ids["sent_late"], actor="ops@example.com",
                            note="January's backlog", now=now)
    assert sorted(result.new_events) == ids["sent_late"]
    with engine.connect() as conn:
        new = {r.id: r for r in conn.execute(select(T).where(
            T.c.id.in_(list(result.new_events.values()))))}
        originals = {r.id: r for r in conn.execute(select(T).where(
            T.c.id.in_(ids["sent_late"])))}
    for original, new_id in result.new_events.items():
        row, old = new[new_id], originals[original]
        assert (row.tenant_id, row.meter, row.quantity, row.stripe_customer_id) == \
            (old.tenant_id, old.meter, old.quantity, "cus_A")
        assert row.status == "pending" and row.occurred_at == now
        assert row.idempotency_key.startswith(f"late:{original}:")
        assert len(row.idempotency_key) <= 100 and row.idempotency_key != old.idempotency_key
        assert old.status == "sent"                 # the original keeps its status
    assert _late_ids(engine) == ids["unsent"]
    # A second run does nothing more.
    again = late.bill_next(engine, ids["sent_late"], actor="ops@example.com",
                           note="again", now=now)
    assert again.audit_id is None and again.new_events == {}
    assert set(again.already) == set(ids["sent_late"])
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(T)).scalar() == 8
        entries = conn.execute(select(AUDIT.c.action, AUDIT.c.note)).all()
    assert [tuple(e) for e in entries] == [("late_bill_next", "January's backlog")]


def test_write_off_closes_them_once_with_a_reason(engine: Engine) -> None:
    ids = _setup(engine)
    result = late.write_off(engine, ids["unsent"] + ids["sent_late"], actor="ops",
                            reason="written_off", note="too small to chase", now=T0)
    assert sorted(result.handled) == sorted(ids["unsent"] + ids["sent_late"])
    assert _late_ids(engine) == []
    again = late.write_off(engine, ids["unsent"], actor="ops", reason="written_off",
                           note="again", now=T0)
    assert again.audit_id is None and again.handled == []
    with pytest.raises(OperationError, match="reason must be one of"):
        late.write_off(engine, ids["unsent"], actor="ops", reason="nope", note="x", now=T0)


def test_an_event_that_is_not_late_is_refused_and_nothing_applies(engine: Engine) -> None:
    ids = _setup(engine)
    for bad in (ids["on_time"][0], ids["next"][0], 999_999):
        with pytest.raises(OperationError, match=f"event {bad} is not late"):
            late.bill_next(engine, [ids["sent_late"][0], bad], actor="ops", note="n", now=T0)
        with pytest.raises(OperationError, match=f"event {bad} is not late"):
            late.write_off(engine, [ids["unsent"][0], bad], actor="ops", reason="other",
                           note="n", now=T0)
    assert _late_ids(engine) == ids["sent_late"] + ids["unsent"]
    with pytest.raises(OperationError, match="note is required"):
        late.bill_next(engine, ids["sent_late"], actor="ops", note=" ", now=T0)


def test_bill_next_needs_an_open_period(engine: Engine) -> None:
    ids = _setup(engine, period_open=False)
    with pytest.raises(OperationError, match="no open billing period"):
        late.bill_next(engine, ids["sent_late"], actor="ops", note="n", now=T0)
    assert _late_ids(engine) == ids["sent_late"] + ids["unsent"]
