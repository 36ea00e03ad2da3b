"""Reconciliation against Stripe's meter event summaries, and cancelling at Stripe, on SQLite
and PostgreSQL, through the real SDK against the fake (whose summaries count what it accepted,
minus what was cancelled or found invalid, plus what ``add_usage`` adds)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from conftest import cli, make_settings, worker_env
from sqlalchemy import Engine, func, select, text, update
from sqlalchemy.orm import Session
from support.fake_stripe import FakeStripe

from webapp.models import AuditEntry, OutboxEvent, utcnow
from webapp.outbox import enqueue_usage, operations
from webapp.outbox.reconciliation import spans
from webapp.read.words import CANCEL_WORDS
from webapp.worker import Drainer, cancel_events, gateway_from, reconcile

T = OutboxEvent.__table__
DAY = timedelta(days=1)


@pytest.fixture
def fake() -> Iterator[FakeStripe]:
    with FakeStripe(meters=("api_requests", "seats")) as f:
        f.add_meter("logins", formula="count")
        f.add_meter("plan_level", formula="last")
        yield f


@pytest.fixture
def settings(db_url: str, fake: FakeStripe) -> Any:
    return make_settings(db_url, stripe_api_base=fake.base_url, reconcile_settle_seconds=3600)


def day_start(days_ago: int) -> datetime:
    now = utcnow()
    return datetime(now.year, now.month, now.day, tzinfo=UTC) - days_ago * DAY


def send(engine: Engine, settings: Any, events: list[tuple[str, str, int, datetime]]) -> list[int]:
    """Enqueue (tenant, meter, quantity, occurred_at) events and drain them all."""
    ids = []
    with Session(engine) as db, db.begin():
        for n, (tenant, meter, quantity, at) in enumerate(events):
            ids.append(int(enqueue_usage(db, tenant_id=tenant, quantity=quantity, meter=meter,
                                         idempotency_key=f"{tenant}:{meter}:{n}",
                                         occurred_at=at).id))
    drainer = Drainer(engine, settings, gateway_from(settings))
    try:
        while drainer.drain_once().claimed:
            pass
    finally:
        drainer.close()
    with engine.connect() as conn:
        assert set(conn.execute(select(T.c.status)).scalars()) == {"sent"}
    return ids


@pytest.fixture
def history(engine: Engine, settings: Any) -> list[int]:
    """Two customers, two summed meters and a counted one, over three past days."""
    for tenant in ("acme", "globex"):
        operations.set_tenant(engine, tenant, stripe_customer_id=f"cus_{tenant}", name=None,
                              now=utcnow())
    events = []
    for days_ago in (1, 2, 3):
        at = day_start(days_ago) + timedelta(hours=10)
        events += [("acme", "api_requests", 3 * days_ago, at), ("acme", "api_requests", 1, at),
                   ("globex", "api_requests", 7, at), ("acme", "seats", 2, at),
                   ("globex", "logins", 5, at), ("globex", "logins", 6, at)]
    return send(engine, settings, events)


def later() -> datetime:
    """Two hours from now: every event sent in the test is settled by then."""
    return utcnow() + timedelta(hours=2)


def test_a_clean_window_has_no_mismatch(engine: Engine, fake: FakeStripe, settings: Any,
                                        history: list[int]) -> None:
    gateway = gateway_from(settings)
    assert gateway is not None
    run = reconcile(engine, gateway, settings, trigger="cli", now=later())
    assert run.errors == [] and run.comparison.mismatches == []
    assert run.comparison.checked == 12          # 4 pairs x 3 days
    # Few calls: one per (customer, meter) and span of the window.
    pairs = 4
    assert run.calls == pairs * len(spans(run.since, run.until)) == fake.summary_calls


def test_a_run_counts_its_own_calls_on_the_process_gateway(
        engine: Engine, fake: FakeStripe, settings: Any, history: list[int]) -> None:
    """The process has one gateway: calls another thread makes through it while the run is
    on (the drainer's, the pages') are not the run's."""
    gateway = gateway_from(settings)
    assert gateway is not None
    stop = threading.Event()

    def other_calls() -> None:
        while not stop.is_set():
            gateway.list_meters()

    other = threading.Thread(target=other_calls)
    other.start()
    try:
        while gateway.calls < 3:  # the other thread is calling before the run starts
            time.sleep(0.01)
        run = reconcile(engine, gateway, settings, trigger="cli", now=later())
    finally:
        stop.set()
        other.join()
    assert run.errors == []
    assert run.calls == 4 * len(spans(run.since, run.until)) == fake.summary_calls
    assert gateway.calls > run.calls + 3


