"""Sending again what Stripe lost, on SQLite and PostgreSQL, through the real SDK against the
fake (which a test makes lose a customer's day: ``FakeStripe.forget``): reconciliation names
the day, it is sent again once under new identifiers, the drain sends it, and the next
reconciliation matches; a day Stripe holds part of is never sent again in bulk; the usage
rollup counts each event once throughout."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import date, datetime, timedelta
from typing import Any

import pytest
from conftest import cli, make_settings, worker_env
from sqlalchemy import Engine, select
from support.fake_stripe import FakeStripe

from webapp.db import reading
from webapp.models import AuditEntry, OutboxEvent, utcnow
from webapp.outbox import operations, rollups
from webapp.outbox.findings import Bucket, bucket_for
from webapp.outbox.operations import OperationError
from webapp.outbox.resend import plan_chosen, plan_day, resend_chosen, resend_day
from webapp.read.tenants import tenant_usage
from webapp.worker import Drainer, gateway_from, reconcile

from .test_reconcile_cancel import day_start, send

T = OutboxEvent.__table__
A = AuditEntry.__table__
#: Every test's own "now": later than anything the drain stamps, so the reconciliation
#: that starts then compared every event sent before it; the day lost at Stripe, two days
#: before; acme's bucket of that day. Set as each test starts (:func:`_clock`), never at
#: import: a suite reaches a module minutes after collecting it.
T0: datetime
LOST: date
ACME: Bucket


@pytest.fixture(autouse=True)
def _clock() -> None:
    global T0, LOST, ACME
    T0 = utcnow() + timedelta(hours=2)
    LOST = day_start(2).date()
    ACME = Bucket("cus_acme", "api_requests", LOST, "acme")


@pytest.fixture
def fake() -> Iterator[FakeStripe]:
    with FakeStripe(meters=("api_requests",)) as f:
        f.add_meter("logins", formula="count")
        yield f


@pytest.fixture
def settings(db_url: str, fake: FakeStripe) -> Any:
    return make_settings(db_url, stripe_api_base=fake.base_url, reconcile_settle_seconds=3600)


@pytest.fixture
def sent(engine: Engine, settings: Any) -> dict[str, list[int]]:
    """acme's api_requests on the lost day (4, 5 and 6 units) and the day before (2), and
    globex's on the lost day (7), billed to customers of their own; all sent."""
    for tenant in ("acme", "globex"):
        operations.set_tenant(engine, tenant, stripe_customer_id=f"cus_{tenant}", name=None,
                              now=utcnow())
    at, before = day_start(2) + timedelta(hours=10), day_start(3) + timedelta(hours=9)
    ids = send(engine, settings, [("acme", "api_requests", 4, at),
                                  ("acme", "api_requests", 5, at + timedelta(minutes=1)),
                                  ("acme", "api_requests", 6, at + timedelta(minutes=2)),
                                  ("acme", "api_requests", 2, before),
                                  ("globex", "api_requests", 7, at)])
    return {"lost": ids[:3], "before": ids[3:4], "globex": ids[4:]}


def run(engine: Engine, settings: Any, now: datetime) -> Any:
    gateway = gateway_from(settings)
    assert gateway is not None
    return reconcile(engine, gateway, settings, trigger="cli", now=now)


def drain(engine: Engine, settings: Any, now: datetime) -> None:
    drainer = Drainer(engine, settings, gateway_from(settings), clock=lambda: now)
    try:
        while drainer.drain_once().claimed:
            pass
    finally:
        drainer.close()


def rows(engine: Engine, ids: list[int]) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(select(T).where(T.c.id.in_(ids)).order_by(T.c.id)))


def sent_units(engine: Engine, day: date) -> int:
    """Usage sent for ``day``, as the pages read it (the rollup and the rows past it)."""
    return int(tenant_usage(engine, start=day, end=day).total("quantity", "sent"))


