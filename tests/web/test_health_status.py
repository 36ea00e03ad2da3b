"""Issue 14, truthful health: the status line on every page, ``stats --json``'s ``health``
and ``/health`` say what is really happening (Sending, Idle, Paused, Holding, Stalled, No API
key, Meter missing), read from the outbox and the drainers' heartbeats; green only when
events are actually going out.

The outage test drives a real drainer (the real SDK against the fake, connections refused)
until its circuit breaker opens, and reads the page a person would."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from conftest import TEST_API_KEY, cli, make_settings, wait_for, worker_env
from flask import Flask
from sqlalchemy import Engine, insert, select, update
from support.fake_stripe import FakeStripe

from webapp import create_app
from webapp.models import DrainerHeartbeat, OutboxEvent, StripeMeter, SyncState, utcnow
from webapp.outbox import operations
from webapp.read.health import SAMPLE, Health, health
from webapp.worker import Drainer, gateway_from

H = DrainerHeartbeat.__table__


def read(engine: Engine, *, key: bool = True, now: Any = None) -> Health:
    with engine.connect() as conn:
        return health(conn, now=now or utcnow(), api_key_here=key)


def beat(engine: Engine, name: str = "host:1:ab", *, seen_ago: float = 1, **kw: Any) -> None:
    now = utcnow()
    row = dict(name=name, kind="worker", started_at=now, seen_at=now - timedelta(
        seconds=seen_ago), can_send=True, breaker="closed", sent_total=0)
    row.update(kw)
    with engine.begin() as conn:
        conn.execute(insert(H).values(**row))


def meters_read(engine: Engine, active: list[str], inactive: list[str]) -> None:
    now = utcnow()
    with engine.begin() as conn:
        conn.execute(insert(SyncState.__table__).values(name="meters", ran_at=now, ok=True))
        for name, status in [(m, "active") for m in active] + [(m, "inactive")
                                                                for m in inactive]:
            conn.execute(insert(StripeMeter.__table__).values(
                event_name=name, meter_id=f"mtr_{name}", status=status, customer_key="c",
                value_key="v", formula="sum", updated_at=now))


def test_nothing_at_all_is_idle(engine: Engine) -> None:
    h = read(engine)
    assert (h.state, h.level, h.title) == ("idle", "info", "Idle")
    assert h.detail == "Nothing is due to be sent."


def test_no_key_here_and_no_drainer_with_one(engine: Engine, seed: Any) -> None:
    seed.event()
    h = read(engine, key=False)
    assert h.state == "no_api_key" and "STRIPE_API_KEY is not set" in h.detail
    beat(engine, can_send=True)  # a worker elsewhere has the key: not this state
    assert read(engine, key=False).state != "no_api_key"


def test_paused_names_who_and_why(engine: Engine, seed: Any) -> None:
    seed.tenant("acme", "cus_acme")
    seed.events(2)
    now = utcnow()
    operations.pause(engine, actor="ops@example.com", reason="Stripe incident 42", now=now)
    h = read(engine)
    assert h.state == "paused" and h.level == "critical"
    assert "Stripe incident 42" in h.detail and "ops@example.com" in h.detail
    assert h.paused_by == "ops@example.com" and h.since is not None


def test_an_open_breaker_is_holding_until_its_row_ages_out(engine: Engine, seed: Any) -> None:
    seed.tenant("acme", "cus_acme")
    seed.events(3)
    now = utcnow()
    beat(engine, breaker="open", holding_since=now - timedelta(minutes=4),
         next_probe_at=now + timedelta(seconds=30), last_failure="calls to Stripe timed out")
    h = read(engine, now=now)
    assert h.state == "holding" and h.level == "critical"
    assert "Stripe is failing: calls to Stripe timed out." in h.detail
    assert "3 events due" in h.detail
    assert h.since is not None and abs((now - h.since).total_seconds() - 240) < 2
    assert h.next_probe_at is not None and h.next_probe_at > now
    with engine.begin() as conn:  # the process is gone: its heartbeat stops
        conn.execute(update(H).values(seen_at=now - timedelta(minutes=2)))
    assert read(engine, now=now).state != "holding"


def test_due_events_and_nothing_sent_for_minutes_is_stalled(engine: Engine, seed: Any) -> None:
    seed.tenant("acme", "cus_acme")
    now = utcnow()
    seed.events(2, next_attempt_at=now - timedelta(minutes=9))
    seed.event(status="sent", sent_at=now - timedelta(minutes=30))
    h = read(engine, now=now)
    assert h.state == "stalled" and "no drainer is running" in h.detail
    assert "2 events due and nothing sent for 30 min" in h.detail
    beat(engine)
    assert "the running drainers are not sending them" in read(engine, now=now).detail


def test_recent_due_events_are_not_yet_stalled_nor_green(engine: Engine, seed: Any) -> None:
    seed.tenant("acme", "cus_acme")
    now = utcnow()
    seed.events(2, next_attempt_at=now - timedelta(minutes=1))
    h = read(engine, now=now)
    assert (h.state, h.level) == ("idle", "info") and "2 events due recently" in h.detail


def test_an_event_sent_recently_is_the_only_green(engine: Engine, seed: Any) -> None:
    seed.tenant("acme", "cus_acme")
    now = utcnow()
    seed.events(2, next_attempt_at=now - timedelta(minutes=9))
    seed.event(status="sent", sent_at=now - timedelta(seconds=20))
    h = read(engine, now=now)
    assert (h.state, h.level, h.title) == ("sending", "ok", "Sending")
    assert h.last_sent_at is not None


def test_unmapped_tenants_events_do_not_stall_sending(engine: Engine, seed: Any) -> None:
    now = utcnow()
    seed.events(3, tenant_id="nobody", next_attempt_at=now - timedelta(hours=1))
    assert read(engine, now=now).state == "idle"


def test_idle_says_how_many_events_wait_for_a_customer(engine: Engine, seed: Any) -> None:
    """Events of a tenant without a Stripe customer are not "due" for any drainer, but the
    line does not say "nothing is due" while they wait: it counts them, due or put off by
    the deferrer, until the tenant is mapped."""
    from webapp.outbox.deferred import defer_unsendable

    now = utcnow()
    seed.event(tenant_id="nobody", created_at=now - timedelta(hours=1),
               next_attempt_at=now - timedelta(hours=1))
    h = read(engine, now=now)
    assert (h.state, h.level) == ("idle", "info")
    assert h.detail == ("Nothing can be sent now: 1 event waits for a Stripe customer (their "
                        "tenant is not mapped yet).")
    seed.events(2, tenant_id="nobody", created_at=now - timedelta(hours=1),
                next_attempt_at=now - timedelta(hours=1))
    assert "3 events wait for a Stripe customer" in read(engine, now=now).detail
    # Put off by the deferrer, they are no longer due; the line still counts them.
    assert defer_unsendable(engine, now=now) == 3
    with engine.connect() as conn:
        assert conn.execute(select(OutboxEvent.__table__.c.id).where(
            OutboxEvent.__table__.c.next_attempt_at <= now)).first() is None
    assert "3 events wait for a Stripe customer" in read(engine, now=now).detail
    # Mapped, they are due at once and the line says so instead.
    operations.set_tenant(engine, "nobody", stripe_customer_id="cus_nobody", name=None,
                          now=now)
    h = read(engine, now=now + timedelta(seconds=1))
    assert h.state == "idle" and "3 events due recently" in h.detail
    assert "customer" not in h.detail


def test_events_of_a_meter_stripe_lacks_are_meter_missing(engine: Engine, seed: Any) -> None:
    seed.tenant("acme", "cus_acme")
    now = utcnow()
    meters_read(engine, active=["api_requests"], inactive=["storage_gb"])
    seed.events(2, meter="storage_gb", next_attempt_at=now - timedelta(minutes=20))
    seed.events(1, meter="gpu_hours", next_attempt_at=now - timedelta(minutes=20))
    h = read(engine, now=now)
    assert h.state == "meter_missing" and h.meter == "storage_gb"
    assert "2 events wait for the meter “storage_gb”" in h.detail
    assert "1 other meter" in h.detail


def test_events_of_a_pre_aggregated_meter_say_why_they_wait(engine: Engine, seed: Any) -> None:
    """The meter exists and is active, but keeps one value per day: the line says so and
    why its events wait, due or put off, and names the other meters too."""
    from webapp.outbox.meters import MeterInfo, store_meters

    seed.tenant("acme", "cus_acme")
    now = utcnow()
    meters_read(engine, active=["api_requests"], inactive=["storage_gb"])
    store_meters(engine, [MeterInfo("api_requests", "mtr_1", "active"),
                          MeterInfo("storage_gb", "mtr_2", "inactive"),
                          MeterInfo("seats", "mtr_3", "active", event_time_window="day")],
                 now=now)
    seed.events(3, meter="seats", next_attempt_at=now + timedelta(minutes=9),
                now=now - timedelta(minutes=20))
    h = read(engine, now=now)
    assert (h.state, h.meter) == ("meter_missing", "seats"), h
    assert h.detail == (
        "3 events wait for the meter “seats”, which is pre-aggregated (one value per day): "
        "Stripe would keep only the last event of each day, so its events are not sent. "
        "They go out once Stripe has a meter without a time window for their event name "
        "(a meter's window cannot be changed: it takes a new meter).")
    seed.events(1, meter="storage_gb", next_attempt_at=now - timedelta(minutes=1))
    seed.events(4, meter="seats", next_attempt_at=now - timedelta(minutes=1))
    h = read(engine, now=now)
    assert h.meter == "seats" and h.detail.startswith("4 events wait for the meter “seats”, "
                                                      "which is pre-aggregated (one value per")
    assert h.detail.endswith("it takes a new meter). Events of 1 other meter(s) wait too.")
    # A missing meter is still said to be missing.
    seed.events(5, meter="storage_gb", next_attempt_at=now - timedelta(minutes=1))
    assert "“storage_gb”, which Stripe does not have (active)" in read(engine, now=now).detail


def test_events_put_off_for_a_missing_meter_still_show_it(engine: Engine, seed: Any) -> None:
    """The deferrer takes them out of the due events; the line still names their meter."""
    seed.tenant("acme", "cus_acme")
    now = utcnow()
    meters_read(engine, active=["api_requests"], inactive=["storage_gb"])
    seed.events(2, meter="storage_gb", next_attempt_at=now + timedelta(minutes=9),
                now=now - timedelta(minutes=20))
    h = read(engine, now=now)
    assert (h.state, h.meter, h.due) == ("meter_missing", "storage_gb", 0), h
    assert h.detail.startswith("2 events wait for the meter “storage_gb”")


def test_events_put_off_for_a_meter_show_behind_many_retries(engine: Engine,
                                                             seed: Any) -> None:
    """More retries due in the next minutes than the line samples (an outage's backlog),
    ahead of the events put off for a missing meter: the line still names the meter."""
    seed.tenant("acme", "cus_acme")
    now = utcnow()
    meters_read(engine, active=["api_requests"], inactive=["storage_gb"])
    with engine.begin() as conn:
        conn.execute(insert(OutboxEvent.__table__), [dict(
            tenant_id="acme", meter="api_requests", quantity=1, idempotency_key=f"retry-{i}",
            occurred_at=now, status="retrying", attempt_count=1, call_count=1,
            stripe_customer_id="cus_acme", next_attempt_at=now + timedelta(seconds=1 + i / 10),
            key_generation=0, created_at=now, updated_at=now) for i in range(SAMPLE + 1)])
    seed.events(2, meter="storage_gb", next_attempt_at=now + timedelta(minutes=9),
                now=now - timedelta(minutes=20))
    h = read(engine, now=now)
    assert (h.state, h.meter) == ("meter_missing", "storage_gb"), h
    assert h.detail.startswith("2 events wait for the meter “storage_gb”")


def test_a_stall_wins_over_a_missing_meter_and_names_it(engine: Engine, seed: Any) -> None:
    """A missing meter is a warning; events that could go out and do not are critical: the
    line says Stalled, and the meter too."""
    seed.tenant("acme", "cus_acme")
    now = utcnow()
    meters_read(engine, active=["api_requests"], inactive=["storage_gb"])
    seed.events(2, meter="storage_gb", next_attempt_at=now - timedelta(minutes=20))
    seed.events(1, meter="api_requests", next_attempt_at=now - timedelta(minutes=9))
    seed.event(status="sent", sent_at=now - timedelta(minutes=30))
    h = read(engine, now=now)
    assert (h.state, h.level) == ("stalled", "critical"), h
    assert h.due == 1 and h.meter == "storage_gb"
    assert "1 event due and nothing sent for 30 min: no drainer is running." in h.detail
    assert "Also, 2 events wait for the meter “storage_gb”" in h.detail


def test_a_stall_behind_more_held_events_than_the_sample_shows(engine: Engine,
                                                                seed: Any) -> None:
    """More due events of a missing meter than the line samples, all older than a sendable
    event nobody sends: the line still sees the sendable one and says Stalled."""
    seed.tenant("acme", "cus_acme")
    now = utcnow()
    meters_read(engine, active=["api_requests"], inactive=["storage_gb"])
    long_ago = now - timedelta(hours=2)
    with engine.begin() as conn:
        conn.execute(insert(OutboxEvent.__table__), [dict(
            tenant_id="acme", meter="storage_gb", quantity=1, idempotency_key=f"held-{i}",
            occurred_at=long_ago, status="pending", attempt_count=0, call_count=0,
            next_attempt_at=long_ago, key_generation=0, created_at=long_ago,
            updated_at=long_ago) for i in range(SAMPLE)])
    h = read(engine, now=now)
    assert h.state == "meter_missing" and h.due == 0 and h.due_more  # nothing sendable behind
    seed.events(1, meter="api_requests", next_attempt_at=now - timedelta(minutes=30))
    h = read(engine, now=now)
    assert (h.state, h.due, h.due_more) == ("stalled", 1, True), h
    assert h.detail.startswith("Events due and nothing sent for 30 min")
    assert "Also, more than 1,000 events wait for the meter “storage_gb”" in h.detail


def test_the_status_line_is_on_every_page_and_health_is_json(
        client_as: Any, engine: Engine, seed: Any, app: Flask) -> None:
    seed.tenant("acme", "cus_acme")
    now = utcnow()
    seed.events(2, next_attempt_at=now - timedelta(minutes=9))
    viewer = client_as("viewer")
    for path in ("/", "/retries", "/tenants", "/audit"):
        html = viewer.get(path).get_data(as_text=True)
        assert 'class="status-line status-critical"' in html and "Stalled" in html, path
    anonymous = app.test_client()
    assert "status-line" not in anonymous.get("/login").get_data(as_text=True)
    body = anonymous.get("/health").get_json()
    assert body["state"] == "stalled" and body["title"] == "Stalled"
    assert body["due"] == 2 and body["detail"] == "Stalled"  # no detail without the token


def test_health_needs_the_metrics_token_when_one_is_set(db_url: str, engine: Engine) -> None:
    token = "m" * 20 + "etrics-token-for-health"
    app = create_app({"TESTING": True}, settings=make_settings(db_url, metrics_token=token),
                     engine=engine, start_drainer=False)
    client = app.test_client()
    assert client.get("/health").status_code == 401
    assert client.get("/health", headers={"Authorization": "Bearer wrong"}).status_code == 401
    ok = client.get("/health", headers={"Authorization": f"Bearer {token}"})
    assert ok.status_code == 200 and ok.get_json()["detail"] == "Nothing is due to be sent."


def test_stats_json_carries_the_same_state(db_url: str, engine: Engine, seed: Any) -> None:
    seed.tenant("acme", "cus_acme")
    operations.pause(engine, actor="ops@example.com", reason="month end", now=utcnow())
    out = cli("stats", "--json", env=worker_env(db_url))
    assert out.returncode == 0, out.stderr
    state = json.loads(out.stdout)["health"]
    assert state["state"] == "paused" and "month end" in state["detail"]
    no_key = {k: v for k, v in worker_env(db_url).items() if k != "STRIPE_API_KEY"}
    out = cli("stats", "--json", env=no_key)
    assert json.loads(out.stdout)["health"]["state"] == "no_api_key"


def test_stats_says_what_the_status_line_says(db_url: str, engine: Engine, seed: Any) -> None:
    """``stats`` in words: the state of sending is the line's (Holding during an outage, not
    "running" because nobody paused), and the pause switch is shown as the switch."""
    seed.tenant("acme", "cus_acme")
    seed.events(2)
    beat(engine, breaker="open", holding_since=utcnow(), last_failure="connection refused")
    out = cli("stats", env=worker_env(db_url))
    assert out.returncode == 0, out.stderr
    assert "sending: Holding - Stripe is failing: connection refused." in out.stdout
    assert "pause switch: off" in out.stdout and "running" not in out.stdout.lower()
    operations.pause(engine, actor="ops@example.com", reason="month end", now=utcnow())
    out = cli("stats", env=worker_env(db_url))
    assert "sending: Paused - Sending is paused for every worker: month end" in out.stdout
    assert "pause switch: on (month end)" in out.stdout


def test_a_drainer_in_an_outage_shows_holding_then_sending(
        db_url: str, engine: Engine, fake_stripe: FakeStripe, seed: Any,
        client_as: Any) -> None:
    """The real SDK against the fake refusing connections: the breaker opens, the drainer's
    heartbeat says so, and every page reads "Holding" with the time of the next probe; once
    Stripe answers again the line turns green."""
    fake_stripe.add_meter("api_requests")
    seed.tenant("acme", "cus_acme")
    seed.events(30)
    settings = make_settings(db_url, stripe_api_base=fake_stripe.base_url,
                             stripe_api_key=TEST_API_KEY, max_attempts=50)
    drainer = Drainer(engine, settings, gateway_from(settings))
    drainer.announce("worker")
    viewer = client_as("viewer")
    try:
        assert drainer.meters is not None
        drainer.meters.active()  # a worker reads Stripe's meters as it starts
        fake_stripe.set_outage(True)
        wait_for(lambda: drainer.drain_once() is not None and drainer.breaker.state != "closed",
                 30, interval=0.01, message="the breaker to open")
        drainer.drain_once()  # a pass with the breaker open writes the heartbeat at once
        with engine.connect() as conn:
            row = conn.execute(select(H.c.kind, H.c.breaker, H.c.holding_since,
                                      H.c.next_probe_at)).one()
        assert row.kind == "worker" and row.breaker in ("open", "half_open")
        html = viewer.get("/").get_data(as_text=True)
        assert "Holding" in html and "next probe call" in html and "Stripe is failing" in html
        fake_stripe.set_outage(False)
        wait_for(lambda: drainer.drain_once() is not None and drainer.breaker.state == "closed"
                 and drainer.totals.sent > 0, 60, interval=0.05, message="sending again")
        drainer.drain_once()
        assert read(engine).state == "sending"
        assert ">Sending<" in viewer.get("/").get_data(as_text=True)
    finally:
        drainer.close()
    with engine.connect() as conn:  # a clean stop removes its heartbeat
        assert conn.execute(select(H.c.name)).all() == []


def test_heartbeats_of_gone_processes_are_forgotten(engine: Engine) -> None:
    from webapp.worker.breaker import CircuitBreaker
    from webapp.worker.heartbeat import Heartbeat

    beat(engine, "old:1:aa", seen_ago=3 * 86400)
    hb = Heartbeat(engine, "new:2:bb", "worker", clock=utcnow, interval=0.5)
    hb.beat(CircuitBreaker(), can_send=True, sent_total=0)
    with engine.connect() as conn:
        assert [r.name for r in conn.execute(select(H.c.name))] == ["new:2:bb"]


def test_meters_never_read_because_stripe_is_down_is_holding(
        db_url: str, engine: Engine, fake_stripe: FakeStripe, seed: Any) -> None:
    """A worker that starts during an outage cannot list the meters and sends nothing: the
    line says so at once, instead of "Idle" and, minutes later, "Stalled"."""
    seed.tenant("acme", "cus_acme")
    seed.events(2)
    fake_stripe.set_outage(True)
    settings = make_settings(db_url, stripe_api_base=fake_stripe.base_url)
    drainer = Drainer(engine, settings, gateway_from(settings))
    try:
        assert drainer.drain_once().claimed == 0
    finally:
        drainer.close()
    h = read(engine)
    assert h.state == "holding" and "meters cannot be read" in h.detail


def test_the_status_strip_says_which_meter_event_api_sends(db_url: str, engine: Engine,
                                                           users: dict[str, str]) -> None:
    from .conftest import login

    for api, words in (("v1", "Sending: v1, one event per call"),
                       ("v2_stream", "Sending: v2 streams")):
        app = create_app({"TESTING": True},
                         settings=make_settings(db_url, meter_event_api=api), engine=engine,
                         start_drainer=False)
        client = app.test_client()
        assert words not in client.get("/login").get_data(as_text=True)  # anonymous: nothing
        assert login(client, users["viewer"]).status_code == 303
        assert words in client.get("/").get_data(as_text=True)