def test_drift_names_exactly_the_drifted_buckets(engine: Engine, fake: FakeStripe,
                                                 settings: Any, history: list[int]) -> None:
    two_days_ago = int((day_start(2) + timedelta(hours=15)).timestamp())
    fake.add_usage("cus_acme", "api_requests", two_days_ago, 40)      # another system sent
    fake.add_usage("cus_globex", "logins", int(day_start(1).timestamp()) + 60, 1)  # an event
    gateway = gateway_from(settings)
    assert gateway is not None
    run = reconcile(engine, gateway, settings, trigger="cli", now=later())
    found = sorted((m.stripe_customer_id, m.meter, m.start, m.local_units, m.stripe_units,
                    m.difference) for m in run.comparison.mismatches)
    assert found == [
        ("cus_acme", "api_requests", day_start(2), 7, 47.0, 40.0),
        ("cus_globex", "logins", day_start(1), 2, 3.0, 1.0),          # counted in events
    ]
    m = next(m for m in run.comparison.mismatches if m.meter == "api_requests")
    assert m.as_dict() == {"tenant_id": "acme", "stripe_customer_id": "cus_acme",
                           "meter": "api_requests",
                           "start": day_start(2).isoformat().replace("+00:00", "Z"),
                           "end": day_start(1).isoformat().replace("+00:00", "Z"),
                           "local_units": 7, "stripe_units": 47, "difference": 40}


def test_young_buckets_are_pending_not_mismatched(engine: Engine, fake: FakeStripe,
                                                  settings: Any, history: list[int]) -> None:
    fake.add_usage("cus_acme", "api_requests", int(day_start(2).timestamp()) + 60, 40)
    gateway = gateway_from(settings)
    assert gateway is not None
    # Just now: every event was sent within the settle time.
    run = reconcile(engine, gateway, settings, trigger="cli", now=utcnow())
    assert run.comparison.mismatches == [] and run.comparison.pending == 12


def test_a_last_value_meter_is_skipped_saying_so(engine: Engine, fake: FakeStripe,
                                                 settings: Any, history: list[int]) -> None:
    send(engine, settings, [("acme", "plan_level", 3, day_start(2))])
    gateway = gateway_from(settings)
    assert gateway is not None
    run = reconcile(engine, gateway, settings, trigger="cli", now=later())
    assert any("plan_level" in n and "last" in n for n in run.notes)
    assert run.comparison.mismatches == []


def test_the_command_prints_the_contracts_json_and_stores_the_run(
        engine: Engine, fake: FakeStripe, db_url: str, history: list[int]) -> None:
    fake.add_usage("cus_acme", "seats", int(day_start(3).timestamp()) + 60, -2)  # dropped
    env = worker_env(db_url, fake.base_url, RECONCILE_SETTLE_SECONDS="0")
    done = cli("reconcile", "--json", env=env)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert set(out) >= {"since", "until", "buckets_checked", "pending", "mismatches", "errors"}
    assert [(m["meter"], m["local_units"], m["stripe_units"], m["difference"])
            for m in out["mismatches"]] == [("seats", 2, 0, -2)]
    assert out["errors"] == [] and out["run_id"] > 0
    fake.set_outage(True)
    failed = cli("reconcile", "--json", "--tenant", "acme", env=env)
    fake.set_outage(False)
    assert failed.returncode == 1 and len(failed.stderr.strip().splitlines()) == 1
    assert json.loads(failed.stdout)["errors"]


# -- cancel -----------------------------------------------------------------------------------

