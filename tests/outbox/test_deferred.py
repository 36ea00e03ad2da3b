"""Events of tenants without a Stripe customer are put off once they have been due for a
while, so the claim and the status line's sample stop walking past them; mapping the tenant
(one at a time, by import, or by hand in the database and then the deferrer) makes them due at
once."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import Engine, insert, select

from webapp.db import reading
from webapp.models import OutboxEvent, Tenant
from webapp.outbox.claims import claim_batch
from webapp.outbox.customers import CustomerVerdicts
from webapp.outbox.deferred import DEFER_AFTER, DEFER_FOR, defer_unsendable, waits_for
from webapp.outbox.meters import MeterInfo, active_meters, known_meters, store_meters
from webapp.outbox.operations import set_tenant
from webapp.outbox.stripe_runs import METERS, record_run
from webapp.outbox.tenant_import import import_mappings, read_file
from webapp.read.health import SAMPLE, health
from webapp.worker.deferrer import Deferrer

T = OutboxEvent.__table__


def due_at(engine: Engine, ids: list[int]) -> dict[int, Any]:
    with engine.connect() as conn:
        return {i: at for i, at in conn.execute(
            select(T.c.id, T.c.next_attempt_at).where(T.c.id.in_(ids)))}


def test_unmapped_events_are_put_off_and_mapping_makes_them_due(engine: Engine, seed: Any,
                                                                now: Any) -> None:
    seed.tenant("acme", "cus_acme")
    seed.tenant("ghost", None)
    long_ago, lately = now - DEFER_AFTER - timedelta(minutes=1), now - timedelta(minutes=1)
    ghost_old = seed.event(tenant_id="ghost", next_attempt_at=long_ago, now=long_ago)
    ghost_new = seed.event(tenant_id="ghost", next_attempt_at=lately, now=lately)
    nobody_old = seed.event(tenant_id="nobody", next_attempt_at=long_ago, now=long_ago)
    acme_old = seed.event(tenant_id="acme", next_attempt_at=long_ago, now=long_ago)
    ghost_dead = seed.event(tenant_id="ghost", status="dead", now=long_ago)

    assert defer_unsendable(engine, now=now) == 2
    later = now + DEFER_FOR
    at = due_at(engine, [ghost_old, ghost_new, nobody_old, acme_old, ghost_dead])
    assert at[ghost_old] == later and at[nobody_old] == later
    assert at[ghost_new] == lately and at[acme_old] == long_ago
    assert at[ghost_dead] == long_ago
    assert defer_unsendable(engine, now=now) == 0, "put off once, not again and again"

    set_tenant(engine, "ghost", stripe_customer_id="cus_ghost", name=None, now=now)
    at = due_at(engine, [ghost_old, nobody_old])
    assert at[ghost_old] == now and at[nobody_old] == later
    claim = claim_batch(engine, worker="w:1:a", limit=10, now=now, claim_timeout_seconds=30)
    assert sorted(e.id for e in claim.events) == sorted([ghost_old, ghost_new, acme_old])

    rows, out = read_file(["tenant_id,stripe_customer_id,name", "nobody,cus_nobody,"])
    import_mappings(engine, rows, out, customers=CustomerVerdicts.unchecked(), now=now,
                    actor="test", source="test.csv")
    assert due_at(engine, [nobody_old])[nobody_old] == now


def test_the_parker_wakes_events_of_a_tenant_mapped_by_hand(engine: Engine, seed: Any,
                                                            now: Any) -> None:
    long_ago = now - DEFER_AFTER - timedelta(minutes=1)
    event = seed.event(tenant_id="late", next_attempt_at=long_ago, now=long_ago)
    assert Deferrer(engine, clock=lambda: now).run_once() == 1
    assert due_at(engine, [event])[event] == now + DEFER_FOR
    # Due again when that time comes, and put off again at the deferrer's next turn (not
    # after another DEFER_AFTER of claims walking past it).
    again = now + DEFER_FOR
    assert Deferrer(engine, clock=lambda: again).run_once() == 1
    assert due_at(engine, [event])[event] == again + DEFER_FOR
    seed.tenant("late", "cus_late")  # straight into the table, past set_tenant
    later = now + timedelta(minutes=1)
    assert Deferrer(engine, clock=lambda: later).run_once() == 0
    assert due_at(engine, [event])[event] == later


def test_the_status_line_sees_a_stall_behind_many_unmapped_events(engine: Engine, seed: Any,
                                                                  now: Any) -> None:
    """More unmapped due events than the status line samples, older than a sendable one that
    nobody sends: the stall shows, before they are put off (the line looks past its sample)
    and after."""
    seed.tenant("acme", "cus_acme")
    long_ago = now - timedelta(hours=2)
    rows = [dict(tenant_id="ghost", meter="api_requests", quantity=1,
                 idempotency_key=f"ghost-{i}", occurred_at=long_ago, status="pending",
                 attempt_count=0, call_count=0, next_attempt_at=long_ago, key_generation=0,
                 created_at=long_ago, updated_at=long_ago) for i in range(SAMPLE + 1)]
    with engine.begin() as conn:
        conn.execute(insert(T), rows)
        conn.execute(insert(Tenant.__table__).values(
            tenant_id="ghost", stripe_customer_id=None, created_at=now, updated_at=now))
    sendable = now - timedelta(minutes=30)
    seed.event(tenant_id="acme", next_attempt_at=sendable, now=sendable)
    with reading(engine) as conn:
        before = health(conn, now=now, api_key_here=True)
    assert before.state == "stalled" and before.due == 1, before
    assert Deferrer(engine, clock=lambda: now).run_once() == SAMPLE + 1
    with reading(engine) as conn:
        after = health(conn, now=now, api_key_here=True)
    assert after.state == "stalled" and after.due == 1, after


def listed(engine: Engine, now: Any, *active: str, ok: bool = True) -> None:
    """A listing of Stripe's meters that shows ``active`` active (and how it went)."""
    store_meters(engine, [MeterInfo(m, f"mtr_{m}", "active") for m in active], now=now)
    record_run(engine, METERS, ok=ok, detail=None, now=now)


