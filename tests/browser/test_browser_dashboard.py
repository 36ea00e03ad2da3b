"""The dashboard in a real browser: headless Chromium (Debian's, driven by Playwright) against
``billing-outbox serve`` (gunicorn, one worker, the in-app APScheduler drainer) on PostgreSQL
and the fake Stripe.

One server and one browser for the module; the tests run in file order and build on each
other's state like one operator's session: log in, resume sending and watch the sent count
climb through htmx polling, requeue one dead event, resolve another with a reason and a note,
find both in the audit log, then a viewer who can look at everything and change nothing.
Every page visited is saved as a full-page screenshot under ``test-artifacts/screenshots/``,
and any console error, uncaught page error, CSP violation or failed response fails the test.

Chromium is never downloaded: without ``/usr/bin/chromium`` (or the ``playwright`` package)
the module is skipped, unless ``REQUIRE_BROWSER=1``, where it fails.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, _pg_database, cli, wait_for, worker_env
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session
from support.served import CHROMIUM, served
from support.served import chromium as launch_chromium

from webapp.db import make_engine
from webapp.models import AuditEntry, OutboxEvent, utcnow
from webapp.outbox import enqueue_usage
from webapp.outbox.control import pause_state as sending_state
from webapp.outbox.operations import resume, set_tenant
from webapp.read.audit import NOT_SIGN_IN
from webapp.users import create_user

pytestmark = pytest.mark.slow

REQUIRE_BROWSER = os.environ.get("REQUIRE_BROWSER") == "1"
SHOTS = ROOT / "test-artifacts" / "screenshots"
PASSWORD = "amber-falcon-orchard-71"
ADMIN = "ops-admin@example.com"
VIEWER = "finance-viewer@example.com"
OPERATOR = "support-operator@example.com"
BAD_METER = "api_requests"   # the dead ones meet a permanent 400 (a fault aimed at them)
N_GOOD = 24                  # sent at 5/s, so sending lasts ~5 s: longer than the first poll
N_DEAD = 3
N_UNMAPPED = 2               # a tenant without a Stripe customer: these wait
PAUSE_REASON = "browser test: hold until the page is watched"
T = OutboxEvent.__table__


def _browser_unavailable() -> str | None:
    if not os.path.exists(CHROMIUM):
        return f"{CHROMIUM} is not installed (Debian package chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as exc:
        return f"the playwright package is not importable: {exc}"
    return None


def stack_database(kind: str, tmp: Path) -> tuple[str, Iterator[str] | None]:
    """A fresh database for a module's served stack: (its URL, the generator to close at the
    end, for PostgreSQL)."""
    if kind == "sqlite":
        from support.databases import SqliteTemplate

        (tmp / "template").mkdir()
        return SqliteTemplate(tmp / "template").copy_to(tmp / "outbox.sqlite3"), None
    db_gen = _pg_database()
    return next(db_gen), db_gen


def _need_browser() -> None:
    reason = _browser_unavailable()
    if reason is None:
        return
    if REQUIRE_BROWSER:
        pytest.fail(f"REQUIRE_BROWSER=1 but {reason}")
    pytest.skip(reason)


@dataclass
class Stack:
    """What the tests share: the server's address, its database, the fake Stripe, the ids."""

    base: str
    db_url: str
    engine: Engine
    fake: Any
    log_path: Path
    good_ids: list[int]
    dead_ids: list[int]
    unmapped_ids: list[int]
    state: dict[str, Any] = field(default_factory=dict)

    def statuses(self, ids: list[int]) -> dict[int, str]:
        with self.engine.connect() as conn:
            return dict(conn.execute(select(T.c.id, T.c.status).where(T.c.id.in_(ids))).all())

    def count(self, status: str) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(T)
                                    .where(T.c.status == status)).scalar_one())

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


