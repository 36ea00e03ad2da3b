"""Every page of the dashboard, as a person on a laptop (light and dark) and on a phone sees it:
a full-page screenshot of each under ``test-artifacts/screenshots/{light,dark,phone}/``, no
serious or critical axe-core violation, and on a 390 px phone no sideways scrolling.

The list of pages is checked against the app's URL map: a new GET page fails this module until
it is added to :data:`PAGES` (or, if it answers something other than HTML, to
:data:`NOT_PAGES`).

axe-core is vendored (``tests/browser/vendor/axe.min.js``, recorded in ``static/VENDORED.md``)
and injected as a script tag; the app's Content-Security-Policy forbids inline scripts, so this
module's browser contexts alone bypass it. The app runs in this process (werkzeug, threaded,
no drainer) on a PostgreSQL schema seeded with every kind of row.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, _pg_database, make_settings
from support.served import chromium as launch_chromium
from test_browser_dashboard import _need_browser
from web.conftest import seed_every_kind
from werkzeug.serving import WSGIRequestHandler, make_server

from webapp import create_app
from webapp.db import make_engine
from webapp.models import utcnow
from webapp.outbox.operations import pause, resolve
from webapp.users import create_user

pytestmark = pytest.mark.slow

AXE = Path(__file__).parent / "vendor" / "axe.min.js"
SHOTS = ROOT / "test-artifacts" / "screenshots"
ADMIN = "a11y-admin@example.com"
PASSWORD = "amber-falcon-orchard-71"
DUPLICATE = ("An event already exists with identifier key-dup; events are deduplicated "
             "within 24 hours")

#: Answers that are not HTML pages (exports, probes, assets).
NOT_PAGES = frozenset({"static", "health.healthz", "health.readyz", "health.health",
                       "metrics.metrics", "audit.export", "tenants.export", "events.export",
                       "api.openapi"})

MODES: dict[str, dict[str, Any]] = {
    "light": {"color_scheme": "light", "viewport": {"width": 1280, "height": 900}},
    "dark": {"color_scheme": "dark", "viewport": {"width": 1280, "height": 900}},
    "phone": {"color_scheme": "light", "viewport": {"width": 390, "height": 844},
              "is_mobile": True, "has_touch": True},
}


@dataclass(frozen=True)
class Page:
    """One page to visit: its name (the screenshot's), its path (``{name}`` placeholders are
    filled from the seeded ids), the endpoints it shows, and what to wait for."""

    name: str
    path: str
    endpoints: tuple[str, ...]
    wait_for: str = "main"
    status: int = 200


PAGES: tuple[Page, ...] = (
    Page("overview", "/", ("dashboard.overview",)),
    Page("retries", "/retries", ("dashboard.retries",)),
    Page("tenants", "/tenants", ("tenants.index",)),
    # Over more than a month: the page asks for a prepared report.
    Page("tenants-report-needed", "/tenants?from=2026-01-01&to=2026-03-31", ("tenants.index",)),
    Page("tenant", "/tenants/acme", ("tenants.show",)),
    Page("mappings", "/mappings", ("tenants.mappings",)),
    # The groups fragment is loaded into the dead-letter page by htmx.
    Page("dead-letters", "/dead-letters", ("dead_letters.index", "dead_letters.groups"),
         wait_for="#dl-groups-table"),
    Page("dead-letters-groups", "/dead-letters/groups", ("dead_letters.groups",)),
    Page("dead-letters-resolved", "/dead-letters?status=resolved", ("dead_letters.index",)),
    Page("dead-letters-requeue-all", "/dead-letters/requeue-all",
         ("dead_letters.requeue_all_preview",)),
    Page("rejected", "/rejected", ("rejected.index",)),
    Page("rejected-requeue-all", "/rejected/requeue-all", ("rejected.requeue_all_preview",)),
    Page("reconciliation", "/reconciliation", ("reconciliation.index",)),
    Page("reconciliation-lost-day", "/reconciliation/mismatches/{lost}",
         ("reconciliation.day",)),
    Page("reconciliation-resend", "/reconciliation/mismatches/{lost}/resend",
         ("reconciliation.resend_confirm",)),
    Page("reconciliation-part-of-a-day", "/reconciliation/mismatches/{part}",
         ("reconciliation.day",)),
    Page("stripe", "/stripe", ("stripe_side.index",)),
    Page("periods", "/periods", ("periods.index",)),
    Page("periods-late", "/periods/late", ("periods.late_usage",)),
    Page("invoices", "/invoices", ("invoices.index",)),
    Page("notifications", "/notifications", ("notifications.index",)),
    Page("audit", "/audit", ("audit.index",)),
    Page("users", "/users", ("users.index",)),
    Page("tokens", "/tokens", ("tokens.index",)),
    Page("event-dead", "/events/{dead}", ("events.show",)),
    Page("event-sent", "/events/{duplicate}", ("events.show",)),
    Page("event-retrying", "/events/{retrying}", ("events.show",)),
    Page("event-rejected", "/events/{rejected}", ("events.show",)),
    Page("event-cancel", "/events/{duplicate}/cancel", ("events.cancel_confirm",)),
    # A miss goes back to the overview with a message.
    Page("events", "/events", ("events.find",)),
    Page("events-filtered", "/events?status=dead&status=pending&tenant=initech&attempts=0-3",
         ("events.find",)),
    Page("search", "/search", ("search.index",)),
    Page("search-results", "/search?q=key-", ("search.index",)),
    Page("search-miss", "/search?q=nothing-like-this", ("search.index",)),
    Page("account-password", "/account/password", ("account.password",)),
    Page("error-404", "/events/999999999", (), status=404),
)
#: Visited before signing in.
LOGIN = Page("login", "/login", ("auth.login",), wait_for="#main form")


def get_endpoints(app: Any) -> set[str]:
    return {r.endpoint for r in app.url_map.iter_rules() if "GET" in (r.methods or ())}


class QuietHandler(WSGIRequestHandler):
    def log(self, type: str, message: str, *args: Any) -> None:  # noqa: A002 - werkzeug's name
        pass


@dataclass
class Site:
    base: str
    ids: dict[str, int]
    db_url: str
    engine: Any


def _seed(engine: Any) -> dict[str, int]:
    """Every kind of row, plus an event Stripe already had (the duplicate-identifier answer),
    one retrying after an unknown outcome, a resolved one with its audit entry, a day Stripe
    lost and one it holds part of, users, and sending paused."""
    from support.seed import Seed

    now = utcnow()
    seed = Seed(engine)
    ids = seed_every_kind(seed, now)
    seed.tenant("globex", "cus_globex", "Globex Corporation (EMEA billing account)")
    dup = seed.event(status="sent", tenant_id="globex", idempotency_key="key-dup",
                     stripe_customer_id="cus_globex", sent_at=now - timedelta(minutes=3),
                     attempt_count=2, call_count=2)
    seed.attempt(dup, attempted_at=now - timedelta(minutes=8), outcome="unknown", http_status=500,
                 error_class="APIError", error_message="An unknown error occurred",
                 stripe_request_id="req_8fGh2kLmNpQr", idempotency_key="key-dup")
    seed.attempt(dup, attempted_at=now - timedelta(minutes=3), outcome="delivered",
                 http_status=400, error_class="InvalidRequestError", error_message=DUPLICATE,
                 stripe_request_id="req_9aBc3dEfGhIj", idempotency_key="key-dup")
    retrying = seed.event(status="retrying", tenant_id="globex", last_outcome="unknown",
                          last_http_status=502, last_error_class="APIError",
                          last_error_message="Bad gateway", first_unknown_at=now,
                          stripe_customer_id="cus_globex")
    seed.attempt(retrying, outcome="unknown", http_status=502, error_class="APIError",
                 error_message="Bad gateway")
    lost = seed.lost_day(now)
    part = seed.lost_day(now, stripe_units=4, tenant="globex")
    rejected = seed.event(status="rejected", rejected_at=now,
                          reject_code="meter_event_no_customer_defined",
                          reject_message="Missing customer mapping", sent_at=now)
    to_resolve = seed.event(status="dead", tenant_id="globex")
    create_user(engine, ADMIN, PASSWORD, "admin", now=now)
    create_user(engine, "finance@example.com", PASSWORD, "viewer", now=now)
    resolve(engine, [to_resolve], actor=ADMIN, reason="billed_manually",
            note="Billed by hand on invoice INV-2041", now=now)
    # Paused: every page's status line in its alarm colours (and the overview's Resume button).
    pause(engine, actor=ADMIN, reason="Stripe incident INC-311: holding until it is resolved",
          now=now)
    return {"dead": ids["event_id"], "duplicate": dup, "retrying": retrying,
            "rejected": rejected, "lost": lost, "part": part}


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    _need_browser()
    db_gen = _pg_database()
    db_url = next(db_gen)
    engine = make_engine(db_url)
    try:
        ids = _seed(engine)
        app = create_app({"TESTING": True}, settings=make_settings(db_url), engine=engine,
                         start_drainer=False)
        with _served(app) as base:
            yield Site(base, ids, db_url, engine)
    finally:
        engine.dispose()
        db_gen.close()


@contextmanager
def _served(app: Any) -> Iterator[str]:
    """``app`` served in this process (werkzeug, threaded): its base URL."""
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=QuietHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()


@pytest.fixture(scope="module")
def chromium(site: Site) -> Iterator[Any]:
    with launch_chromium() as browser:
        yield browser


def test_the_vendored_axe_is_the_recorded_file() -> None:
    record = (ROOT / "static" / "VENDORED.md").read_text()
    found = re.search(r"`tests/browser/vendor/axe\.min\.js`.*?([\d.]+) \|.*?`([0-9a-f]{64})`",
                      record)
    assert found, "static/VENDORED.md records tests/browser/vendor/axe.min.js"
    version, digest = found.groups()
    data = AXE.read_bytes()
    assert hashlib.sha256(data).hexdigest() == digest
    assert data.startswith(f"/*! axe v{version}".encode())


def test_every_get_page_is_in_the_list(tmp_path: Path) -> None:
    """Needs no browser: a new page fails here even where the browser tests skip."""
    app = create_app({"TESTING": True}, start_drainer=False,
                     settings=make_settings(f"sqlite:///{tmp_path / 'routes.sqlite3'}"))
    endpoints = get_endpoints(app)
    covered = {e for page in (*PAGES, LOGIN) for e in page.endpoints}
    missing = endpoints - covered - NOT_PAGES
    assert not missing, (f"GET pages not checked for accessibility and phone layout: "
                         f"{sorted(missing)}; add them to PAGES (or NOT_PAGES if not HTML)")
    assert not covered - endpoints, f"no such endpoint: {sorted(covered - endpoints)}"


def _violations(page: Any) -> list[str]:
    """axe-core's serious and critical violations on the page, one readable line per node."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.add_script_tag(path=str(AXE))
    result = page.evaluate("""async () => {
        const r = await axe.run(document, {resultTypes: ['violations']});
        return r.violations.filter(v => v.impact === 'serious' || v.impact === 'critical')
          .map(v => ({id: v.id, impact: v.impact, help: v.help,
                      nodes: v.nodes.slice(0, 6).map(n => ({target: n.target.join(' '),
                                                           summary: n.failureSummary}))}));
    }""")
    lines = []
    for v in result:
        lines.append(f"  [{v['impact']}] {v['id']}: {v['help']}")
        for n in v["nodes"]:
            summary = " ".join((n["summary"] or "").split())
            lines.append(f"      {n['target']}  — {summary[:300]}")
    return lines