def test_cancel_within_24h_takes_the_units_off_at_stripe(engine: Engine, fake: FakeStripe,
                                                         settings: Any) -> None:
    operations.set_tenant(engine, "acme", stripe_customer_id="cus_acme", name=None,
                          now=utcnow())
    [keep, drop] = send(engine, settings, [("acme", "api_requests", 5, day_start(1)),
                                           ("acme", "api_requests", 7, day_start(1))])
    gateway = gateway_from(settings)
    assert gateway is not None
    meter_id = fake.meter_id("api_requests")
    before = gateway.meter_event_summaries(meter_id, "cus_acme", start=day_start(1),
                                           end=day_start(0), grouping="day")
    assert [s.value for s in before] == [12.0]
    out = cancel_events(engine, gateway, [drop], actor="ops@example.com",
                        reason="duplicate", note="double-recorded by the app", now=utcnow())
    assert (out.cancelled, out.refused) == ([drop], [])
    with engine.connect() as conn:
        r = conn.execute(select(T).where(T.c.id == drop)).one()
        audit = conn.execute(select(AuditEntry.__table__)).all()
    assert (r.status, r.cancel_reason, r.cancelled_by) == ("cancelled", "duplicate",
                                                           "ops@example.com")
    # Stripe's answer is kept: pending, and (no id in v1's answer) the call's request id.
    [answered] = fake.adjustments()
    assert (r.cancel_adjustment_status, r.cancel_adjustment_id) == ("pending",
                                                                    answered["request_id"])
    assert out.adjustments[drop].words() == f"adjustment pending, id {answered['request_id']}"
    [entry] = [a for a in audit if a.action == "cancel"]
    assert entry.event_ids == str(drop)
    assert entry.note == ("double-recorded by the app\nStripe answered: event "
                          f"{drop}: adjustment pending, id {answered['request_id']}")
    after = gateway.meter_event_summaries(meter_id, "cus_acme", start=day_start(1),
                                          end=day_start(0), grouping="day")
    assert [s.value for s in after] == [5.0]
    assert fake.accepted()[r.idempotency_key].cancelled


def test_cancel_after_24h_is_refused_and_changes_nothing(engine: Engine, fake: FakeStripe,
                                                         settings: Any, db_url: str) -> None:
    operations.set_tenant(engine, "acme", stripe_customer_id="cus_acme", name=None,
                          now=utcnow())
    [eid] = send(engine, settings, [("acme", "api_requests", 5, day_start(1))])
    with engine.begin() as conn:
        conn.execute(update(T).where(T.c.id == eid).values(sent_at=utcnow() - 25 * 3600 *
                                                           timedelta(seconds=1)))
    calls = fake.calls()
    refused = cli("cancel", str(eid), "--reason", "other", "--note", "too late",
                  env=worker_env(db_url, fake.base_url))
    assert refused.returncode == 1
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "24 hours" in lines[0]
    with engine.connect() as conn:
        assert conn.execute(select(T.c.status).where(T.c.id == eid)).scalar() == "sent"
    assert fake.calls() == calls and not fake.accepted()["acme:api_requests:0"].cancelled


def test_the_cancel_command_cancels_and_stripes_refusal_is_reported(
        engine: Engine, fake: FakeStripe, settings: Any, db_url: str) -> None:
    operations.set_tenant(engine, "acme", stripe_customer_id="cus_acme", name=None,
                          now=utcnow())
    [a, b] = send(engine, settings, [("acme", "api_requests", 5, day_start(1)),
                                     ("acme", "api_requests", 6, day_start(1))])
    # Stripe no longer knows the second (its 24 hours passed on Stripe's clock).
    fake.accepted()["acme:api_requests:1"].received_at -= 2 * 86400
    done = cli("cancel", str(a), str(b), "--reason", "written_off", "--note", "goodwill",
               env=worker_env(db_url, fake.base_url))
    assert done.returncode == 1
    assert "cancelled 1 event(s)" in done.stdout
    assert f"{b}: Stripe did not cancel it" in done.stderr
    with engine.connect() as conn:
        rows = {r.id: r for r in conn.execute(select(T))}
    assert {i: r.status for i, r in rows.items()} == {a: "cancelled", b: "sent"}
    assert (rows[b].cancel_adjustment_status, rows[b].cancel_adjustment_id) == (None, None)