def test_a_lost_day_is_named_sent_again_once_and_then_matches(
        engine: Engine, fake: FakeStripe, settings: Any, sent: dict[str, list[int]]) -> None:
    margin = timedelta(minutes=15)
    assert rollups.fold(engine, now=T0, margin=margin)         # the day's events folded
    assert sent_units(engine, LOST) == 15 + 7
    assert fake.forget("cus_acme", "api_requests", LOST) == 3
    first = run(engine, settings, T0)
    assert [(m.stripe_customer_id, m.start.date(), m.local_units, m.stripe_units)
            for m in first.comparison.mismatches] == [("cus_acme", LOST, 15, 0.0)]
    keys = {r.id: r.idempotency_key for r in rows(engine, sent["lost"])}

    with reading(engine) as conn:
        preview = plan_day(conn, ACME, now=T0 + timedelta(minutes=1))
    assert (preview.ids, preview.units, preview.finding.run_id) == (sent["lost"], 15, first.id)
    assert [e.new_identifier for e in preview.events] == [f"{keys[i]}~r1" for i in preview.ids]
    done = resend_day(engine, ACME, actor="ops@example.com", now=T0 + timedelta(minutes=1),
                      expected=preview.ids)
    assert done.plan.ids == sent["lost"]
    moved = rows(engine, sent["lost"])
    assert {(r.status, r.stripe_identifier, r.stripe_customer_id, r.sent_at, r.attempt_count,
             r.call_count, r.key_generation) for r in moved} == {
        ("pending", f"{keys[r.id]}~r1", "cus_acme", None, 0, 0, 0) for r in moved}
    # Out of the sent usage at once (the rollup had them), not yet back in.
    assert sent_units(engine, LOST) == 7
    with engine.connect() as conn:
        entry = conn.execute(select(A).where(A.c.id == done.audit_id)).one()
    assert (entry.action, entry.actor, entry.event_count) == ("resend", "ops@example.com", 3)
    assert f"Reconciliation run {first.id} found Stripe holding none of api_requests for " \
           f"cus_acme (tenant acme) on {LOST}" in entry.note

    # Once: a second resend (a double click, a second run of the command) does nothing more.
    with pytest.raises(OperationError, match="Already sent again: 3 event"):
        resend_day(engine, ACME, actor="ops@example.com", now=T0 + timedelta(minutes=2))
    drain(engine, settings, T0 + timedelta(minutes=3))
    assert {r.status for r in rows(engine, sent["lost"])} == {"sent"}
    assert {f"{k}~r1" for k in keys.values()} <= set(fake.accepted())
    with pytest.raises(OperationError, match="Already sent again"):
        resend_day(engine, ACME, actor="ops@example.com", now=T0 + timedelta(minutes=4))
    rollups.fold(engine, now=T0 + timedelta(hours=2), margin=margin)
    assert sent_units(engine, LOST) == 15 + 7                  # each event counted once
    with reading(engine) as conn:
        assert rollups.read_mark(conn, rollups.SENT_USAGE).events == 5

    second = run(engine, settings, T0 + timedelta(hours=2))
    assert second.comparison.mismatches == [] and second.comparison.checked >= 3
    with pytest.raises(OperationError, match=f"run {second.id}, the latest to compare .* found "
                                             "no difference"):
        resend_day(engine, ACME, actor="ops@example.com", now=T0 + timedelta(hours=3))
    assert len(fake.accepted()) == 5 + 3