#: How many Tab presses each page gets in light mode, each landing on a visibly focused element.
KEYBOARD_TABS = 40

FOCUS_SEEN = """() => {
  const e = document.activeElement;
  if (!e || e === document.body) return null;
  const s = getComputedStyle(e);
  const ring = s.outlineStyle !== 'none' && parseFloat(s.outlineWidth) >= 1;
  return {ring, what: e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + ' ' +
                      (e.getAttribute('aria-label') || e.textContent || e.name || '')
                        .trim().replace(/\\s+/g, ' ').slice(0, 40)};
}"""


def _keyboard(page: Any, tabs: int) -> list[str]:
    """From the top of the page: no positive tabindex, the first Tab lands on "Skip to
    content", which moves focus to <main>; then ``tabs`` presses, each on a visible focus
    ring."""
    problems = []
    positive = page.evaluate("""[...document.querySelectorAll('[tabindex]')]
        .filter(e => e.tabIndex > 0).map(e => e.outerHTML.slice(0, 80))""")
    if positive:
        problems.append(f"positive tabindex (breaks the reading order): {positive}")
    # Each focus is recorded as it happens (one read at the end, not one per key press).
    page.evaluate("() => { const seen = " + FOCUS_SEEN + "; window.__focusLog = [];"
                  " document.addEventListener('focusin', () => window.__focusLog.push(seen()),"
                  " true); }")
    autofocus = page.evaluate("document.activeElement !== document.body")
    if autofocus:
        # A form that puts the cursor in its first field (log-in, password): the skip link
        # is still the first thing a keyboard reaches from the top.
        first_stop = page.evaluate("""document.querySelector(
            'a[href], button, input:not([type=hidden]), select, textarea, [tabindex]')""" +
            "?.textContent")
        if first_stop != "Skip to content":
            problems.append(f"the first focusable element is not 'Skip to content': {first_stop}")
    for _ in range(tabs):
        page.keyboard.press("Tab")
    log = page.evaluate("window.__focusLog")
    if not autofocus:
        first = log[0] if log else None
        if not first or not first["what"].endswith("Skip to content") or not first["ring"]:
            problems.append(f"the first Tab should show 'Skip to content', got {first}")
    unseen = []
    for seen in log:
        if seen is None:
            break  # past the last element
        if not seen["ring"] and seen["what"] not in unseen:  # focus cycles on a short page
            unseen.append(seen["what"])
    problems += [f"no visible focus on {what!r}" for what in unseen]
    page.focus(".skip-link")  # proven the first stop above
    page.keyboard.press("Enter")
    if page.evaluate("document.activeElement && document.activeElement.id") != "main":
        problems.append("'Skip to content' does not move focus to the main content")
    return problems