@pytest.mark.parametrize("with_id", [False, True], ids=["request-id", "adjustment-id"])
def test_the_cancel_command_keeps_and_prints_stripes_answer_for_each_event(
        engine: Engine, fake: FakeStripe, settings: Any, db_url: str, with_id: bool) -> None:
    """Each event keeps the status Stripe answered and what support quotes to Stripe: the
    adjustment's id when the answer has one, else the request id of its own call. The
    command prints them, and says what a cancel does and does not do."""
    operations.set_tenant(engine, "acme", stripe_customer_id="cus_acme", name=None,
                          now=utcnow())
    [a, b] = send(engine, settings, [("acme", "api_requests", 5, day_start(1)),
                                     ("acme", "api_requests", 6, day_start(1))])
    if with_id:
        fake.answer_adjustments(status="complete", ids=True)
    done = cli("cancel", str(a), str(b), "--reason", "duplicate", "--note", "twice",
               env=worker_env(db_url, fake.base_url))
    assert done.returncode == 0, done.stderr
    answered = {x["identifier"]: x for x in fake.adjustments()}
    expected = {}
    for n, event_id in enumerate((a, b)):
        answer = answered[f"acme:api_requests:{n}"]
        expected[event_id] = ("complete", answer["id"]) if with_id else (
            "pending", answer["request_id"])
    assert len({ref for _, ref in expected.values()}) == 2         # each event its own
    with engine.connect() as conn:
        kept = {r.id: (r.cancel_adjustment_status, r.cancel_adjustment_id)
                for r in conn.execute(select(T))}
        [note] = conn.execute(select(AuditEntry.__table__.c.note)
                              .where(AuditEntry.__table__.c.action == "cancel")).scalars()
    assert kept == expected
    lines = done.stdout.splitlines()
    assert lines[:3] == ["cancelled 2 event(s)",
                         f"  {a}: adjustment {expected[a][0]}, id {expected[a][1]}",
                         f"  {b}: adjustment {expected[b][0]}, id {expected[b][1]}"]
    assert CANCEL_WORDS.finalized_invoice in done.stdout
    assert CANCEL_WORDS.off_the_meter in done.stdout
    assert note == (f"twice\nStripe answered: event {a}: adjustment {expected[a][0]}, id "
                    f"{expected[a][1]}; event {b}: adjustment {expected[b][0]}, id "
                    f"{expected[b][1]}")


def _meter_days_from_days(engine: Engine) -> tuple[list[Any], list[Any]]:
    with engine.connect() as conn:
        kept = conn.execute(text(
            "SELECT meter, day, ours, stripe, customer_days FROM reconciled_meter_days "
            "ORDER BY meter, day")).all()
        summed = conn.execute(text(
            "SELECT meter, day, sum(ours), sum(stripe), count(*) FROM reconciled_days "
            "GROUP BY meter, day ORDER BY meter, day")).all()
    return [tuple(r) for r in kept], [tuple(r) for r in summed]


def test_each_meters_days_are_kept_added_up_as_runs_replace_them(
        engine: Engine, fake: FakeStripe, settings: Any, history: list[int]) -> None:
    """The per-meter figures under the usage table read ``reconciled_meter_days``: every
    customer's compared day of a meter, added up in the run's transaction, replaced as a
    later run replaces the days."""
    from webapp.read.compared import compared_for, meter_totals

    gateway = gateway_from(settings)
    assert gateway is not None
    reconcile(engine, gateway, settings, trigger="cli", now=later())
    kept, summed = _meter_days_from_days(engine)
    assert kept == summed and len(kept) == 9  # 3 meters x 3 days
    fake.add_usage("cus_acme", "api_requests", int(day_start(2).timestamp()) + 60, 40)
    reconcile(engine, gateway, settings, trigger="cli", now=later())
    kept, summed = _meter_days_from_days(engine)
    assert kept == summed
    assert dict(((m, d), s) for m, d, _o, s, _n in kept)[
        ("api_requests", day_start(2).date().isoformat())] == 7 + 7 + 40
    start, end = day_start(3).date(), day_start(1).date()
    with engine.connect() as conn:
        c = compared_for(conn, start, end)
        expected = {str(m): (float(s), int(o), int(d)) for m, s, o, d in conn.execute(
            select(c.c.meter, func.sum(c.c.stripe_units), func.sum(c.c.compared_units),
                   func.sum(c.c.compared_days)).group_by(c.c.meter))}
        assert meter_totals(conn, start, end) == expected
    # acme 4 + 7 + 10, globex 7 a day; Stripe holds 40 more of acme on the second day.
    assert expected["api_requests"] == (21.0 + 21 + 40, 21 + 21, 6)


def test_a_runs_times_come_from_the_clock_it_is_given(
        engine: Engine, fake: FakeStripe, settings: Any, history: list[int]) -> None:
    gateway = gateway_from(settings)
    assert gateway is not None
    t0 = later()
    times = iter([t0, t0 + timedelta(seconds=5)])
    run = reconcile(engine, gateway, settings, trigger="cli", clock=lambda: next(times))
    start, end = run.started_at, run.finished_at
    assert end is not None and (end - start) == timedelta(seconds=5)
    assert start > utcnow() + timedelta(hours=1)  # the clock's, not the wall's
    assert run.comparison.checked == 12 and run.comparison.pending == 0