@pytest.fixture(scope="module")
def browser_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A migrated PostgreSQL schema with tenants, users and events; sending paused; the fake
    Stripe; and ``billing-outbox serve --workers 1`` on a free port."""
    _need_browser()
    from support.fake_stripe import FakeStripe

    db_gen = _pg_database()
    db_url = next(db_gen)
    fake = FakeStripe().start()
    engine = make_engine(db_url)
    log_path = tmp_path_factory.mktemp("browser") / "serve.log"
    try:
        now = utcnow()
        set_tenant(engine, "acme", stripe_customer_id="cus_acme", name="Acme Corp", now=now)
        set_tenant(engine, "globex", stripe_customer_id="cus_globex", name="Globex", now=now)
        for email, role in ((ADMIN, "admin"), (OPERATOR, "operator"), (VIEWER, "viewer")):
            create_user(engine, email, PASSWORD, role, now=now)  # real scrypt parameters
        good, dead, unmapped = [], [], []
        with Session(engine) as db, db.begin():
            # The bad-meter events first, so they are claimed (and die) early.
            for i in range(N_DEAD):
                dead.append(enqueue_usage(
                    db, tenant_id="globex", quantity=100 + i, meter=BAD_METER,
                    idempotency_key=f"browser-dead-{i}",
                    occurred_at=now - timedelta(hours=2, minutes=i)).id)
            for i in range(N_GOOD):
                good.append(enqueue_usage(
                    db, tenant_id="acme" if i % 3 else "globex", quantity=i + 1,
                    idempotency_key=f"browser-ok-{i}",
                    # over an hour old: in the whole hours a reconciliation reads (up to
                    # the last hour's start), whatever the minute the test runs at
                    occurred_at=now - timedelta(minutes=90 - i)).id)
            for i in range(N_UNMAPPED):
                unmapped.append(enqueue_usage(
                    db, tenant_id="initech", quantity=7, idempotency_key=f"browser-wait-{i}",
                    occurred_at=now - timedelta(hours=1)).id)
        for i in range(N_DEAD):
            fake.fail_for(f"browser-dead-{i}", "400")
        # Two 503s: a couple of retries for the retries page.
        fake.fail_next("503", 2)

        # Five calls a second: the ~27 sends take ~5.5 s, so the count is still climbing when
        # the page's first 5-second poll comes.
        # Batches of four, so the count climbs in steps rather than in one jump.
        env = worker_env(db_url, fake.base_url, STRIPE_MAX_REQUESTS_PER_SECOND="5",
                         OUTBOX_BATCH_SIZE="4", STRIPE_EVENTS_POLL_SECONDS="1")
        paused = cli("pause", "--reason", PAUSE_REASON, env=env)
        assert paused.returncode == 0, paused.stderr

        with served(env, log_path) as base:
            yield Stack(base, db_url, engine, fake, log_path, good, dead, unmapped)
    finally:
        fake.stop()
        engine.dispose()
        db_gen.close()  # drops the schema


@pytest.fixture(scope="module")
def chromium(browser_stack: Stack) -> Iterator[Any]:
    """One headless Chromium for the module (Debian's binary; never downloaded)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    with launch_chromium() as browser:
        yield browser


# Reports a CSP violation as a console error (Chromium logs one too; this also gives the
# directive and the blocked address). Playwright's init scripts are exempt from the page CSP.
CSP_LISTENER = """
document.addEventListener('securitypolicyviolation', function (e) {
  console.error('CSP violation: ' + e.violatedDirective + ' blocked ' + e.blockedURI +
                ' at ' + e.sourceFile + ':' + e.lineNumber);
});
"""


# Chart axis labels that stick out of their SVG (and are clipped there).
CLIPPED_TICKS = """
() => [...document.querySelectorAll('.chart svg')].flatMap(svg => {
  const box = svg.getBoundingClientRect();
  return [...svg.querySelectorAll('text.tick')].filter(t => {
    const r = t.getBoundingClientRect();
    return r.left < box.left - 0.5 || r.right > box.right + 0.5;
  }).map(t => t.textContent);
})
"""


class Visitor:
    """One person's browser context and page, with every error the page reports collected."""

    def __init__(self, browser: Any, stack: Stack) -> None:
        self.stack = stack
        self.context = browser.new_context(base_url=stack.base,
                                           viewport={"width": 1280, "height": 900})
        self.context.set_default_timeout(10_000)
        self.context.add_init_script(CSP_LISTENER)
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.allowed_statuses: set[tuple[str, int]] = set()
        self.signed_in_as: str | None = None
        self.page = self.context.new_page()
        page = self.page
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(f"page error: {exc}"))
        page.on("response", self._response)
        page.on("requestfailed", self._failed)
        page.on("dialog", self._dialog)

    def _console(self, msg: Any) -> None:
        if msg.type == "error":
            text = msg.text
            # A response we expected to fail (e.g. a viewer's 403) is logged by Chromium too.
            if any(f"status of {code}" in text for _, code in self.allowed_statuses):
                return
            self.errors.append(f"console error: {text} ({msg.location.get('url', '')})")

    def _response(self, resp: Any) -> None:
        if resp.status >= 400:
            path = resp.url.removeprefix(self.stack.base).split("?")[0]
            if (path, resp.status) not in self.allowed_statuses:
                self.errors.append(f"HTTP {resp.status} for {resp.request.method} {resp.url}")

    def _failed(self, req: Any) -> None:
        failure = req.failure or ""
        if "ERR_ABORTED" in failure:  # a poll cut short by navigating away
            return
        self.errors.append(f"request failed: {req.method} {req.url}: {failure}")

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        dialog.accept()

    def goto(self, path: str) -> Any:
        resp = self.page.goto(path)
        assert resp is not None
        return resp

    def shot(self, name: str) -> Path:
        """A full-page screenshot under test-artifacts/screenshots/, after checking the
        layout: nothing wider than the window, no chart label cut off at its SVG's edge."""
        page = self.page
        overflow = page.evaluate(
            "document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 0, f"{page.url}: the page is {overflow}px wider than the window"
        clipped = page.evaluate(CLIPPED_TICKS)
        assert not clipped, f"{page.url}: chart labels cut off: {clipped}"
        path = SHOTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    def login(self, email: str, shot: str | None = None) -> None:
        """Through the form, as a person would: the app sends us to /login first."""
        page = self.page
        self.goto("/")
        assert re.search(r"/login\?next=", page.url), page.url
        if shot:
            self.shot(shot)
        page.get_by_label("Email").fill(email)
        page.get_by_label("Password").fill(PASSWORD)
        with page.expect_navigation():
            page.get_by_role("button", name="Log in").click()
        assert page.url.rstrip("/") == self.stack.base, page.url
        assert page.locator(".who .email").inner_text() == email
        self.signed_in_as = email

    def ensure_login(self, email: str) -> None:
        """Sign in unless this session already is (a test run on its own with ``-k``)."""
        if self.signed_in_as != email:
            self.login(email)

    def csrf(self) -> str:
        token = self.page.locator('input[name="csrf_token"]').first.get_attribute("value")
        assert token
        return token

    def assert_clean(self) -> None:
        assert not self.errors, "the browser reported errors:\n" + "\n".join(self.errors)

    def close(self) -> None:
        self.context.close()


@pytest.fixture(scope="module")
def admin(chromium: Any, browser_stack: Stack) -> Iterator[Visitor]:
    """The admin's browser session, shared by the tests in order (logged in by the first)."""
    v = Visitor(chromium, browser_stack)
    yield v
    v.close()


def count_on_page(page: Any, status: str) -> int:
    text = page.locator(f'.count-value[data-status="{status}"]').inner_text()
    return int(text.replace(",", "").strip())


# -- 1 and 2: log in, resume, watch the count climb --------------------------------------------

def test_login_resume_and_watch_the_sent_count_climb(admin: Visitor,
                                                     browser_stack: Stack) -> None:
    from playwright.sync_api import expect

    stack, page = browser_stack, admin.page
    admin.login(ADMIN, shot="01-login")

    # Paused by the CLI before the server started: nothing has gone out.
    status = page.locator("#status-line")
    expect(status.locator(".status-title")).to_have_text("Paused")
    expect(status).to_contain_text("Sending is paused for every worker")
    expect(status).to_contain_text(PAUSE_REASON)
    total = N_GOOD + N_DEAD + N_UNMAPPED
    assert count_on_page(page, "pending") == total
    assert count_on_page(page, "sent") == 0
    # The tenant without a Stripe customer is called out.
    expect(page.locator("#overview-live")).to_contain_text("initech")
    admin.shot("02-overview-paused")

    with page.expect_navigation():
        page.get_by_role("button", name="Resume sending").click()
    assert admin.dialogs[-1] == "Resume sending for every worker?"
    expect(page.locator(".flash-ok")).to_have_text("Sending resumed.")
    expect(status.locator(".status-title")).not_to_have_text("Paused")
    expect(page.get_by_role("button", name="Pause sending")).to_be_visible()

    before = count_on_page(page, "sent")
    assert before < N_GOOD, "everything was sent before the page loaded; the rate is too high"
    # Mark this document: if the count changes while the mark survives, htmx's poll swapped
    # the panel in place (no reload, no navigation).
    page.evaluate("window.__sameDocument = true")
    page.wait_for_function(
        """([before]) => {
             const el = document.querySelector('.count-value[data-status="sent"]');
             return window.__sameDocument === true && el &&
                    parseInt(el.textContent.replace(/,/g, ''), 10) > before;
           }""",
        arg=[before], timeout=20_000)
    after = count_on_page(page, "sent")
    assert after > before
    assert page.evaluate("window.__sameDocument") is True
    assert stack.count("sent") >= after

    # Let the drainer finish: every good event sent, every bad-meter event dead.
    wait_for(lambda: stack.count("sent") == N_GOOD and stack.count("dead") == N_DEAD, 30,
             message="the drainer sends the good events and dead-letters the bad meter")
    page.wait_for_function(
        """([n]) => document.querySelector('.count-value[data-status="sent"]')
                      .textContent.replace(/,/g, '') === String(n)""",
        arg=[N_GOOD], timeout=12_000)
    expect(page.locator('.count-value[data-status="dead"]')).to_have_text(str(N_DEAD))
    page.reload()  # the status line is read with the page: events went out, so it is green
    expect(page.locator("#status-line.status-ok .status-title")).to_have_text("Sending")
    admin.shot("03-overview-running")
    admin.assert_clean()


# -- 3: requeue a dead event ---------------------------------------------------------------------

def test_requeue_a_dead_event_from_the_dead_letters_page(admin: Visitor,
                                                          browser_stack: Stack) -> None:
    from playwright.sync_api import expect

    stack, page = browser_stack, admin.page
    admin.ensure_login(ADMIN)
    with stack.engine.connect() as conn:
        still_paused = sending_state(conn).paused
    if still_paused:  # run on its own (-k): the first test did not resume sending
        resume(stack.engine, actor="browser-test setup", now=utcnow())
    wait_for(lambda: stack.count("dead") == N_DEAD, 30, message="the bad-meter events are dead")
    target = stack.dead_ids[0]
    stack.state["requeued"] = target
    # Stripe takes it now: the requeued event will go through.
    stack.fake.stop_failing_for(f"browser-dead-{stack.dead_ids.index(target)}")

    admin.goto("/dead-letters")
    rows = page.locator("#dl-table tbody tr")
    expect(rows).to_have_count(N_DEAD)
    row = page.locator(f'#dl-table tr[data-id="{target}"]')
    expect(row).to_contain_text(BAD_METER)
    # The grouping panel loads by itself (hx-trigger="load").
    expect(page.locator("#dl-groups-table")).to_contain_text("InvalidRequestError")
    admin.shot("06-dead-letters")

    row.get_by_role("checkbox").check()
    with page.expect_navigation():
        page.get_by_role("button", name="Requeue selected").click()
    expect(page.locator(".flash-ok")).to_have_text("Requeued 1 event(s).")
    expect(page.locator(f'#dl-table tr[data-id="{target}"]')).to_have_count(0)
    expect(page.locator("#dl-table tbody tr")).to_have_count(N_DEAD - 1)

    # Its own page: pending (or already sent); the live panel polls until it is sent.
    admin.goto(f"/events/{target}")
    expect(page.locator("h1")).to_contain_text(f"Event #{target}")
    expect(page.locator("#event-live .status-sent")).to_be_visible(timeout=15_000)
    attempts = page.locator("#attempts tbody tr")
    # Newest first: the delivery, and before it the 400 that killed it (perhaps after a 503).
    expect(attempts.first).to_contain_text("delivered")
    expect(attempts.filter(has_text="permanent")).to_have_count(1)
    expect(page.locator("#event-audit")).to_contain_text("requeue")
    expect(page.locator("#event-audit")).to_contain_text(ADMIN)
    assert stack.statuses([target]) == {target: "sent"}
    admin.shot("07-event-requeued-and-sent")
    admin.assert_clean()


# -- 4: resolve one with a reason and a note ------------------------------------------------------

NOTE = "Billed by hand on invoice INV-2041 <b>not bold</b>"


def test_resolve_a_dead_event_with_a_reason_and_a_note(admin: Visitor,
                                                       browser_stack: Stack) -> None:
    from playwright.sync_api import expect

    stack, page = browser_stack, admin.page
    admin.ensure_login(ADMIN)
    target = stack.dead_ids[1]
    stack.state["resolved"] = target

    admin.goto("/dead-letters")
    row = page.locator(f'#dl-table tr[data-id="{target}"]')
    expect(row).to_be_visible()
    row.get_by_role("checkbox").check()
    page.get_by_label("Reason").select_option("written_off")
    page.get_by_label("Note").fill(NOTE)
    with page.expect_navigation():
        page.get_by_role("button", name="Resolve selected").click()
    expect(page.locator(".flash-ok")).to_have_text("Resolved 1 event(s).")
    expect(page.locator(f'#dl-table tr[data-id="{target}"]')).to_have_count(0)
    expect(page.locator("#dl-table tbody tr")).to_have_count(N_DEAD - 2)
    assert stack.statuses([target]) == {target: "resolved"}

    # Resolved rows stay in history: the "Show" filter swaps the table in with htmx.
    page.locator('select[name="status"]').select_option("resolved")
    resolved_row = page.locator(f'#dl-table tr[data-id="{target}"]')
    expect(resolved_row).to_be_visible()
    expect(resolved_row).to_contain_text("written_off")
    expect(resolved_row).to_contain_text(NOTE)  # shown as text, not markup
    expect(resolved_row.locator("b")).to_have_count(0)
    expect(page).to_have_url(re.compile(r"/dead-letters\?.*status=resolved"))
    admin.shot("08-dead-letters-resolved")

    admin.goto(f"/events/{target}")
    expect(page.locator("#event-live")).to_contain_text("written_off")
    expect(page.locator("#event-live blockquote")).to_have_text(NOTE)
    admin.shot("09-event-resolved")
    admin.assert_clean()


# -- 5: both actions in the audit log -------------------------------------------------------------

def test_the_audit_log_shows_both_actions_with_the_users_email(admin: Visitor,
                                                               browser_stack: Stack) -> None:
    from playwright.sync_api import expect

    stack, page = browser_stack, admin.page
    admin.ensure_login(ADMIN)
    requeued, resolved = stack.state["requeued"], stack.state["resolved"]
    admin.goto("/audit")
    rows = page.locator("#audit-table tbody tr")

    requeue_row = rows.filter(has=page.locator(".action-requeue"))
    expect(requeue_row).to_have_count(1)
    expect(requeue_row).to_contain_text(ADMIN)
    expect(requeue_row.get_by_role("link", name=f"#{requeued}")).to_be_visible()

    resolve_row = rows.filter(has=page.locator(".action-resolve"))
    expect(resolve_row).to_have_count(1)
    expect(resolve_row).to_contain_text(ADMIN)
    expect(resolve_row).to_contain_text("written_off")
    expect(resolve_row.locator(".note")).to_have_text(NOTE)
    expect(resolve_row.get_by_role("link", name=f"#{resolved}")).to_be_visible()

    expect(rows.filter(has=page.locator(".action-resume"))).to_contain_text(ADMIN)
    expect(rows.filter(has=page.locator(".action-pause"))).to_contain_text("cli:")
    admin.shot("10-audit")

    # Filter by who: the form swaps the table in place.
    page.get_by_label("Who").fill(ADMIN)
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"/audit\?.*actor="))
    expect(rows.filter(has=page.locator(".action-pause"))).to_have_count(0)
    expect(rows).to_have_count(3)  # resume, requeue, resolve
    with stack.engine.connect() as conn:
        mine = conn.execute(select(func.count()).select_from(AuditEntry.__table__)
                            .where(AuditEntry.__table__.c.actor == ADMIN, NOT_SIGN_IN)).scalar_one()
    assert mine == 3
    admin.assert_clean()