def _check(page: Any, site: Site, mode: str, p: Page) -> list[str]:
    """Visit one page, save its screenshot, and return what is wrong with it."""
    path = p.path.format(**site.ids)
    resp = page.goto(site.base + path)
    problems = []
    if resp is None or resp.status != p.status:
        problems.append(f"HTTP {resp.status if resp else 'none'}, expected {p.status}")
    page.wait_for_selector(p.wait_for, state="attached")
    return [f"{mode} {p.name} ({path}): {x}" for x in problems] + _inspect(page, mode, p.name,
                                                                           path)


def _inspect(page: Any, mode: str, name: str, path: str) -> list[str]:
    """Screenshot the page shown, and return what is wrong with it (width, axe, keyboard)."""
    problems = []
    page.screenshot(path=str(SHOTS / mode / f"{name}.png"), full_page=True)
    if mode == "phone":
        # Measured against the phone's width, not window.innerWidth: a mobile browser widens
        # its layout viewport to fit content that overflows (and zooms out).
        wide = [page.evaluate("document.documentElement.scrollWidth"),
                MODES[mode]["viewport"]["width"]]
        if wide[0] > wide[1]:
            offenders = page.evaluate("""(width) => [...document.querySelectorAll('body *')]
              .filter(e => e.getBoundingClientRect().right > width + 0.5 &&
                           !e.closest('.table-wrap, .nav, pre, .command'))
              .slice(0, 5).map(e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') +
                               (e.className && e.className.baseVal === undefined
                                ? '.' + String(e.className).trim().replace(/\\s+/g, '.') : ''))
            """, wide[1])
            problems.append(f"scrolls sideways: {wide[0]} px wide in a {wide[1]} px window "
                            f"(widest: {offenders})")
    found = _violations(page)
    if found:
        problems.append("axe-core:")
    problems += _keyboard(page, tabs=KEYBOARD_TABS if mode == "light" else 1)
    return [f"{mode} {name} ({path}): {x}" for x in problems] + found


