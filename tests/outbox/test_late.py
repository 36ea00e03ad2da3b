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


def test_the_judge_reads_recent_sends_and_lines_learned_since(engine: Engine) -> None:
    from sqlalchemy import update
    from sqlalchemy.orm import Session

    from webapp.outbox import enqueue_usage, invoices
    from webapp.outbox.invoices import InvoiceInfo, LinePeriod
    from webapp.outbox.sql import LINE_EVENTS as found

    ids = _setup(engine)                     # the first pass (at T0) found sent_late
    with engine.connect() as conn:
        assert sorted(conn.execute(select(found.c.event_id).where(
            found.c.place == "late")).scalars()) == sorted(ids["sent_late"] + ids["unsent"])
    # Sent after the pass, in the finalized period: found by the next pass only.
    with Session(engine) as db, db.begin():
        extra = enqueue_usage(db, tenant_id="acme", quantity=7, idempotency_key="later",
                              occurred_at=T0 - timedelta(hours=4), now=T0).id
    later = T0 + timedelta(minutes=20)
    with engine.begin() as conn:
        conn.execute(update(T).where(T.c.id == extra).values(
            status="sent", sent_at=later, first_attempt_at=later, stripe_customer_id="cus_A"))
    assert extra not in _late_ids(engine)
    assert late.find_late(engine, now=later + timedelta(minutes=1)) == 1   # its line
    assert extra in _late_ids(engine)
    # An earlier invoice learned only now (its period: the one before): events sent long
    # before this pass, but after that finalization, are late too.
    before_start = T0 - timedelta(days=63)
    with Session(engine) as db, db.begin():
        old = enqueue_usage(db, tenant_id="acme", quantity=5, idempotency_key="old",
                            occurred_at=T0 - timedelta(days=40),
                            now=T0 - timedelta(days=21)).id
    with engine.begin() as conn:
        conn.execute(update(T).where(T.c.id == old).values(
            status="sent", sent_at=T0 - timedelta(days=20),
            first_attempt_at=T0 - timedelta(days=20), stripe_customer_id="cus_A"))
    late.find_late(engine, now=later + timedelta(minutes=2))
    assert old not in _late_ids(engine)                                  # no invoice known
    invoices.store_invoices(engine, [InvoiceInfo(
        "in_old", "cus_A", "sub_A", "paid", T0 - timedelta(days=33), None,
        T0 - timedelta(days=33) + timedelta(hours=1),
        (LinePeriod("si_A", before_start, T0 - timedelta(days=33), 1),))],
        now=later + timedelta(minutes=3))
    late.find_late(engine, now=later + timedelta(minutes=4))
    assert old in _late_ids(engine)
    # Judged again, nothing is listed twice; a handled event is not listed again.
    late.find_late(engine, now=later + timedelta(minutes=5))
    assert len(_late_ids(engine)) == len(set(_late_ids(engine)))
    late.write_off(engine, [old], actor="ops", reason="written_off", note="old", now=later)
    assert old not in _late_ids(engine)


def test_a_late_event_billed_next_counts_once_in_usage(engine: Engine) -> None:
    """Tenants & usage, the tenant page and ``usage --json`` count the original, never its
    copy too: 3 units late billed next are 3 units, not 6 (pending or sent)."""
    from sqlalchemy import update

    from webapp.read.tenants import usage_in

    ids = _setup(engine)
    start, end = (T0 - timedelta(days=40)).date(), (T0 + timedelta(days=1)).date()

    def units() -> dict[str, int]:
        with engine.connect() as conn:
            found = usage_in(conn, start=start, end=end, tenant_id="acme")
        return {s: sum(r.quantity[s] for r in found.rows) for s in ("sent", "pending")}

    before = units()
    result = late.bill_next(engine, ids["sent_late"], actor="ops", note="x",
                            now=T0 + timedelta(minutes=1))
    assert units() == before                                 # the copies are pending
    with engine.begin() as conn:
        conn.execute(update(T).where(T.c.id.in_(list(result.new_events.values())))
                     .values(status="sent", sent_at=T0 + timedelta(minutes=2)))
    assert units() == before                                 # and once they are sent