# -- every other page, as the admin ---------------------------------------------------------------

def test_every_page_renders_cleanly(admin: Visitor, browser_stack: Stack) -> None:
    from playwright.sync_api import expect

    stack, page = browser_stack, admin.page
    admin.ensure_login(ADMIN)
    pages = [
        ("/retries", "Retries", "04-retries"),
        ("/tenants", "Tenants & usage", "05-tenants"),
        ("/tenants/acme", "acme", "05b-tenant-acme"),
        ("/mappings", None, "05c-mappings"),
        (f"/events/{stack.dead_ids[2]}", f"Event #{stack.dead_ids[2]}", "09b-event-dead"),
        ("/dead-letters/requeue-all", None, "06b-requeue-all-preview"),
        ("/users", "Users", "11-users"),
    ]
    for path, heading, shot in pages:
        resp = admin.goto(path)
        assert resp.status == 200, (path, resp.status)
        if heading:
            expect(page.locator("h1").first).to_contain_text(heading)
        admin.shot(shot)

    # The admin-only users page lists everyone.
    admin.goto("/users")
    for email in (ADMIN, OPERATOR, VIEWER):
        expect(page.locator("main")).to_contain_text(email)
    # The usage table counts what was sent for acme.
    admin.goto("/tenants")
    expect(page.locator("#usage-table")).to_contain_text("acme")
    expect(page.locator("#usage-table")).to_contain_text("cus_acme")
    admin.assert_clean()


