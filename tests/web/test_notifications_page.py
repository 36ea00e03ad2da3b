"""The notifications page: channels with their secrets masked, which kinds go where, each
alert's state, the latest messages; "send a test" for admins only, audited, CSRF-checked; and
the alert paths the messages link to are the app's own."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import make_settings
from flask import Flask
from sqlalchemy import Engine, select

from webapp import create_app
from webapp.config import notify_settings
from webapp.models import AuditEntry, NotifyDelivery
from webapp.read.audit import NOT_SIGN_IN
from webapp.read.notices import PAGES, Notice
from webapp.worker.notify import Notifier

from .conftest import csrf_of

SLACK_KEY = "T000/B000/verysecretslackkey"
HOOK_SECRET = "hook-secret-0123456789abcdef"


@pytest.fixture
def app(db_url: str, engine: Engine, receivers: dict[str, Any]) -> Flask:
    notify = notify_settings({
        "NOTIFY_SLACK_WEBHOOK_URL": receivers["slack"].url + "/services/" + SLACK_KEY,
        "NOTIFY_WEBHOOK_URL": receivers["webhook"].url + "?token=querysecret",
        "NOTIFY_WEBHOOK_SECRET": HOOK_SECRET,
        "NOTIFY_SMTP_URL": receivers["email"].url.replace("smtp://", "smtp://bot:mailpass@"),
        "NOTIFY_EMAIL_FROM": "outbox@example.com", "NOTIFY_EMAIL_TO": "oncall@example.com",
        "NOTIFY_EMAIL_KINDS": "invoice_risk,late_usage"})
    return create_app({"TESTING": True}, settings=make_settings(db_url, notify=notify),
                      engine=engine, start_drainer=False)


def test_every_role_sees_the_channels_without_their_secrets(client_as: Any, app: Flask,
                                                            engine: Engine) -> None:
    Notifier(engine, app.extensions["billing_outbox"].settings).apply(
        {"holding": Notice("holding", "critical", "Sending is held back", "Stripe fails.", 4,
                           "/events?due=1")}, now=app.extensions["billing_outbox"].clock())
    for role in ("viewer", "operator", "admin"):
        html = client_as(role).get("/notifications").get_data(as_text=True)
        for secret in (SLACK_KEY, "querysecret", HOOK_SECRET, "mailpass"):
            assert secret not in html, (role, secret)
        assert 'data-channel="slack"' in html and "/…" in html
        assert "(signed)" in html and "as bot" in html
        assert "invoice_risk, late_usage" in html          # email's kinds
        assert 'data-kind="holding" data-state="firing"' in html
        assert '<a href="/events?due=1">Sending is held back</a>' in html
        assert html.count('data-status="pending"') == 2     # Slack and the webhook
        assert ("Send a test" in html) == (role == "admin")
        assert "a reminder every 4 h while it lasts" in html


def test_send_a_test_is_for_admins_audited_and_csrf_checked(
        client_as: Any, engine: Engine, receivers: dict[str, Any]) -> None:
    operator = client_as("operator")
    assert operator.post("/notifications/test", data={
        "channel": "webhook", "csrf_token": csrf_of(operator)}).status_code == 403
    admin = client_as("admin")
    assert admin.post("/notifications/test", data={"channel": "webhook"}).status_code == 400
    assert receivers["webhook"].received == []
    resp = admin.post("/notifications/test", data={"channel": "webhook",
                                                   "csrf_token": csrf_of(admin)})
    assert resp.status_code == 303
    assert [b["kind"] for b in receivers["webhook"].bodies()] == ["test"]
    assert "Test message: Sent to the webhook." in admin.get("/notifications").get_data(
        as_text=True)
    receivers["slack"].status = 410
    admin.post("/notifications/test", data={"channel": "slack", "csrf_token": csrf_of(admin)})
    html = admin.get("/notifications").get_data(as_text=True)
    assert "Test message: Slack answered HTTP 410" in html
    with engine.connect() as conn:
        audit = conn.execute(select(AuditEntry.action, AuditEntry.reason_code, AuditEntry.note)
                             .where(NOT_SIGN_IN).order_by(AuditEntry.id)).all()
        kept = conn.execute(select(NotifyDelivery.channel, NotifyDelivery.status)
                            .order_by(NotifyDelivery.id)).all()
    assert [tuple(a) for a in audit] == [
        ("notify.test", "webhook", "sent"),
        ("notify.test", "slack", "failed: Slack answered HTTP 410: receiver is down")]
    assert [tuple(k) for k in kept] == [("webhook", "sent"), ("slack", "failed")]


def test_the_filters_lead_to_the_rows_counted(client_as: Any, app: Flask,
                                              engine: Engine) -> None:
    Notifier(engine, app.extensions["billing_outbox"].settings).apply(
        {"holding": Notice("holding", "critical", "Held", "x", 1, "/")},
        now=app.extensions["billing_outbox"].clock())
    viewer = client_as("viewer")
    html = viewer.get("/notifications?channel=slack&status=pending").get_data(as_text=True)
    assert html.count('data-status="pending"') == 1
    assert viewer.get("/notifications?channel=pager").status_code == 400
    assert client_as(None).get("/notifications").status_code == 302


def test_the_pages_alerts_link_to_are_the_apps_own(app: Flask) -> None:
    with app.test_request_context():
        from flask import url_for

        for endpoint, path in PAGES.items():
            assert url_for(endpoint) == path, endpoint


def test_a_failing_channel_shows_on_the_overview(client_as: Any, app: Flask,
                                                 engine: Engine,
                                                 receivers: dict[str, Any]) -> None:
    from webapp.worker.notify import Deliverer

    svc = app.extensions["billing_outbox"]
    Notifier(engine, svc.settings).apply(
        {"holding": Notice("holding", "critical", "Held", "x", 1, "/")}, now=svc.clock())
    receivers["slack"].status = 500
    Deliverer(engine, svc.settings.notify).run_once()
    html = client_as("viewer").get("/").get_data(as_text=True)
    assert "Alerts are not reaching Slack" in html
    assert "Sending to Stripe goes on as usual." in html
    assert 'href="/notifications"' in html


def test_notifications_add_no_query_to_a_page_view(db_url: str, engine: Engine,
                                                   users: dict[str, str],
                                                   receivers: dict[str, Any]) -> None:
    """The Overview and the other pages read the same statements with every channel set up
    as with none (a channel's last try comes in the read the Overview already made)."""
    from sqlalchemy import event

    from .conftest import login

    def statements(app: Flask, path: str) -> int:
        client = app.test_client()
        login(client, users["viewer"])
        client.get(path)  # once to warm what a first view caches
        seen: list[str] = []

        def count(*args: Any) -> None:
            seen.append(args[2])

        event.listen(engine, "before_cursor_execute", count)
        try:
            assert client.get(path).status_code == 200
        finally:
            event.remove(engine, "before_cursor_execute", count)
        return len(seen)

    plain = create_app({"TESTING": True}, settings=make_settings(db_url), engine=engine,
                       start_drainer=False)
    notify = notify_settings({"NOTIFY_SLACK_WEBHOOK_URL": receivers["slack"].url,
                              "NOTIFY_WEBHOOK_URL": receivers["webhook"].url,
                              "NOTIFY_WEBHOOK_SECRET": HOOK_SECRET,
                              "NOTIFY_SMTP_URL": receivers["email"].url,
                              "NOTIFY_EMAIL_FROM": "a@example.com",
                              "NOTIFY_EMAIL_TO": "b@example.com"})
    notifying = create_app({"TESTING": True}, settings=make_settings(db_url, notify=notify),
                           engine=engine, start_drainer=False)
    for path in ("/", "/events", "/periods", "/dead-letters"):
        assert statements(notifying, path) == statements(plain, path), path
