"""The overview and retries pages: numbers, alerts, charts, fragments, pause / resume."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from conftest import make_settings
from flask import Flask
from markupsafe import escape
from sqlalchemy import Engine, select

from webapp import create_app
from webapp.models import AuditEntry, utcnow
from webapp.outbox import operations
from webapp.outbox.control import pause_state
from webapp.read import counts, overview, retries
from webapp.read.audit import NOT_SIGN_IN
from webapp.read.health import STATES, Health, health

from .conftest import csrf_of, login
from .test_health_status import beat, meters_read


def count_on(html: str, status: str) -> int:
    return int(re.search(rf'data-status="{status}">([^<]+)<', html).group(1).replace(",", ""))


def test_counts_and_alerts(client_as, seed, now) -> None:
    seed.events(3, status="pending", created_at=now - timedelta(hours=1))
    seed.events(2, status="retrying")
    seed.events(4, status="sent")
    seed.events(4, status="sent", sent_at=now - timedelta(hours=2))     # folded on first view
    seed.events(2, status="dead")
    seed.event(status="dead", dead_at=now - timedelta(days=3))
    seed.event(status="resolved")
    seed.event(status="dead", occurred_at=now - timedelta(days=30))     # near the limit
    seed.event(status="pending", tenant_id="unmapped-co", occurred_at=now - timedelta(days=36),
               created_at=now - timedelta(minutes=2))                   # past the limit
    seed.tenant("acme", "cus_1")
    client = client_as("viewer")
    html = client.get("/").get_data(as_text=True)
    assert [count_on(html, s) for s in ("pending", "processing", "retrying", "sent", "dead",
                                        "resolved")] == [4, 0, 2, 8, 4, 1]
    assert "4 dead letters" in html and "3 new in the last 24 h" in html
    assert "Events are waiting too long" in html          # oldest waiting: 1 h > 15 min
    assert "1 events within 7 days of the 35-day limit" in html
    assert "1 events past Stripe&#39;s 35-day limit" in html
    assert "without a Stripe customer" in html and "unmapped-co" in html
    assert "sk_test" not in html                          # the key is never shown
    assert "Stripe test mode" in html
    # the same numbers again after the fold (second request) and through the query
    again = client.get("/").get_data(as_text=True)
    assert count_on(again, "sent") == 8
    with seed.engine.connect() as conn:
        assert counts.status_counts(conn)["sent"] == 8


def test_sent_per_minute_and_per_hour_buckets(engine, seed) -> None:
    now = utcnow().replace(second=30, microsecond=0)
    seed.events(2, status="sent", sent_at=now - timedelta(seconds=5))
    seed.events(3, status="sent", sent_at=now - timedelta(minutes=2))
    seed.events(1, status="sent", sent_at=now - timedelta(hours=5))
    seed.events(1, status="sent", sent_at=now - timedelta(hours=30))      # out of range
    ov = overview.overview(engine, now=now)
    assert len(ov.per_minute) == 60 and len(ov.per_hour) == 24
    assert ov.per_minute[-1].count == 2 and ov.per_minute[-3].count == 3
    assert ov.per_minute[-1].start == now.replace(second=0)
    assert ov.sent_last_hour == 5 and ov.sent_last_day == 6
    assert ov.per_hour[-1].start == now.replace(minute=0, second=0)


def test_failure_rate_from_attempts(engine, seed) -> None:
    ev = seed.event(status="retrying")
    for outcome in ("delivered", "delivered", "unknown", "not_executed"):
        seed.attempt(ev, outcome=outcome)
    seed.attempt(ev, outcome="permanent", attempted_at=utcnow() - timedelta(hours=3))
    ov = overview.overview(engine, now=utcnow())
    assert (ov.attempts_hour.total, ov.attempts_hour.failed) == (4, 2)
    assert ov.attempts_hour.failure_rate == 0.5
    assert (ov.attempts_day.total, ov.attempts_day.failed) == (5, 3)


def test_overview_fragment_and_vary(client_as, seed) -> None:
    seed.event(status="pending")
    client = client_as("viewer")
    full = client.get("/")
    frag = client.get("/", headers={"HX-Request": "true"})
    assert "HX-Request" in full.headers["Vary"] and "HX-Request" in frag.headers["Vary"]
    html = frag.get_data(as_text=True)
    assert html.lstrip().startswith('<div id="overview-live"')
    assert 'hx-trigger="every 5s"' in html
    assert "<html" not in html and "<nav" not in html and "Pause sending" not in html
    assert count_on(html, "pending") == 1
    full_html = full.get_data(as_text=True)
    assert full_html.startswith("<!doctype html>") and 'id="overview-live"' in full_html


def test_fragments_of_every_live_page(client_as, seed) -> None:
    ev = seed.event(status="retrying")
    client = client_as("admin")
    for path, root in (("/retries", '<div id="retries-live"'),
                       ("/tenants", '<div id="tenants-live"'),
                       ("/tenants/acme", '<div id="tenant-live"'),
                       ("/mappings", '<section class="panel" id="mappings"'),
                       (f"/events/{ev}", '<div id="event-live"'),
                       ("/audit", '<div id="audit-fragment"'),
                       ("/users", '<section class="panel" id="users-fragment"'),
                       ("/dead-letters", '<div id="dl-fragment"')):
        resp = client.get(path, headers={"HX-Request": "true"})
        html = resp.get_data(as_text=True)
        assert resp.status_code == 200, path
        assert html.lstrip().startswith(root), (path, html[:200])
        assert "<html" not in html and "<body" not in html, path
        assert "HX-Request" in resp.headers["Vary"], path


def test_pause_and_resume(client_as, engine, users) -> None:
    client = client_as("operator")
    resp = client.post("/sending/pause", data={"reason": "Stripe incident <b>", "next": "/retries",
                                               "csrf_token": csrf_of(client)})
    assert resp.status_code == 303 and resp.headers["Location"] == "/retries"
    with engine.connect() as conn:
        state = pause_state(conn)
    assert state.paused and state.reason == "Stripe incident <b>"
    assert state.changed_by == users["operator"]
    html = client.get("/").get_data(as_text=True)
    assert "Sending is paused for every worker" in html and "Stripe incident &lt;b&gt;" in html
    assert "Resume sending" in html
    client.post("/sending/resume", data={"csrf_token": csrf_of(client)})
    with engine.connect() as conn:
        assert not pause_state(conn).paused
        actions = list(conn.execute(select(AuditEntry.__table__.c.action,
                                           AuditEntry.__table__.c.actor)
                                    .where(NOT_SIGN_IN)
                                    .order_by(AuditEntry.__table__.c.id)))
    assert [tuple(a) for a in actions] == [("pause", users["operator"]),
                                           ("resume", users["operator"])]
    assert "Sending is paused" not in client.get("/").get_data(as_text=True)


def test_every_page_says_when_no_stripe_key_is_set(db_url, engine, users) -> None:
    app: Flask = create_app({"TESTING": True},
                            settings=make_settings(db_url, stripe_api_key=None), engine=engine,
                            start_drainer=False)
    client = app.test_client()
    login(client, users["viewer"])
    for path in ("/", "/retries", "/tenants", "/dead-letters", "/audit"):
        html = client.get(path).get_data(as_text=True)
        assert "STRIPE_API_KEY is not set" in html, path
        assert "Stripe not configured" in html, path


def test_live_mode_is_marked(db_url, engine, users) -> None:
    settings = make_settings(db_url, stripe_api_key="sk_live_0123456789abcdef")
    app = create_app({"TESTING": True}, settings=settings, engine=engine, start_drainer=False)
    client = app.test_client()
    login(client, users["viewer"])
    html = client.get("/").get_data(as_text=True)
    assert "Stripe LIVE" in html and "sk_live" not in html and "0123456789abcdef" not in html


def test_retries_page(client_as, seed) -> None:
    for n, outcome in ((1, "not_executed"), (1, "unknown"), (3, "unknown")):
        seed.event(status="retrying", attempt_count=n, last_outcome=outcome,
                   last_error_code="rate_limit" if outcome == "not_executed" else None,
                   last_http_status=429 if outcome == "not_executed" else 502,
                   first_unknown_at=utcnow() if outcome == "unknown" else None)
    seed.events(2, status="dead", attempt_count=12, last_outcome="unknown")
    seed.events(3, status="sent", attempt_count=1)
    seed.event(status="sent", attempt_count=2)
    client = client_as("viewer")
    page = retries.retries(seed.engine, now=utcnow())
    retrying, dead, sent = page.histograms
    assert retrying.rows == {1: {"not_executed": 1, "unknown": 1}, 3: {"unknown": 1}}
    assert dead.rows == {12: {"unknown": 2}} and sent.rows == {1: {"delivered": 3},
                                                              2: {"delivered": 1}}
    by_code = retries.retries(seed.engine, now=utcnow(), split="code")
    assert by_code.histograms[0].rows[1] == {"rate_limit": 1, "502": 1}
    assert page.retrying_total == 3 and len(page.retrying) == 3
    html = client.get("/retries?split=code").get_data(as_text=True)
    assert "rate_limit" in html and "<title>" in html and "outcome unknown since" in html
    bogus = client.get("/retries?split=bogus")  # an unknown split is refused, naming it
    assert bogus.status_code == 400 and "split" in bogus.get_data(as_text=True)


def test_chart_is_accessible_svg_with_a_table(client_as, seed) -> None:
    seed.events(2, status="sent")
    html = client_as("viewer").get("/").get_data(as_text=True)
    svg = html.split('id="sent-chart"', 1)[1].split("</figure>", 1)[0]
    assert 'role="img"' in svg and "aria-labelledby" in svg
    assert re.search(r"<title>\d{4}-\d\d-\d\d \d\d:00 UTC: 2 sent</title>", svg)
    assert "<table" in svg and "Show as table" in svg


def test_relative_ages_and_utc(client_as, seed) -> None:
    at = datetime.now(UTC) - timedelta(hours=2, minutes=5)
    seed.event(status="pending", created_at=at, occurred_at=at)
    html = client_as("viewer").get("/").get_data(as_text=True)
    assert "2 h 5 min ago" in html or "2 h 4 min ago" in html
    assert "All times UTC" in html


def test_a_non_stripe_api_base_is_shown_on_every_page(db_url, engine, users) -> None:
    settings = make_settings(db_url, stripe_api_base="http://127.0.0.1:12111")
    app = create_app({"TESTING": True}, settings=settings, engine=engine, start_drainer=False)
    client = app.test_client()
    login(client, users["viewer"])
    for path in ("/", "/retries", "/tenants", "/dead-letters", "/audit"):
        html = client.get(path).get_data(as_text=True)
        assert "Not Stripe:" in html and "http://127.0.0.1:12111" in html, path
    real = create_app({"TESTING": True}, settings=make_settings(db_url), engine=engine,
                      start_drainer=False).test_client()
    login(real, users["viewer"])
    assert "Not Stripe:" not in real.get("/").get_data(as_text=True)


def test_either_stripe_base_that_is_not_stripes_is_named(db_url, engine, users) -> None:
    """Only the stream host moved (a proxy in front of it): the banner names it and not the
    API; both moved to different places: both are named."""
    def banner(**bases: str) -> str:
        app = create_app({"TESTING": True}, settings=make_settings(db_url, **bases),
                         engine=engine, start_drainer=False)
        client = app.test_client()
        login(client, users["viewer"])
        return client.get("/").get_data(as_text=True)

    html = banner(stripe_meter_events_base="http://127.0.0.1:12112")
    assert "Not Stripe:" in html and "http://127.0.0.1:12112" in html
    assert "STRIPE_METER_EVENTS_BASE" in html and "(STRIPE_API_BASE)" not in html
    html = banner(stripe_api_base="http://127.0.0.1:12111",
                  stripe_meter_events_base="http://127.0.0.1:12112")
    assert "http://127.0.0.1:12111" in html and "http://127.0.0.1:12112" in html
    html = banner(stripe_meter_events_base="https://meter-events.stripe.com")
    assert "Not Stripe:" not in html


# -- the state of sending: the status line's one decision, on the whole page ----------------------

def _idle(engine: Engine, seed: Any, now: datetime) -> bool:
    return True


def _sending(engine: Engine, seed: Any, now: datetime) -> bool:
    seed.tenant("acme", "cus_acme")
    seed.events(2, next_attempt_at=now - timedelta(minutes=9))
    seed.event(status="sent", sent_at=now - timedelta(seconds=20))
    return True


def _paused(engine: Engine, seed: Any, now: datetime) -> bool:
    seed.tenant("acme", "cus_acme")
    seed.events(2, now=now)
    operations.pause(engine, actor="ops@example.com", reason="month end", now=now)
    return True


def _holding(engine: Engine, seed: Any, now: datetime) -> bool:
    seed.tenant("acme", "cus_acme")
    seed.events(3, now=now)
    seed.event(status="sent", sent_at=now - timedelta(seconds=20))  # it was fine a moment ago
    beat(engine, breaker="open", holding_since=now - timedelta(minutes=4),
         next_probe_at=now + timedelta(seconds=30), last_failure="calls to Stripe timed out")
    return True


def _stalled(engine: Engine, seed: Any, now: datetime) -> bool:
    seed.tenant("acme", "cus_acme")
    seed.events(2, next_attempt_at=now - timedelta(minutes=9))
    seed.event(status="sent", sent_at=now - timedelta(minutes=30))
    return True


def _no_api_key(engine: Engine, seed: Any, now: datetime) -> bool:
    seed.tenant("acme", "cus_acme")
    seed.events(2, now=now)
    return False


def _meter_missing(engine: Engine, seed: Any, now: datetime) -> bool:
    seed.tenant("acme", "cus_acme")
    meters_read(engine, active=["api_requests"], inactive=["storage_gb"])
    seed.events(2, meter="storage_gb", next_attempt_at=now - timedelta(minutes=20))
    return True


#: Each state of sending, and how to get there (returns whether this process has a key).
SCENARIOS: dict[str, Callable[[Engine, Any, datetime], bool]] = {
    "idle": _idle, "sending": _sending, "paused": _paused, "holding": _holding,
    "stalled": _stalled, "no_api_key": _no_api_key, "meter_missing": _meter_missing}


def test_every_state_of_sending_has_a_scenario() -> None:
    assert set(SCENARIOS) == set(STATES)


def _sending_alerts(ov: overview.Overview) -> list[overview.Alert]:
    return [a for a in ov.alerts if a.title in overview.SENDING_ALERTS.values()]


@pytest.mark.parametrize("state", list(SCENARIOS))
def test_the_overview_says_what_the_status_line_says(engine: Engine, seed: Any, state: str,
                                                     now: datetime) -> None:
    """Read alone, the Overview carries ``health()``'s decision as it is, and its one alert
    about sending is made of it: none while sending is fine, and while Stripe is failing or
    nothing goes out a critical one linking to the events due."""
    key = SCENARIOS[state](engine, seed, now)
    with engine.connect() as conn:
        h = health(conn, now=now, api_key_here=key)
    assert h.state == state
    ov = overview.overview(engine, now=now, stripe_mode="test" if key else "none")
    assert ov.health == h
    alerts = _sending_alerts(ov)
    if state in ("sending", "idle", "meter_missing"):
        assert alerts == []
    else:
        assert alerts == [overview.Alert(h.level, overview.SENDING_ALERTS[state], h.detail,
                                         "events.find", alerts[0].params)]
        assert alerts[0].level == "critical"
        due = state in ("holding", "stalled")
        assert alerts[0].params == ({"due": "1"} if due else {"status": ["pending",
                                                                          "processing",
                                                                          "retrying"]})
    if state == "meter_missing":  # each meter's own alert says it, with what to do
        assert [a.title for a in ov.alerts] == ["2 events wait for meter storage_gb"]
    # The pause switch stays what it is, whatever the state (the buttons act on it).
    assert ov.switch.paused == (state == "paused")


def test_the_state_given_is_the_one_shown(engine: Engine, seed: Any, now: datetime) -> None:
    """The page passes the status line's reading; the Overview shows that, never its own."""
    given = Health("holding", "Stripe is failing: a test outage. 0 events due.", since=now)
    ov = overview.overview(engine, now=now, status=given)
    assert ov.health is given
    assert [(a.level, a.title, a.detail) for a in _sending_alerts(ov)] == [
        ("critical", "Sending is held back", given.detail)]


