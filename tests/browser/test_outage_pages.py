"""During a Stripe outage no page says sending is fine: every page of the dashboard (the list
``test_pages_a11y`` keeps complete against the URL map), as an admin sees it in Chromium,
while a drainer's circuit breaker is open. The status line says Holding in its alarm colours
everywhere; the Overview's Sending figure says Holding too (also once its live panel is
replaced by htmx), with a critical alert that links to the events held back; and no tile,
badge or alert anywhere says "Running", "All clear" or shows the state of sending in green.

Each page is saved as a full-page screenshot under ``test-artifacts/screenshots/outage/``.
The app runs in this process (werkzeug, threaded, no drainer: the drainer's heartbeat is
written as a drainer in an outage writes it) on a PostgreSQL schema seeded with every kind
of row.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from conftest import _pg_database, make_settings
from sqlalchemy import Engine, delete, insert
from support.seed import Seed
from support.served import chromium as launch_chromium
from test_browser_dashboard import _need_browser
from test_pages_a11y import (
    ADMIN,
    LOGIN,
    NOT_PAGES,
    PAGES,
    SHOTS,
    QuietHandler,
    Site,
    _login,
    _seed,
    get_endpoints,
)
from werkzeug.serving import make_server

from webapp import create_app
from webapp.db import make_engine
from webapp.models import DrainerHeartbeat, utcnow
from webapp.outbox.operations import resume

pytestmark = pytest.mark.slow

H = DrainerHeartbeat.__table__
FAILURE = "Could not connect to Stripe (connection refused)"
#: Events due that the outage holds back.
HELD = 4
#: Whatever says, on its own reckoning, that sending is fine: the status line and the
#: Sending figure in their green level, the Overview's "All clear", and the word "Running".
FINE = ".status-ok, .level-ok, [data-level=ok], .alert-ok"


def beat(engine: Engine) -> None:
    """The heartbeat of a drainer whose breaker is open, as it writes it on every pass while
    Stripe refuses connections (seen just now: a heartbeat older than a minute is gone)."""
    now = utcnow()
    with engine.begin() as conn:
        conn.execute(delete(H))
        conn.execute(insert(H).values(
            name="worker-host:4242:outage", kind="worker", started_at=now - timedelta(hours=1),
            seen_at=now, can_send=True, breaker="open", holding_since=now - timedelta(minutes=6),
            next_probe_at=now + timedelta(seconds=40), last_failure=FAILURE, sent_total=812,
            last_sent_at=now - timedelta(minutes=6)))


class Outage:
    def __init__(self, site: Site, engine: Engine) -> None:
        self.site, self.engine = site, engine


@pytest.fixture(scope="module")
def outage() -> Iterator[Outage]:
    """Every kind of row (as the accessibility pages have them), sending resumed (a pause
    would win over the outage in the status line), and a drainer holding."""
    _need_browser()
    db_gen = _pg_database()
    db_url = next(db_gen)
    engine = make_engine(db_url)
    server = None
    try:
        ids = _seed(engine)
        now = utcnow()
        assert resume(engine, actor=ADMIN, now=now)
        # Retries due a minute ago, which the open breaker holds back.
        Seed(engine).events(HELD, tenant_id="acme", status="retrying",
                            stripe_customer_id="cus_acme",
                            next_attempt_at=now - timedelta(minutes=1))
        beat(engine)
        app = create_app({"TESTING": True}, settings=make_settings(db_url), engine=engine,
                         start_drainer=False)
        # Every GET page an admin reaches once signed in (the log-in page has no status line).
        covered = {e for page in PAGES for e in page.endpoints}
        assert get_endpoints(app) - NOT_PAGES - covered <= set(LOGIN.endpoints)
        server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=QuietHandler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield Outage(Site(f"http://127.0.0.1:{server.server_port}", ids, db_url, engine),
                     engine)
    finally:
        if server is not None:
            server.shutdown()
        engine.dispose()
        db_gen.close()


@pytest.fixture(scope="module")
def chromium(outage: Outage) -> Iterator[Any]:
    with launch_chromium() as browser:
        yield browser


def _says_holding(page: Any) -> list[str]:
    """What on the page shown contradicts "Holding" (an empty list when nothing does)."""
    problems = []
    line = page.locator("#status-line")
    if line.count() != 1:
        return ["no status line"]
    title = line.locator(".status-title").inner_text()
    if title != "Holding" or "status-critical" not in (line.get_attribute("class") or ""):
        problems.append(f"the status line says {title!r} ({line.get_attribute('class')})")
    if FAILURE not in line.inner_text():
        problems.append("the status line does not say what fails")
    fine = page.locator(FINE)
    for i in range(fine.count()):
        problems.append(f"says fine: {fine.nth(i).evaluate('e => e.outerHTML')[:160]}")
    if "Running" in page.locator("body").inner_text():
        problems.append("says Running")
    return problems


def test_no_page_says_sending_is_fine_during_an_outage(outage: Outage, chromium: Any) -> None:
    shots = SHOTS / "outage"
    shots.mkdir(parents=True, exist_ok=True)
    context = chromium.new_context(base_url=outage.site.base,
                                   viewport={"width": 1280, "height": 900})
    context.set_default_timeout(10_000)
    problems: list[str] = []
    try:
        page = context.new_page()
        beat(outage.engine)
        _login(page)
        for p in PAGES:
            beat(outage.engine)
            path = p.path.format(**outage.site.ids)
            resp = page.goto(path)
            if resp is None or resp.status != p.status:
                problems.append(f"{p.name} ({path}): HTTP {resp.status if resp else 'none'}")
            page.wait_for_selector(p.wait_for, state="attached")
            page.screenshot(path=str(shots / f"{p.name}.png"), full_page=True)
            problems += [f"{p.name} ({path}): {x}" for x in _says_holding(page)]
    finally:
        context.close()
    assert not problems, "\n" + "\n".join(problems)


def test_the_overview_says_holding_with_the_status_line(outage: Outage, chromium: Any) -> None:
    """The Sending figure and the alert say what the line says, in its colours, on the page
    and once htmx has replaced the live panel; the figure's Pause button still follows the
    switch (resumed: it offers Pause)."""
    from playwright.sync_api import expect

    context = chromium.new_context(base_url=outage.site.base,
                                   viewport={"width": 1280, "height": 900})
    context.set_default_timeout(10_000)
    try:
        page = context.new_page()
        beat(outage.engine)
        _login(page)
        for refreshed in (False, True):
            beat(outage.engine)
            if refreshed:
                page.evaluate("""() => new Promise(done => {
                    document.body.addEventListener('htmx:afterSettle', () => done(),
                                                   {once: true});
                    htmx.ajax('GET', '/', {target: '#overview-live', swap: 'outerHTML'});
                })""")
            else:
                page.goto("/")
            figure = page.locator("#sending-figure")
            expect(figure).to_have_attribute("data-state", "holding")
            expect(figure.locator(".figure-value")).to_have_text("Holding")
            expect(figure.locator(".figure-value")).to_have_class("figure-value level-critical")
            expect(figure).to_contain_text(FAILURE)
            expect(figure).to_contain_text(f"{HELD} events due")
            r, g, b = (int(x) for x in figure.locator(".figure-value").evaluate(
                "e => getComputedStyle(e).color").strip("rgb()").split(",")[:3])
            assert r > g + 60 and r > b + 60, f"Holding is not shown in red: rgb({r},{g},{b})"
            alert = page.locator(".alert-critical", has_text="Sending is held back")
            expect(alert).to_have_count(1)
            expect(alert).to_contain_text(FAILURE)
            expect(alert.get_by_role("link", name="Show these events")).to_have_attribute(
                "href", "/events?due=1")
            assert _says_holding(page) == []
        page.screenshot(path=str(SHOTS / "outage" / "overview-after-refresh.png"),
                        full_page=True)
        expect(page.get_by_role("button", name="Pause sending")).to_be_visible()
        page.locator(".alert-critical", has_text="Sending is held back").get_by_role(
            "link", name="Show these events").click()
        page.wait_for_url("**/events?due=1")
        expect(page.locator("main")).to_contain_text("next attempt due now")
        page.screenshot(path=str(SHOTS / "outage" / "events-held-back.png"), full_page=True)
        # The retries held back (and the due event of a tenant without a customer).
        expect(page.locator("table.data tbody tr", has_text="retrying")).to_have_count(HELD)
    finally:
        context.close()