def test_events_of_a_missing_meter_are_put_off_until_a_listing_shows_it(
        engine: Engine, seed: Any, now: Any) -> None:
    seed.tenant("acme", "cus_acme")
    long_ago = now - DEFER_AFTER - timedelta(minutes=1)
    missing = seed.event(tenant_id="acme", meter="storage_gb", next_attempt_at=long_ago,
                         now=long_ago)
    sendable = seed.event(tenant_id="acme", meter="api_requests", next_attempt_at=long_ago,
                          now=long_ago)
    listed(engine, now, "api_requests")
    assert defer_unsendable(engine, now=now) == 1
    at = due_at(engine, [missing, sendable])
    assert at[missing] == now + DEFER_FOR and at[sendable] == long_ago
    # No longer due, it still waits for the meter, and the status line still says so.
    with reading(engine) as conn:
        line = health(conn, now=now, api_key_here=True)
    assert (line.state, line.meter) == ("stalled", "storage_gb"), line  # the other one waits
    assert "Also, 1 event waits for the meter “storage_gb”" in line.detail
    # The deferrer's waking pass leaves it put off: its tenant is mapped, its meter still missing.
    later = now + timedelta(minutes=1)
    assert Deferrer(engine, clock=lambda: later).run_once() == 0
    assert due_at(engine, [missing])[missing] == now + DEFER_FOR
    # A listing that shows the meter makes it due in the listing's own transaction.
    store_meters(engine, [MeterInfo("api_requests", "mtr_a", "active"),
                          MeterInfo("storage_gb", "mtr_s", "active")], now=later)
    assert due_at(engine, [missing])[missing] == later
    claim = claim_batch(engine, worker="w:1:a", limit=10, now=later, claim_timeout_seconds=30)
    assert sorted(e.id for e in claim.events) == sorted([missing, sendable])


def test_no_meter_is_put_off_unless_the_last_listing_succeeded(engine: Engine, seed: Any,
                                                               now: Any) -> None:
    """A drainer that never listed the meters sends every event; one whose listing fails
    holds them all (Holding): putting them off would only delay them when it recovers."""
    seed.tenant("acme", "cus_acme")
    long_ago = now - DEFER_AFTER - timedelta(minutes=1)
    event = seed.event(tenant_id="acme", meter="storage_gb", next_attempt_at=long_ago,
                       now=long_ago)
    assert defer_unsendable(engine, now=now) == 0
    listed(engine, now, "api_requests", ok=False)
    assert defer_unsendable(engine, now=now) == 0
    assert due_at(engine, [event])[event] == long_ago
    record_run(engine, METERS, ok=True, detail=None, now=now)
    assert defer_unsendable(engine, now=now) == 1
    # The listing fails again: the waking pass makes it due (the drainer decides).
    record_run(engine, METERS, ok=False, detail="down", now=now)
    assert Deferrer(engine, clock=lambda: now).run_once() == 0
    assert due_at(engine, [event])[event] == now


# -- pre-aggregated meters --------------------------------------------------------------------

#: A meter per case, as Stripe lists it: (status, event_time_window).
METER_CASES = {"plain": ("active", None), "off": ("inactive", None),
               "by_day": ("active", "day"), "by_hour": ("active", "hour"),
               "off_by_day": ("inactive", "day")}