# -- after Stripe's 200: a rejection, its requeue, a cancel, a reconciliation ----------------

def test_a_rejected_event_is_requeued_another_cancelled_and_totals_reconciled(
        admin: Visitor, browser_stack: Stack) -> None:
    """Stripe reports an accepted event invalid: the overview says so, the Rejected page
    says why in plain words, requeueing sends it under ``<key>~r1``; a sent event is
    cancelled through the confirm step; the Reconciliation button runs a comparison."""
    from playwright.sync_api import expect
    from support.fake_stripe import AsyncError

    stack, page = browser_stack, admin.page
    admin.ensure_login(ADMIN)
    with stack.engine.connect() as conn:
        if sending_state(conn).paused:
            resume(stack.engine, actor="browser-test setup", now=utcnow())
    wait_for(lambda: set(stack.statuses(stack.good_ids).values()) == {"sent"}, 30,
             message="the good events are sent")
    rejected_id, cancelled_id = stack.good_ids[4], stack.good_ids[5]
    with stack.engine.connect() as conn:
        meter = conn.execute(select(T.c.meter).where(T.c.id == rejected_id)).scalar_one()
    stack.fake.report_errors([AsyncError(
        meter, "meter_event_customer_not_found",
        "No customer with id 'cus_acme' exists.", "browser-ok-4")])
    # The server polls Stripe's events every second (STRIPE_EVENTS_POLL_SECONDS).
    wait_for(lambda: stack.statuses([rejected_id]) == {rejected_id: "rejected"}, 20,
             message="the poll rejects the reported event")

    admin.goto("/")
    figure = page.locator(".figure", has_text="Rejected, waiting for a person")
    expect(figure.locator(".figure-value")).to_have_text("1")
    admin.shot("20-overview-rejected")
    with page.expect_navigation():
        figure.locator("a").click()
    row = page.locator(f'tr[data-id="{rejected_id}"]')
    expect(row).to_contain_text("cus_acme")
    expect(page.locator("main")).to_contain_text("check the tenant")
    admin.shot("21-rejected")
    row.get_by_role("checkbox").check()
    with page.expect_navigation():
        page.get_by_role("button", name="Requeue selected").click()
    expect(page.locator(".flash-ok")).to_contain_text("Requeued 1")
    wait_for(lambda: stack.statuses([rejected_id]) == {rejected_id: "sent"}, 20,
             message="the requeued event is sent again")
    assert "browser-ok-4~r1" in stack.fake.accepted()
    admin.goto(f"/events/{rejected_id}")
    expect(page.locator("main")).to_contain_text("browser-ok-4~r1")
    admin.shot("22-event-requeued-new-identifier")

    admin.goto(f"/events/{cancelled_id}")
    with page.expect_navigation():
        page.get_by_role("link", name="Cancel at Stripe…").click()
    expect(page.locator("h1")).to_contain_text(f"Cancel event #{cancelled_id} at Stripe?")
    admin.shot("23-cancel-confirm")
    page.get_by_label("Reason").select_option("duplicate")
    page.get_by_label("Note").fill("Sent twice by the import of ticket T-77")
    page.get_by_role("checkbox").check()
    with page.expect_navigation():
        page.get_by_role("button", name="Cancel at Stripe").click()
    expect(page.locator("#cancelled-panel")).to_contain_text("Cancelled at Stripe")
    assert stack.statuses([cancelled_id]) == {cancelled_id: "cancelled"}
    assert stack.fake.accepted()["browser-ok-5"].cancelled
    admin.shot("24-event-cancelled")

    admin.goto("/reconciliation")
    with page.expect_navigation():
        page.get_by_role("button", name="Reconcile the last 35 days now").click()
    expect(page.locator(".flash-ok")).to_contain_text("Reconciliation started")
    # The page follows the run and shows it when it ends (htmx): ours, by this person.
    # Everything here is younger than the settle time: pending, and no mismatch.
    expect(page.locator("#recon-run")).to_contain_text(ADMIN, timeout=20_000)
    expect(page.locator("#recon-running")).to_have_count(0)
    pending = page.locator('#recon-run dd[data-k="pending"]').inner_text()
    assert int(pending.replace(",", "")) > 0, pending
    expect(page.locator('#recon-run dd[data-k="mismatches"]')).to_have_text("0")
    expect(page.locator("#mismatches")).to_have_count(0)
    admin.shot("25-reconciliation")
    admin.goto("/stripe")
    expect(page.locator("main")).to_contain_text(meter)
    admin.shot("26-stripe-side")
    admin.assert_clean()