@pytest.mark.parametrize("mode", list(MODES))
def test_every_page_is_accessible_and_fits(site: Site, chromium: Any, mode: str) -> None:
    (SHOTS / mode).mkdir(parents=True, exist_ok=True)
    context = chromium.new_context(base_url=site.base, bypass_csp=True, **MODES[mode])
    context.set_default_timeout(10_000)
    try:
        page = context.new_page()
        problems = _check(page, site, mode, LOGIN)
        page.get_by_label("Email").fill(ADMIN)
        page.get_by_label("Password").fill(PASSWORD)
        with page.expect_navigation():
            page.get_by_role("button", name="Log in").click()
        assert page.url.rstrip("/") == site.base, page.url
        for p in PAGES:
            problems += _check(page, site, mode, p)
    finally:
        context.close()
    assert not problems, "\n" + "\n".join(problems)


#: Shown by POSTs from the mappings page (a file, or Stripe's customers): what is previewed.
MAPPINGS_FILES = {
    "mappings-import-preview": ("tenant_id,stripe_customer_id,name\n"
                                "acme,cus_acmeNew,Acme Holdings (North America)\n"
                                "newco,cus_newco,New Co\nglobex,cus_globex,\n"),
    "mappings-import-bad-lines": ("tenant_id,stripe_customer_id\nnewco,acct_1\n"
                                  ",cus_nobody\n"),
    "mappings-import-not-in-stripe": ("tenant_id,stripe_customer_id,name\n"
                                      "newco,cus_newco,New Co\n"
                                      "umbrella,cus_UmbrellaTypo,Umbrella\n"
                                      "globex,cus_gone,\n"),
}
#: The customers the fake Stripe of the previews has (it has ``cus_gone`` deleted).
MAPPINGS_CUSTOMERS = ("cus_acmeNew", "cus_newco", "cus_globex")