def test_sql_and_python_pick_the_same_meters_to_send_to(engine: Engine, seed: Any,
                                                        now: Any) -> None:
    """Whether an event's meter may be sent to is asked in SQL (the deferrer, an event's page,
    a listing's wake-up) and in Python (the drainer's meters, the status line): both say yes
    for the ordinary active meter only — not for an inactive one, a missing one, or an active
    or inactive one with a time window."""
    seed.tenant("acme", "cus_acme")
    long_ago = now - DEFER_AFTER - timedelta(minutes=1)
    store_meters(engine, [MeterInfo("gone", "mtr_gone", "active")], now=long_ago)
    listing = [MeterInfo(name, f"mtr_{name}", status, event_time_window=window)
               for name, (status, window) in METER_CASES.items()]
    assert [m.active for m in listing] == [True, False, False, False, False]
    store_meters(engine, listing, now=now)        # "gone" is no longer listed: missing
    record_run(engine, METERS, ok=True, detail=None, now=now)
    events = {name: seed.event(tenant_id="acme", meter=name, next_attempt_at=long_ago,
                               now=long_ago)
              for name in [*METER_CASES, "gone", "never_listed"]}
    with reading(engine) as conn:
        python = set(active_meters(conn))
        kept = {name: (m.status, m.event_time_window) for name, m in known_meters(conn).items()}
        waits = {name: waits_for(conn, {"id": i, "status": "pending"})
                 for name, i in events.items()}
    assert kept == {"plain": ("active", None), "off": ("inactive", None),
                    "by_day": ("pre_aggregated", "day"), "by_hour": ("pre_aggregated", "hour"),
                    "off_by_day": ("inactive", "day"), "gone": ("missing", None)}
    assert python == {"plain"}
    assert {name for name, w in waits.items() if w is None} == python
    assert defer_unsendable(engine, now=now) == len(events) - 1
    at = due_at(engine, list(events.values()))
    sql = {name for name, i in events.items() if at[i] <= now}
    assert sql == python
    claim = claim_batch(engine, worker="w:1:a", limit=10, now=now, claim_timeout_seconds=30,
                        meters=sorted(python))
    assert [e.meter for e in claim.events] == ["plain"]


def test_a_pre_aggregated_meters_events_wait_until_a_listing_shows_it_ordinary(
        engine: Engine, seed: Any, now: Any) -> None:
    """Put off like a missing meter's, and due again in the listing that shows the event
    name's meter without a time window (at Stripe a new meter: a meter's window cannot be
    changed)."""
    seed.tenant("acme", "cus_acme")
    long_ago = now - DEFER_AFTER - timedelta(minutes=1)
    event = seed.event(tenant_id="acme", meter="seats", next_attempt_at=long_ago, now=long_ago)
    store_meters(engine, [MeterInfo("seats", "mtr_1", "active", event_time_window="day")],
                 now=now)
    record_run(engine, METERS, ok=True, detail=None, now=now)
    assert Deferrer(engine, clock=lambda: now).run_once() == 1
    assert due_at(engine, [event])[event] == now + DEFER_FOR
    later = now + timedelta(minutes=1)
    stored = store_meters(engine, [MeterInfo("seats", "mtr_1", "inactive",
                                             event_time_window="day"),
                                   MeterInfo("seats", "mtr_2", "active")], now=later)
    assert (stored.active, stored.pre_aggregated) == (1, 0)
    assert due_at(engine, [event])[event] == later
    with reading(engine) as conn:
        assert known_meters(conn)["seats"] == MeterInfo("seats", "mtr_2", "active")


def test_of_two_active_meters_of_one_name_a_pre_aggregated_one_is_kept(
        engine: Engine, now: Any) -> None:
    """Active before inactive, as for any meter; and should Stripe list two active meters
    of one event name, the events wait rather than risk a meter that keeps one value per
    window. Its window is Stripe's text, cut to the column like the other shown fields."""
    window = "fortnight" * 5
    for listing in ([MeterInfo("a", "mtr_1", "inactive"),
                     MeterInfo("a", "mtr_2", "active", event_time_window=window),
                     MeterInfo("a", "mtr_3", "active")],
                    [MeterInfo("a", "mtr_3", "active"),
                     MeterInfo("a", "mtr_2", "active", event_time_window=window),
                     MeterInfo("a", "mtr_1", "inactive")]):
        stored = store_meters(engine, listing, now=now)
        assert (stored.active, stored.pre_aggregated) == (0, 1)
        with reading(engine) as conn:
            m = known_meters(conn)["a"]
        assert (m.meter_id, m.status, m.event_time_window) == ("mtr_2", "pre_aggregated",
                                                               window[:20])
        assert not m.active and m.pre_aggregated