# -- the pause button ------------------------------------------------------------------------------

def test_pause_and_resume_with_the_buttons(chromium: Any, browser_stack: Stack) -> None:
    from playwright.sync_api import expect

    op = Visitor(chromium, browser_stack)
    try:
        page = op.page
        op.login(OPERATOR)
        page.get_by_label("Reason").fill("Stripe incident 1234")
        with page.expect_navigation():
            page.get_by_role("button", name="Pause sending").click()
        assert op.dialogs == ["Pause sending for every worker?"]
        status = page.locator("#status-line")
        expect(status).to_contain_text("Stripe incident 1234")
        expect(status).to_contain_text(OPERATOR)
        with page.expect_navigation():
            page.get_by_role("button", name="Resume sending").click()
        expect(status.locator(".status-title")).not_to_have_text("Paused")
        expect(page.locator(".flash-ok")).to_have_text("Sending resumed.")
        # An operator is not an admin: no users page.
        expect(page.get_by_role("link", name="Users")).to_have_count(0)
        op.assert_clean()
    finally:
        op.close()


# -- 6: a viewer sees everything and can change nothing --------------------------------------------

def test_a_viewer_has_no_buttons_and_gets_403_when_posting(chromium: Any,
                                                          browser_stack: Stack) -> None:
    from playwright.sync_api import expect

    stack = browser_stack
    dead = stack.dead_ids[2]
    viewer = Visitor(chromium, stack)
    try:
        page = viewer.page
        viewer.login(VIEWER)
        expect(page.locator(".who .role")).to_have_text("viewer")
        expect(page.get_by_role("button", name=re.compile("Pause sending|Resume sending"))
               ).to_have_count(0)
        expect(page.get_by_role("link", name="Users")).to_have_count(0)
        viewer.shot("12-viewer-overview")

        viewer.goto("/dead-letters")
        expect(page.locator(f'#dl-table tr[data-id="{dead}"]')).to_be_visible()
        expect(page.locator('#dl-table input[name="ids"]')).to_have_count(0)
        expect(page.get_by_role("button", name=re.compile("Requeue|Resolve"))).to_have_count(0)
        expect(page.get_by_role("link", name=re.compile("Requeue all"))).to_have_count(0)
        viewer.shot("13-viewer-dead-letters")

        viewer.goto(f"/events/{dead}")
        expect(page.locator("#event-live .dead-panel")).to_be_visible()
        expect(page.get_by_role("button", name=re.compile("Requeue|Resolve"))).to_have_count(0)
        viewer.shot("14-viewer-event")

        viewer.allowed_statuses.add(("/users", 403))
        resp = viewer.goto("/users")
        assert resp.status == 403
        expect(page.locator("main")).to_contain_text("admin")
        viewer.shot("15-viewer-users-403")

        # Posting anyway, with the session's own valid CSRF token: 403, nothing changes.
        viewer.goto("/dead-letters")
        token = viewer.csrf()
        before = stack.statuses(stack.dead_ids)
        for path, form in (("/dead-letters/requeue", {"ids": str(dead)}),
                           ("/dead-letters/resolve", {"ids": str(dead), "reason": "other",
                                                      "note": "viewer tried"}),
                           ("/sending/pause", {"reason": "viewer tried"})):
            resp = viewer.context.request.post(stack.base + path,
                                               form={"csrf_token": token, **form},
                                               max_redirects=0)
            assert resp.status == 403, (path, resp.status)
        assert stack.statuses(stack.dead_ids) == before
        with stack.engine.connect() as conn:
            tried = conn.execute(select(func.count()).select_from(AuditEntry.__table__)
                                 .where(AuditEntry.__table__.c.actor == VIEWER,
                                        NOT_SIGN_IN)).scalar_one()
        assert tried == 0
        viewer.assert_clean()
    finally:
        viewer.close()