@pytest.fixture(scope="module")
def stripe_site(site: Site) -> Iterator[str]:
    """The same database, served by an app whose key reaches the fake Stripe: the previews
    ask it about each customer of a file. Its base URL."""
    from support.fake_stripe import FakeStripe

    with FakeStripe() as fake:
        for customer in MAPPINGS_CUSTOMERS:
            fake.create_customer(customer)
        fake.create_customer("cus_gone", deleted=True)
        app = create_app({"TESTING": True}, engine=site.engine, start_drainer=False,
                         settings=make_settings(site.db_url, stripe_api_base=fake.base_url))
        with _served(app) as base:
            yield base


@pytest.mark.parametrize("mode", list(MODES))
def test_the_mappings_previews_are_accessible_and_fit(stripe_site: str, chromium: Any,
                                                      mode: str, tmp_path: Path) -> None:
    """The previews are answers to a posted form, not GET pages: each is reached by
    uploading a file on the mappings page, as an admin would (nothing is applied)."""
    (SHOTS / mode).mkdir(parents=True, exist_ok=True)
    context = chromium.new_context(base_url=stripe_site, bypass_csp=True, **MODES[mode])
    context.set_default_timeout(10_000)
    problems: list[str] = []
    try:
        page = context.new_page()
        _login(page)
        for name, text in MAPPINGS_FILES.items():
            path = tmp_path / f"{name}.csv"
            path.write_text(text)
            page.goto("/mappings")
            page.set_input_files("#mappings-bulk input[type=file]", str(path))
            with page.expect_navigation():
                page.get_by_role("button", name="Preview the file").click()
            page.wait_for_selector("#mappings-preview")
            # Stripe was asked: the customers it has can be applied, the others are named.
            applies = page.get_by_role("button", name=re.compile("^Apply")).count()
            assert applies == (name == "mappings-import-preview"), name
            if name == "mappings-import-not-in-stripe":
                assert page.locator("#bad-lines li").count() == 2
            problems += _inspect(page, mode, name, "POST /mappings/import")
    finally:
        context.close()
    assert not problems, "\n" + "\n".join(problems)


def _login(page: Any) -> None:
    page.goto("/login")
    page.get_by_label("Email").fill(ADMIN)
    page.get_by_label("Password").fill(PASSWORD)
    with page.expect_navigation():
        page.get_by_role("button", name="Log in").click()


LOCAL_TITLES = """() => [...document.querySelectorAll('time[datetime]')]
    .map(t => [t.getAttribute('datetime'), t.title])"""


def test_times_show_the_viewers_own_time_and_stripes_duplicate_answer_is_neutral(
        site: Site, chromium: Any) -> None:
    """A support agent in New York reads an event Stripe already had: the answer is plain and
    not red, and each time shows "… ago · … UTC" with their own time on hover, also in a
    panel htmx has just replaced."""
    from playwright.sync_api import expect

    context = chromium.new_context(base_url=site.base, timezone_id="America/New_York",
                                   color_scheme="light")
    context.set_default_timeout(10_000)
    try:
        page = context.new_page()
        _login(page)
        page.goto(f"/events/{site.ids['duplicate']}")
        answer = page.get_by_text("Stripe already had this event — counted once")
        expect(answer).to_be_visible()
        note = page.locator("#attempts .answer-note")
        expect(note).to_have_text(f"Already at Stripe: {DUPLICATE}")
        for locator in (answer, page.locator("#attempts .outcome-duplicate"), note):
            r, g, b = (int(x) for x in re.findall(r"\d+", locator.evaluate(
                "e => getComputedStyle(e).color"))[:3])
            assert r - max(g, b) < 40, f"the duplicate answer is shown in red: rgb({r},{g},{b})"
        first = page.locator("#attempts time").first
        expect(first).to_have_text(
            re.compile(r"^\d+ min ago · \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$"))

        times = page.evaluate(LOCAL_TITLES)
        assert times and all(title.startswith("Your time: ") for _, title in times), times
        assert any(re.search(r"\bEST\b|GMT-0?5", title) for _, title in times), times

        # The overview's live panel, replaced by htmx as its poll would.
        page.goto("/")
        page.evaluate("""() => new Promise(done => {
            document.body.addEventListener('htmx:afterSettle', () => done(), {once: true});
            htmx.ajax('GET', '/', {target: '#overview-live', swap: 'outerHTML'});
        })""")
        swapped = page.evaluate("""() => [...document.querySelectorAll('#overview-live time')]
            .map(t => t.title)""")
        assert swapped and all(t.startswith("Your time: ") for t in swapped), swapped
    finally:
        context.close()