def test_a_day_stripe_holds_part_of_is_never_sent_again_in_bulk(
        engine: Engine, fake: FakeStripe, settings: Any, sent: dict[str, list[int]]) -> None:
    assert fake.forget("cus_acme", "api_requests", LOST, keep=1) == 2
    kept = {e.identifier for e in fake.accepted().values() if not e.lost}
    by_key = {r.idempotency_key: r for r in rows(engine, sent["lost"])}
    lost = [by_key[k].id for k in by_key if k not in kept]
    held = [by_key[k].id for k in by_key if k in kept]
    lacking = sum(by_key[k].quantity for k in by_key if k not in kept)
    first = run(engine, settings, T0)
    [m] = first.comparison.mismatches
    assert (m.local_units, m.stripe_units) == (15, 15 - lacking)
    later = T0 + timedelta(minutes=1)
    with pytest.raises(OperationError, match="part of the day, so its events are never sent "
                                             "again in bulk"):
        resend_day(engine, ACME, actor="ops@example.com", now=later)
    # Every event of the day is more than Stripe lacks.
    with pytest.raises(OperationError, match="choose fewer, or Stripe would count some twice"):
        resend_chosen(engine, ACME, sent["lost"], actor="ops@example.com", now=later)
    # Not of the day, or not sent: refused with the reason, nothing changes.
    with pytest.raises(OperationError, match=f"{sent['globex'][0]}: is not usage of "
                                             "api_requests for cus_acme"):
        resend_chosen(engine, ACME, [lost[0], sent["globex"][0]], actor="x", now=later)
    assert {r.status for r in rows(engine, sent["lost"])} == {"sent"}

    done = resend_chosen(engine, ACME, [lost[0]], actor="ops@example.com", now=later)
    assert done.plan.chosen and done.plan.ids == [lost[0]]
    with pytest.raises(OperationError, match=f"{lost[0]}: is pending: only sent events"):
        resend_chosen(engine, ACME, [lost[0]], actor="ops@example.com", now=later)
    # What was sent again since counts against what Stripe lacks.
    with reading(engine) as conn:
        plan = plan_chosen(conn, ACME, [lost[1]], now=later)
    assert plan.ids == [lost[1]]
    with pytest.raises(OperationError, match="after the .* sent again since"):
        resend_chosen(engine, ACME, [lost[1], held[0]], actor="ops@example.com", now=later)
    resend_chosen(engine, ACME, [lost[1]], actor="ops@example.com", now=later)
    drain(engine, settings, later + timedelta(minutes=1))
    assert run(engine, settings, T0 + timedelta(hours=2)).comparison.mismatches == []
    with engine.connect() as conn:
        notes = list(conn.execute(select(A.c.note, A.c.reason_code)
                                  .where(A.c.action == "resend").order_by(A.c.id)))
    assert [n.reason_code for n in notes] == ["stripe_holds_part"] * 2
    assert f"found Stripe holding {15 - lacking} of our 15" in notes[0].note
    assert "1 chosen event(s)" in notes[0].note


def test_what_was_not_found_missing_is_refused_with_one_line(
        engine: Engine, fake: FakeStripe, settings: Any, sent: dict[str, list[int]]) -> None:
    before = rows(engine, sent["lost"] + sent["before"])
    with pytest.raises(OperationError, match=f"No reconciliation has compared {LOST} for "
                                             "tenant acme"):
        resend_day(engine, ACME, actor="x", now=T0)
    fake.forget("cus_acme", "api_requests", LOST)
    run(engine, settings, T0)
    matched = Bucket("cus_acme", "api_requests", day_start(3).date(), "acme")
    with pytest.raises(OperationError, match="found no difference .*it matched, was still "
                                             "pending, or was not compared"):
        resend_day(engine, matched, actor="x", now=T0 + timedelta(minutes=1))
    old = Bucket("cus_acme", "api_requests", (T0 - timedelta(days=36)).date(), "acme")
    with pytest.raises(OperationError, match="more than 35 days ago: .* Bill it by hand"):
        resend_day(engine, old, actor="x", now=T0 + timedelta(minutes=1))
    # Thirty-five days on, the lost day itself is past Stripe's limit.
    with pytest.raises(OperationError, match="more than 35 days ago"):
        resend_day(engine, ACME, actor="x", now=T0 + timedelta(days=34))
    with reading(engine) as conn, pytest.raises(OperationError, match="No event of tenant "
                                                                      "initech"):
        bucket_for(conn, "initech", "api_requests", LOST)
    assert rows(engine, sent["lost"] + sent["before"]) == before
    with engine.connect() as conn:
        assert conn.execute(select(A.c.id).where(A.c.action == "resend")).first() is None