# -- a long period: a viewer prepares the report, on a laptop and on a phone -------------------

def test_a_viewer_prepares_the_report_of_a_long_period(chromium: Any,
                                                       browser_stack: Stack) -> None:
    """Over more than a month the page asks for a report; the viewer presses the button, the
    page shows the figures with the moment they are exact as of, and its CSV is the report.
    The same on a 390 px phone, where nothing scrolls sideways."""
    from playwright.sync_api import expect

    stack = browser_stack
    today = utcnow().date()
    period = f"from={(today - timedelta(days=59)).isoformat()}&to={today.isoformat()}"
    viewer = Visitor(chromium, stack)
    phone = chromium.new_context(base_url=stack.base, viewport={"width": 390, "height": 844},
                                 is_mobile=True, has_touch=True, color_scheme="dark")
    try:
        page = viewer.page
        viewer.login(VIEWER)
        viewer.goto(f"/tenants?{period}&sort=sent_units")
        expect(page.locator("#report-needed")).to_contain_text("prepared as a report")
        expect(page.locator("#usage-table")).to_have_count(0)
        viewer.shot("16-tenants-report-needed")
        with page.expect_navigation():
            page.get_by_role("button", name="Prepare the report").click()
        assert "sort=sent_units" in page.url and "from=" in page.url, page.url
        expect(page.locator(".flash, .alert").first).to_contain_text("The report is ready")
        expect(page.locator("#report-as-of")).to_contain_text("exact as of")
        expect(page.locator("#report-as-of")).to_contain_text(VIEWER)
        expect(page.locator("#usage-table")).to_contain_text("acme")
        viewer.shot("17-tenants-report")
        link = page.get_by_role("link", name=re.compile("Download CSV of the report"))
        href = link.get_attribute("href")
        assert href and "report=" in href
        body = viewer.context.request.get(stack.base + href).text()
        assert "Figures exact as of (UTC), a prepared report" in body and "acme" in body

        # The same session's cookies on a phone, in dark mode.
        phone.add_cookies(viewer.context.cookies())
        small = phone.new_page()
        small.goto(f"/tenants?{period}")
        expect(small.locator("#report-as-of")).to_be_visible()
        overflow = small.evaluate(
            "document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 0, f"the phone page is {overflow}px wider than the window"
        small.screenshot(path=str(SHOTS / "18-tenants-report-phone.png"), full_page=True)
        viewer.assert_clean()
    finally:
        phone.close()
        viewer.close()


# -- sign-in hardening: a reset password, its forced change, a lock-out ---------------------------

def test_a_reset_password_is_changed_at_the_next_log_in_and_guessing_locks(
        chromium: Any, browser_stack: Stack) -> None:
    from playwright.sync_api import expect

    stack = browser_stack
    person = "new-hire@example.com"
    create_user(stack.engine, person, PASSWORD, "viewer", now=utcnow())
    boss = Visitor(chromium, stack)
    newbie = Visitor(chromium, stack)
    guesser = Visitor(chromium, stack)
    try:
        boss.login(ADMIN)
        boss.goto("/users")
        row = boss.page.locator(f'tr[data-email="{person}"]')
        expect(row.get_by_role("button", name="Reset password")).to_be_visible()
        boss.shot("27-users-actions")
        with boss.page.expect_navigation():
            row.get_by_role("button", name="Reset password").click()
        assert boss.dialogs[-1].startswith(f"Reset the password of {person}?")
        temporary = boss.page.locator("#temporary-password").inner_text().strip()
        assert len(temporary) >= 12
        boss.shot("28-password-reset-shown-once")

        page = newbie.page
        newbie.goto("/")
        page.get_by_label("Email").fill(person)
        page.get_by_label("Password").fill(temporary)
        with page.expect_navigation():
            page.get_by_role("button", name="Log in").click()
        assert page.url.endswith("/account/password"), page.url
        newbie.goto("/dead-letters")                  # every page leads back here
        assert page.url.endswith("/account/password"), page.url
        expect(page.locator("#password-forced")).to_contain_text("administrator reset")
        expect(page.get_by_role("link", name="Dead letters")).to_have_count(0)
        newbie.shot("29-must-change-password")
        page.get_by_label("Current password").fill(temporary)
        page.get_by_label("New password", exact=True).fill("violet-tractor-lemonade-42")
        page.get_by_label("New password again").fill("violet-tractor-lemonade-42")
        with page.expect_navigation():
            page.get_by_role("button", name="Change password").click()
        expect(page.locator(".flash-ok")).to_contain_text("Password changed")
        assert page.locator(".who .email").inner_text() == person
        newbie.assert_clean()

        # Five wrong guesses lock the account; the page says for how long.
        guesser.allowed_statuses.update({("/login", 401), ("/login", 429)})
        gp = guesser.page
        guesser.goto("/login")
        for i in range(5):
            gp.get_by_label("Email").fill(person)
            gp.get_by_label("Password").fill(f"guess-number-{i}")
            with gp.expect_navigation():
                gp.get_by_role("button", name="Log in").click()
        expect(gp.locator(".flash-error")).to_contain_text("Try again in 15 minutes")
        guesser.shot("30-login-locked")
        guesser.assert_clean()
        boss.assert_clean()
    finally:
        boss.close()
        newbie.close()
        guesser.close()


# -- issue 14: the status line during a Stripe outage ---------------------------------------------

def test_an_outage_reads_holding_with_the_next_probe_then_sending(
        admin: Visitor, browser_stack: Stack) -> None:
    """Stripe refuses connections while events are due: the in-app drainer's breaker opens,
    and every page's status line says "Holding" (in red, with the next probe call) instead
    of a green "Sending"; once Stripe answers, the next probe gets through and it is green."""
    from playwright.sync_api import expect

    stack, page = browser_stack, admin.page
    admin.ensure_login(ADMIN)
    stack.fake.set_outage(True)
    try:
        with Session(stack.engine) as db, db.begin():
            for i in range(16):
                enqueue_usage(db, tenant_id="acme", quantity=1,
                              idempotency_key=f"browser-outage-{i}")

        def holding() -> bool:
            admin.goto("/retries")
            return page.locator("#status-line .status-title").inner_text() == "Holding"

        wait_for(holding, 40, interval=0.5, message="the status line to say Holding")
        status = page.locator("#status-line")
        expect(status).to_have_class(re.compile(r"\bstatus-critical\b"))
        expect(status).to_contain_text("Stripe is failing")
        expect(status).to_contain_text("next probe call")
        admin.shot("31-status-holding")
    finally:
        stack.fake.set_outage(False)

    def sending() -> bool:
        admin.goto("/")
        return page.locator("#status-line .status-title").inner_text() == "Sending"

    wait_for(sending, 90, interval=1, message="the status line to turn back to Sending")
    expect(page.locator("#status-line")).to_have_class(re.compile(r"\bstatus-ok\b"))
    admin.assert_clean()