def _figure(html: str) -> tuple[str, str, str]:
    """The Sending figure: (state, level, title shown)."""
    found = re.search(r'id="sending-figure" data-state="([^"]+)" data-level="([^"]+)">'
                      r'<span class="figure-label">Sending</span>\s*'
                      r'<span class="figure-value level-([^"]+)">([^<]+)</span>', html)
    assert found, "the overview has its Sending figure"
    state, level, css_level, title = found.groups()
    assert css_level == level
    return state, level, title


def _status_line(html: str) -> tuple[str, str]:
    found = re.search(r'<div class="status-line status-([a-z]+)" role="status" id="status-line">'
                      r'.*?<strong class="status-title">([^<]+)</strong>', html, re.DOTALL)
    assert found, "the page has its status line"
    return found.group(1), found.group(2)


@pytest.mark.parametrize("state", list(SCENARIOS))
def test_the_sending_figure_and_the_status_line_agree(db_url: str, engine: Engine, seed: Any,
                                                      users: dict[str, str], state: str,
                                                      now: datetime) -> None:
    key = SCENARIOS[state](engine, seed, now)
    app = create_app({"TESTING": True}, engine=engine, start_drainer=False,
                     settings=make_settings(db_url, **({} if key else {"stripe_api_key": None})))
    client = app.test_client()
    assert login(client, users["operator"]).status_code == 303
    with engine.connect() as conn:
        h = health(conn, now=now, api_key_here=key)
    page = client.get("/").get_data(as_text=True)
    fragment = client.get("/", headers={"HX-Request": "true"}).get_data(as_text=True)
    assert _status_line(page) == (h.level, h.title)
    for html in (page, fragment):
        assert _figure(html) == (h.state, h.level, h.title)
        figure = html.split('id="sending-figure"')[1].split("</div>")[0]
        assert f'<span class="figure-sub">{escape(h.detail)}</span>' in figure
        assert "Running" not in html
        assert ("level-ok" in html) == (h.level == "ok")
    # The buttons follow the pause switch, not the state.
    assert ("Resume sending" in page) == (state == "paused")
    assert ("Pause sending" in page) == (state != "paused")
    if state in ("holding", "stalled"):
        alert = re.search(r'<div class="alert alert-critical">\s*<strong>([^<]+)</strong>'
                          r' <span>([^<]*)</span>\s*<a href="([^"]+)">Show these events</a>',
                          page)
        assert alert and alert.group(1) == overview.SENDING_ALERTS[state], page[:3000]
        assert alert.group(3) == "/events?due=1"