def test_the_command_sends_again_once_and_refuses_a_partly_held_day(
        engine: Engine, fake: FakeStripe, db_url: str, settings: Any,
        sent: dict[str, list[int]]) -> None:
    fake.forget("cus_acme", "api_requests", LOST)
    fake.forget("cus_globex", "api_requests", LOST, keep=0)
    env = worker_env(db_url, fake.base_url, RECONCILE_SETTLE_SECONDS="0")
    done = cli("reconcile", "--json", env=env)
    assert done.returncode == 0, done.stderr
    found = {m["stripe_customer_id"] for m in json.loads(done.stdout)["mismatches"]}
    assert found == {"cus_acme", "cus_globex"}
    args = ("reconcile", "resend", "--tenant", "acme", "--meter", "api_requests", "--day",
            LOST.isoformat())
    dry = cli(*args, "--dry-run", "--json", env=env)
    assert dry.returncode == 0, dry.stderr
    shown = json.loads(dry.stdout)
    assert (shown["dry_run"], shown["count"], shown["units"], shown["audit_id"]) == (
        True, 3, 15, None)
    assert [e["id"] for e in shown["events"]] == sent["lost"]
    assert {r.status for r in rows(engine, sent["lost"])} == {"sent"}

    out = cli(*args, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"sent again 3 event(s), 15 units of api_requests for "
                                 f"cus_acme (tenant acme) on {LOST}")
    assert "cannot bill twice" in out.stdout
    with engine.connect() as conn:
        actor = conn.execute(select(A.c.actor).where(A.c.action == "resend")).scalar_one()
    assert actor.startswith("cli:")
    again = cli(*args, env=env)
    assert again.returncode == 1 and again.stdout == ""
    assert again.stderr.startswith("billing-outbox: Already sent again: 3 event(s)")
    assert len(again.stderr.strip().splitlines()) == 1
    drain(engine, settings, utcnow())

    # globex: Stripe holds part of its day once it counts one event sent again by hand.
    fake.add_usage("cus_globex", "api_requests", int(day_start(2).timestamp()) + 60, 3)
    assert cli("reconcile", env=env).returncode == 0
    partly = cli("reconcile", "resend", "--tenant", "globex", "--meter", "api_requests",
                 "--day", LOST.isoformat(), env=env)
    assert partly.returncode == 1
    assert "never sent again in bulk" in partly.stderr
    assert len(partly.stderr.strip().splitlines()) == 1
    assert rows(engine, sent["globex"])[0].status == "sent"
    bad = cli("reconcile", "resend", "--tenant", "acme", "--meter", "api_requests", "--day",
              "2026-02-30", env=env)
    assert bad.returncode == 2 and "--day" in bad.stderr


def test_two_resends_at_once_send_the_day_again_once(
        engine: Engine, fake: FakeStripe, settings: Any, sent: dict[str, list[int]]) -> None:
    """Two people (or a double click reaching two processes) at the same moment: the rollup's
    lock orders them, and the second finds the day already sent again."""
    import threading

    fake.forget("cus_acme", "api_requests", LOST)
    run(engine, settings, T0)
    results: list[Any] = []
    start = threading.Barrier(2)

    def resend() -> None:
        start.wait()
        try:
            results.append(resend_day(engine, ACME, actor="ops@example.com",
                                      now=T0 + timedelta(minutes=1)))
        except OperationError as exc:
            results.append(exc)

    threads = [threading.Thread(target=resend) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done = [r for r in results if not isinstance(r, OperationError)]
    refused = [str(r) for r in results if isinstance(r, OperationError)]
    assert len(done) == 1 and len(refused) == 1 and refused[0].startswith("Already sent again")
    with engine.connect() as conn:
        assert conn.execute(select(A.c.id).where(A.c.action == "resend")).all() == [
            (done[0].audit_id,)]
    assert {r.stripe_identifier for r in rows(engine, sent["lost"])} == {
        f"{r.idempotency_key}~r1" for r in rows(engine, sent["lost"])}


def test_a_later_run_of_one_tenant_decides_for_that_tenant(
        engine: Engine, fake: FakeStripe, settings: Any, sent: dict[str, list[int]]) -> None:
    """The latest reconciliation that compared the day decides: a run of every tenant, or a
    later one of the tenant alone; the customer's day as a whole then waits for a run of
    every tenant."""
    fake.forget("cus_acme", "api_requests", LOST)
    run(engine, settings, T0)
    gateway = gateway_from(settings)
    assert gateway is not None
    alone = reconcile(engine, gateway, settings, trigger="cli", tenant_id="acme",
                      now=T0 + timedelta(minutes=1))
    assert len(alone.comparison.mismatches) == 1
    everyone = Bucket("cus_acme", "api_requests", LOST)
    with reading(engine) as conn:
        with pytest.raises(OperationError, match=f"run {alone.id}, of tenant acme only"):
            plan_day(conn, everyone, now=T0 + timedelta(minutes=2))
        assert plan_day(conn, ACME, now=T0 + timedelta(minutes=2)).finding.run_id == alone.id
