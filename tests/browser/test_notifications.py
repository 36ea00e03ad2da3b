"""The Notifications page in a real browser, on SQLite and PostgreSQL, on a desktop and a
390 px phone: an admin sees each channel without its secrets, an alert that is on, a message
a failing receiver has not taken yet (the Overview says so too), and sends a test that
reaches the local receiver; a viewer sees the same without the buttons.
``billing-outbox serve`` with the drainer off; screenshots under test-artifacts/screenshots."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from conftest import worker_env
from support.receivers import HttpReceiver, SmtpReceiver
from support.served import chromium, served
from test_browser_dashboard import SHOTS, Stack, Visitor, _need_browser, stack_database

from webapp.config import Settings, notify_settings
from webapp.db import make_engine
from webapp.models import utcnow
from webapp.read.notices import Notice
from webapp.users import create_user
from webapp.worker.notify import Deliverer, Notifier

pytestmark = pytest.mark.slow

PASSWORD = "amber-falcon-orchard-71"
ADMIN = "admin@example.com"
VIEWER = "finance@example.com"
SLACK_KEY = "T0001/B0001/slack-key-never-shown"
SECRET = "browser-webhook-secret-0123"


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def stack(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    _need_browser()
    tmp = tmp_path_factory.mktemp(f"notify-{request.param}")
    db_url, db_gen = stack_database(request.param, tmp)
    engine = make_engine(db_url)
    slack, hook, mail = HttpReceiver().start(), HttpReceiver().start(), SmtpReceiver().start()
    try:
        now = utcnow()
        create_user(engine, ADMIN, PASSWORD, "admin", now=now)
        create_user(engine, VIEWER, PASSWORD, "viewer", now=now)
        notify = {"NOTIFY_SLACK_WEBHOOK_URL": f"{slack.url}/services/{SLACK_KEY}",
                  "NOTIFY_WEBHOOK_URL": hook.url, "NOTIFY_WEBHOOK_SECRET": SECRET,
                  "NOTIFY_SMTP_URL": mail.url, "NOTIFY_EMAIL_FROM": "outbox@example.com",
                  "NOTIFY_EMAIL_TO": "oncall@example.com,finance@example.com",
                  "NOTIFY_EMAIL_KINDS": "invoice_risk,late_usage,holding"}
        settings = Settings(database_url=db_url, notify=notify_settings(notify))
        Notifier(engine, settings).apply({"holding": Notice(
            "holding", "critical", "Sending is held back",
            "Stripe is failing: connection refused.", 12, "/events?due=1")}, now=now)
        slack.status = 500
        Deliverer(engine, settings.notify).run_once()   # webhook and email take theirs
        env = worker_env(db_url, "http://127.0.0.1:9", DRAINER_ENABLED="false", **notify)
        with served(env, tmp / "serve.log") as base:
            yield Stack(base, db_url, engine, None, tmp / "serve.log", [], [], [],
                        state={"slack": slack, "hook": hook, "mail": mail})
    finally:
        for r in (slack, hook, mail):
            r.stop()
        engine.dispose()
        if db_gen is not None:
            db_gen.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    SHOTS.mkdir(parents=True, exist_ok=True)
    with chromium() as b:
        yield b


def test_an_admin_sees_the_channels_and_sends_a_test(stack: Stack, browser: Any,
                                                     request: pytest.FixtureRequest) -> None:
    backend = "pg" if "postgres" in request.node.name else "sqlite"
    v = Visitor(browser, stack)
    try:
        v.login(ADMIN)
        page = v.page
        alerts = page.locator(".alerts").inner_text()
        assert "Alerts are not reaching Slack" in alerts
        assert "HTTP 500" in alerts and "Sending to Stripe goes on as usual." in alerts
        v.shot(f"notify-{backend}-overview")
        with page.expect_navigation():
            page.get_by_role("link", name="Notifications").first.click()
        html = page.content()
        assert SLACK_KEY not in html and SECRET not in html
        slack_row = page.locator('#channels-table tr[data-channel="slack"]')
        assert "failing" in slack_row.inner_text()
        assert "/…" in slack_row.inner_text()
        email_row = page.locator('#channels-table tr[data-channel="email"]')
        assert "invoice_risk, late_usage, holding" in email_row.inner_text()
        holding = page.locator('#alerts-table tr[data-kind="holding"]')
        assert holding.get_attribute("data-state") == "firing"
        assert "Sending is held back" in holding.inner_text()
        v.shot(f"notify-{backend}-page")
        # The Slack row's "1 waiting" leads to that message.
        with page.expect_navigation():
            slack_row.locator("td.num a").first.click()
        rows = page.locator("#deliveries-table tbody tr")
        assert rows.count() == 1
        assert "HTTP 500" in rows.first.inner_text() and "waiting" in rows.first.inner_text()
        v.goto("/notifications")
        before = len(stack.state["hook"].received)
        with page.expect_navigation():
            page.locator('#channels-table tr[data-channel="webhook"]').get_by_role(
                "button", name="Send a test").click()
        assert "Test message: Sent to the webhook." in page.locator(".flashes").inner_text()
        got = stack.state["hook"].received[before:]
        assert [r.json()["kind"] for r in got] == ["test"]
        assert ADMIN in got[0].json()["text"]
        v.shot(f"notify-{backend}-tested")
        _on_phone(v, "/notifications", f"notify-{backend}-page")
        v.assert_clean()
    finally:
        v.close()


def test_a_viewer_sees_the_same_without_the_buttons(stack: Stack, browser: Any,
                                                    request: pytest.FixtureRequest) -> None:
    backend = "pg" if "postgres" in request.node.name else "sqlite"
    v = Visitor(browser, stack)
    try:
        v.login(VIEWER)
        v.goto("/notifications")
        page = v.page
        assert page.locator('#alerts-table tr[data-kind="holding"]').count() == 1
        assert page.get_by_role("button", name="Send a test").count() == 0
        v.shot(f"notify-{backend}-viewer")
        _on_phone(v, "/notifications", f"notify-{backend}-viewer")
        v.assert_clean()
    finally:
        v.close()


def _on_phone(v: Visitor, path: str, name: str) -> None:
    """The page on a 390 px phone: nothing wider than the screen (tables scroll in their own
    box), each channel's name on it."""
    phone = v.context.new_page()
    try:
        phone.set_viewport_size({"width": 390, "height": 844})
        phone.goto(path)
        overflow = phone.evaluate(
            "document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 0, f"{path}: {overflow}px wider than the phone"
        for channel in ("slack", "webhook", "email"):
            box = phone.locator(f'#channels-table tr[data-channel="{channel}"] th').bounding_box()
            assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390
        phone.screenshot(path=str(SHOTS / f"{name}-phone.png"), full_page=True)
    finally:
        phone.close()