def test_without_a_key_a_paused_switch_still_offers_resume(db_url: str, engine: Engine,
                                                          seed: Any, users: dict[str, str],
                                                          now: datetime) -> None:
    """No API key wins over the pause in the state of sending; the buttons still act on the
    switch as it is."""
    seed.events(2)
    operations.pause(engine, actor="ops@example.com", reason="month end", now=now)
    app = create_app({"TESTING": True}, engine=engine, start_drainer=False,
                     settings=make_settings(db_url, stripe_api_key=None))
    client = app.test_client()
    assert login(client, users["operator"]).status_code == 303
    html = client.get("/").get_data(as_text=True)
    assert _figure(html) == ("no_api_key", "critical", "No API key")
    assert _status_line(html) == ("critical", "No API key")
    assert "Resume sending" in html and "Pause sending" not in html
    assert "Nothing is being sent" in html


def test_the_state_of_sending_is_read_once_per_request(client_as: Any, seed: Any,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The status line reads it (``chrome``); the Overview, page or live panel, reuses that."""
    import webapp.read.overview
    import webapp.web.templating

    calls = []
    real = webapp.web.templating.health

    def counted(*args: Any, **kw: Any) -> Health:
        calls.append(1)
        return real(*args, **kw)

    def never(*args: Any, **kw: Any) -> Health:
        raise AssertionError("the overview read the state of sending again")

    monkeypatch.setattr(webapp.web.templating, "health", counted)
    monkeypatch.setattr(webapp.read.overview, "health", never)
    seed.event()
    client = client_as("viewer")
    for headers in ({}, {"HX-Request": "true"}):
        calls.clear()
        assert client.get("/", headers=headers).status_code == 200
        assert len(calls) == 1, headers
