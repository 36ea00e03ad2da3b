"""Notifications, on SQLite and PostgreSQL: each change of an alert kind queued once however
many notifiers look, reminders at their interval, an end announced once it has stayed away,
and the deliverer sending to local receivers (an HTTP server standing in for Slack and the
webhook, aiosmtpd for email) with retries of its own. The cross-process proof is
``test_notify_processes``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from conftest import make_settings
from sqlalchemy import Engine, select

from webapp.config import NOTIFY_KINDS, ConfigError, Notify, Settings, notify_settings
from webapp.models import NotifyAlert, NotifyDelivery
from webapp.read.notices import Notice, notices
from webapp.read.overview import alerts_now, overview
from webapp.worker.notify import Deliverer, Notifier, send_test, signature, verify
from webapp.worker.notify.channels import slack_payload

A = NotifyAlert.__table__
D = NotifyDelivery.__table__
SECRET = "whsec-notify-test-0123456789"
T0 = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)


class Clock:
    def __init__(self, at: datetime) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return self.at

    def advance(self, seconds: float) -> None:
        self.at += timedelta(seconds=seconds)


def notify_env(receivers: dict[str, Any], **extra: str) -> dict[str, str]:
    return {"NOTIFY_SLACK_WEBHOOK_URL": receivers["slack"].url,
            "NOTIFY_WEBHOOK_URL": receivers["webhook"].url, "NOTIFY_WEBHOOK_SECRET": SECRET,
            "NOTIFY_SMTP_URL": receivers["email"].url, "NOTIFY_EMAIL_FROM": "outbox@example.com",
            "NOTIFY_EMAIL_TO": "oncall@example.com, finance@example.com",
            "NOTIFY_DASHBOARD_URL": "https://billing.example.com", "NOTIFY_TIMEOUT_SECONDS": "5",
            **extra}


def settings_for(engine: Engine, receivers: dict[str, Any], **extra: str) -> Settings:
    return make_settings(engine.url.render_as_string(hide_password=False),
                         notify=notify_settings(notify_env(receivers, **extra)))


HOLDING = Notice("holding", "critical", "Sending is held back",
                 "Stripe is failing: connection refused.", 12, "/events?due=1")


def queued(engine: Engine) -> list[tuple[str, str, str]]:
    with engine.connect() as conn:
        return [(r.kind, r.event, r.channel) for r in
                conn.execute(select(D.c.kind, D.c.event, D.c.channel).order_by(D.c.id))]


def test_a_start_is_queued_once_per_channel_however_many_notifiers_see_it(
        engine: Engine, receivers: dict[str, Any]) -> None:
    settings = settings_for(engine, receivers)
    clock = Clock(T0)
    a, b = Notifier(engine, settings, clock=clock), Notifier(engine, settings, clock=clock)
    first = a.apply({"holding": HOLDING}, now=clock())
    assert first.fired == ["holding"] and first.queued == 3
    # The other process read the rows before the first one wrote: its update finds the
    # version moved and queues nothing.
    stale = b.apply({"holding": HOLDING}, now=clock())
    assert stale.fired == [] and stale.queued == 0
    clock.advance(60)
    assert a.apply({"holding": HOLDING}, now=clock()).queued == 0
    assert queued(engine) == [("holding", "firing", "slack"), ("holding", "firing", "webhook"),
                              ("holding", "firing", "email")]


def test_two_notifiers_reading_the_same_version_write_one_change(
        engine: Engine, receivers: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The race itself: ``a`` reads the rows, ``b`` reads and writes the change, then ``a``
    writes with the version it read: its update matches no row, and it queues nothing."""
    from webapp.worker.notify import notifier as module

    settings = settings_for(engine, receivers)
    a, b = Notifier(engine, settings), Notifier(engine, settings)
    a.apply({}, now=T0)
    b.apply({}, now=T0)  # both have made the rows
    original = module.reading
    interleaved: list[Any] = []

    @contextmanager
    def reading_then_the_other_writes(eng: Engine) -> Iterator[Any]:
        with original(eng) as conn:
            yield conn
        if not interleaved:
            interleaved.append(None)  # b's own reads pass straight through
            interleaved[0] = b.apply({"holding": HOLDING}, now=T0)

    monkeypatch.setattr(module, "reading", reading_then_the_other_writes)
    late = a.apply({"holding": HOLDING}, now=T0)
    assert interleaved[0].fired == ["holding"] and interleaved[0].queued == 3
    assert late.fired == [] and late.queued == 0
    assert len(queued(engine)) == 3


def test_a_reminder_at_most_every_remind_seconds_then_one_end(
        engine: Engine, receivers: dict[str, Any]) -> None:
    settings = settings_for(engine, receivers, NOTIFY_REMIND_SECONDS="3600",
                            NOTIFY_RESOLVE_SECONDS="120")
    clock = Clock(T0)
    n = Notifier(engine, settings, clock=clock)
    n.apply({"holding": HOLDING}, now=clock())
    for _ in range(59):  # every minute for an hour less a minute: nothing new
        clock.advance(60)
        assert n.apply({"holding": HOLDING}, now=clock()).queued == 0
    clock.advance(60)
    assert n.apply({"holding": HOLDING}, now=clock()).reminded == ["holding"]
    clock.advance(60)
    assert n.apply({"holding": HOLDING}, now=clock()).queued == 0
    # Gone for 60 s, then back: a flicker, nothing sent.
    assert n.apply({}, now=clock()).queued == 0
    clock.advance(60)
    assert n.apply({}, now=clock()).queued == 0
    assert n.apply({"holding": HOLDING}, now=clock()).queued == 0
    # Gone for good: ended once it has stayed away 120 s.
    clock.advance(1)
    n.apply({}, now=clock())
    clock.advance(119)
    assert n.apply({}, now=clock()).queued == 0
    clock.advance(1)
    assert n.apply({}, now=clock()).resolved == ["holding"]
    clock.advance(3600)
    assert n.apply({}, now=clock()).queued == 0
    assert [e for _, e, c in queued(engine) if c == "webhook"] == ["firing", "reminder",
                                                                  "resolved"]


def test_messages_reach_every_channel_signed_and_readable(
        engine: Engine, receivers: dict[str, Any]) -> None:
    settings = settings_for(engine, receivers, NOTIFY_RESOLVE_SECONDS="0")
    clock = Clock(T0)
    Notifier(engine, settings, clock=clock).apply({"holding": HOLDING}, now=clock())
    deliverer = Deliverer(engine, settings.notify, clock=clock)
    assert deliverer.run_once().sent == 3
    clock.advance(300)
    Notifier(engine, settings, clock=clock).apply({}, now=clock())
    assert deliverer.run_once().sent == 3

    hook = receivers["webhook"].received
    assert len(hook) == 2
    fired, ended = (r.json() for r in hook)
    assert set(fired) == {"id", "kind", "state", "severity", "title", "text", "count", "url",
                          "started_at", "at"}
    assert (fired["kind"], fired["state"], fired["severity"], fired["count"]) == (
        "holding", "firing", "critical", 12)
    assert fired["url"] == "https://billing.example.com/events?due=1"
    assert (ended["state"], ended["started_at"]) == ("resolved", fired["started_at"])
    assert "lasted 5 min" in ended["text"] and ended["id"] != fired["id"]
    # The signature verifies with the documented recipe; a changed body or secret does not.
    for r in hook:
        header = r.headers["Billing-Outbox-Signature"]
        t = int(header.split(",")[0].removeprefix("t="))
        assert header == signature(SECRET, r.body, timestamp=t)
        assert verify(SECRET, header, r.body)
        assert not verify(SECRET, header, r.body.replace(b"holding", b"h0lding"))
        assert not verify(SECRET + "x", header, r.body)
        assert not verify(SECRET, header, r.body, now=t + 301)

    slack = receivers["slack"].bodies()
    assert [b["blocks"][0]["type"] for b in slack] == ["header", "header"]
    assert slack[0]["blocks"][0]["text"]["text"] == "🔴 Sending is held back"
    assert slack[1]["blocks"][0]["text"]["text"] == "✅ Resolved: Sending is held back"
    button = slack[0]["blocks"][-1]["elements"][0]
    assert button["url"] == "https://billing.example.com/events?due=1"
    assert fired["id"] in slack[0]["blocks"][2]["elements"][0]["text"]

    mails = receivers["email"].messages
    assert len(mails) == 2
    assert mails[0]["Subject"] == "[billing-outbox] 🔴 Sending is held back"
    assert mails[0]["To"] == "oncall@example.com, finance@example.com"
    plain = mails[0].get_body(("plain",)).get_content()
    rich = mails[0].get_body(("html",)).get_content()
    assert "Stripe is failing: connection refused." in plain
    assert "https://billing.example.com/events?due=1" in plain
    assert '<a href="https://billing.example.com/events?due=1">' in rich


def test_slack_and_email_escape_what_the_alert_says() -> None:
    msg = {"id": "ntf_1", "kind": "unmapped_waiting", "state": "firing", "severity": "warning",
           "title": "Tenant <script>&co has no Stripe customer", "text": "a <b> & c",
           "count": 1, "url": "https://x.example/mappings?tenant=%3Cscript%3E",
           "started_at": T0.isoformat(), "at": T0.isoformat()}
    payload = slack_payload(msg)
    # plain_text is shown as it is; mrkdwn (and the notification's text) reads &, <, > as
    # markup, so there they are escaped.
    assert payload["blocks"][0]["text"] == {"type": "plain_text", "emoji": True,
                                            "text": "🟠 Tenant <script>&co has no Stripe "
                                                    "customer"}
    assert payload["text"] == "🟠 Tenant &lt;script&gt;&amp;co has no Stripe customer"
    assert payload["blocks"][1]["text"]["text"] == "a &lt;b&gt; &amp; c"
    from webapp.worker.notify.channels import email_message

    mail = email_message(msg, Notify(email_from="a@example.com", email_to=("b@example.com",)))
    rich = mail.get_body(("html",)).get_content()
    assert "<script>" not in rich and "&lt;script&gt;" in rich


def test_a_receiver_that_fails_gets_the_messages_later_in_order(
        engine: Engine, receivers: dict[str, Any]) -> None:
    settings = settings_for(engine, receivers, NOTIFY_RESOLVE_SECONDS="0")
    clock = Clock(T0)
    notifier = Notifier(engine, settings, clock=clock)
    deliverer = Deliverer(engine, settings.notify, clock=clock)
    hook = receivers["webhook"]
    hook.status = 500
    notifier.apply({"holding": HOLDING}, now=clock())
    first = deliverer.run_once()
    assert (first.sent, first.failed) == (2, 1)  # Slack and email took theirs
    assert "HTTP 500" in first.errors["webhook"]
    clock.advance(10)
    notifier.apply({}, now=clock())  # it ended meanwhile: queued behind the failed start
    assert deliverer.run_once().sent == 2  # Slack and email; the webhook waits its backoff
    assert len(hook.refused) == 1
    # The failure shows on the Overview, and says sending to Stripe is not affected.
    ov = overview(engine, now=clock(), notify_channels=settings.notify.channels)
    failing = [a for a in ov.alerts if a.kind == "notify_failing"]
    assert [a.title for a in failing] == ["Alerts are not reaching the webhook"]
    assert "HTTP 500" in failing[0].detail and "trying again in 30 s" in failing[0].detail
    hook.status = 200
    clock.advance(30)
    assert deliverer.run_once().sent == 2
    assert [b["state"] for b in hook.bodies()] == ["firing", "resolved"]
    with engine.connect() as conn:
        tries = conn.execute(select(D.c.attempts).where(D.c.channel == "webhook")
                             .order_by(D.c.id)).scalars().all()
    assert tries == [2, 1]
    ov = overview(engine, now=clock(), notify_channels=settings.notify.channels)
    assert not [a for a in ov.alerts if a.kind == "notify_failing"]


def test_a_message_is_given_up_after_a_day(engine: Engine, receivers: dict[str, Any]) -> None:
    settings = settings_for(engine, receivers)
    clock = Clock(T0)
    receivers["slack"].status = 404
    Notifier(engine, settings, clock=clock).apply({"holding": HOLDING}, now=clock())
    deliverer = Deliverer(engine, settings.notify, clock=clock)
    for _ in range(40):
        deliverer.run_once()
        clock.advance(3600)
    with engine.connect() as conn:
        status, tries, error = conn.execute(select(D.c.status, D.c.attempts, D.c.last_error)
                                            .where(D.c.channel == "slack")).one()
    assert status == "failed" and 20 <= tries <= 26
    assert error.startswith("Slack answered HTTP 404")
    assert receivers["slack"].url not in error  # the URL is Slack's secret


def test_kinds_go_only_where_they_are_asked_for(engine: Engine,
                                                receivers: dict[str, Any]) -> None:
    settings = settings_for(engine, receivers, NOTIFY_EMAIL_KINDS="invoice_risk,late_usage")
    Notifier(engine, settings).apply({"holding": HOLDING}, now=T0)
    assert [c for *_, c in queued(engine)] == ["slack", "webhook"]


def test_a_burst_of_dead_letters_is_one_message(engine: Engine, seed: Any,
                                                receivers: dict[str, Any]) -> None:
    settings = settings_for(engine, receivers)
    clock = Clock(datetime.now().astimezone())
    notifier = Notifier(engine, settings, clock=clock)
    seed.events(20, status="dead")
    notifier.run_once()
    seed.events(30, status="dead")
    clock.advance(30)
    notifier.run_once()
    dead = [(k, e) for k, e, c in queued(engine) if c == "webhook" and k == "dead_letters"]
    assert dead == [("dead_letters", "firing")]
    Deliverer(engine, settings.notify, clock=clock).run_once()
    [body] = [b for b in receivers["webhook"].bodies() if b["kind"] == "dead_letters"]
    assert (body["title"], body["count"]) == ("20 dead letters", 20)
    assert body["url"] == "https://billing.example.com/events?status=dead"
    with engine.connect() as conn:  # the state keeps up with the count, without a message
        assert conn.execute(select(A.c.count).where(A.c.kind == "dead_letters")).scalar() == 50


def test_every_kind_sent_to_people_comes_from_an_alert_of_the_overview(
        engine: Engine, seed: Any) -> None:
    """The kinds are the Overview's alerts' own: a tenant's events waiting, dead letters and
    rejections read from a real database become notices with the rows' count and page."""
    seed.tenant("unmapped", None)
    seed.events(3, status="pending", tenant_id="unmapped", stripe_customer_id=None)
    seed.events(2, status="rejected")
    now = datetime.now().astimezone()
    with engine.connect() as conn:
        found = notices(alerts_now(conn, now=now, api_key_here=True))
    assert set(found) <= set(NOTIFY_KINDS)
    assert found["unmapped_waiting"].count == 3
    assert found["unmapped_waiting"].path == ("/events?tenant=unmapped&status=pending"
                                              "&status=retrying")
    assert (found["rejected"].count, found["rejected"].path) == (2, "/events?status=rejected")


def test_the_test_message(engine: Engine, receivers: dict[str, Any]) -> None:
    settings = settings_for(engine, receivers)
    ok = send_test(engine, settings.notify, "webhook", by="admin@example.com")
    assert ok.ok and ok.detail == "Sent to the webhook."
    [body] = receivers["webhook"].bodies()
    assert body["kind"] == "test" and "admin@example.com" in body["text"]
    receivers["slack"].status = 403
    bad = send_test(engine, settings.notify, "slack", by="admin@example.com")
    assert not bad.ok and bad.detail.startswith("Slack answered HTTP 403")
    off = send_test(engine, Notify(), "email", by="x")
    assert not off.ok and "NOTIFY_SMTP_URL is not set" in off.detail
    with engine.connect() as conn:
        rows = conn.execute(select(D.c.channel, D.c.event, D.c.status).order_by(D.c.id)).all()
    assert [tuple(r) for r in rows] == [("webhook", "test", "sent"), ("slack", "test", "failed")]


@pytest.mark.parametrize(("env", "message"), [
    ({"NOTIFY_WEBHOOK_URL": "https://x.example/h"}, "NOTIFY_WEBHOOK_SECRET must be set"),
    ({"NOTIFY_WEBHOOK_URL": "https://x.example/h", "NOTIFY_WEBHOOK_SECRET": "short"},
     "at least 16"),
    ({"NOTIFY_SLACK_WEBHOOK_URL": "hooks.slack.com/x"}, "NOTIFY_SLACK_WEBHOOK_URL must be"),
    ({"NOTIFY_SMTP_URL": "mail.example.com:25"}, "NOTIFY_SMTP_URL must be smtp://"),
    ({"NOTIFY_SMTP_URL": "smtp://mail.example.com:25"}, "needs NOTIFY_EMAIL_FROM"),
    ({"NOTIFY_SMTP_URL": "smtp://mail.example.com:x", "NOTIFY_EMAIL_FROM": "a@b.example",
      "NOTIFY_EMAIL_TO": "c@d.example"}, "port is not a number"),
    ({"NOTIFY_EMAIL_TO": "a@b.example, nobody"}, "'nobody' is not an email address"),
    ({"NOTIFY_SLACK_KINDS": "holding,everything"}, "unknown kind(s) everything"),
    ({"NOTIFY_REMIND_SECONDS": "10"}, "NOTIFY_REMIND_SECONDS"),
])
def test_bad_settings_are_refused_naming_the_variable(env: dict[str, str],
                                                      message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Settings.from_env(env)


def test_settings_read_as_documented() -> None:
    s = Settings.from_env({"NOTIFY_SMTP_URL": "smtps://bot%40x:p%3Ass@mail.example.com",
                           "NOTIFY_EMAIL_FROM": "outbox@example.com",
                           "NOTIFY_EMAIL_TO": "a@example.com,b@example.com",
                           "NOTIFY_REMIND_SECONDS": "2h", "HOST": "0.0.0.0", "PORT": "9000"})
    n = s.notify
    assert n.channels == ("email",)
    assert n.smtp is not None and (n.smtp.host, n.smtp.port, n.smtp.tls) == (
        "mail.example.com", 465, True)
    assert (n.smtp.user, n.smtp.password) == ("bot@x", "p:ss")
    assert "p:ss" not in repr(s)
    assert n.email_to == ("a@example.com", "b@example.com")
    assert n.remind_seconds == 7200 and n.dashboard_url == "http://0.0.0.0:9000"
    assert Settings.from_env({}).notify.channels == ()


@pytest.mark.slow  # seconds of wall time: out of `make check`
def test_a_slow_receiver_holds_a_pass_no_longer_than_one_timeout(
        engine: Engine, receivers: dict[str, Any]) -> None:
    """The deliverer shares the worker's maintenance thread with the rescuer: with ten
    messages queued and a receiver taking 0.4 s each, a pass ends once a timeout (1 s) has
    gone by, and the next pass goes on with the rest, in order."""
    notify = notify_settings({"NOTIFY_WEBHOOK_URL": receivers["webhook"].url,
                              "NOTIFY_WEBHOOK_SECRET": SECRET, "NOTIFY_TIMEOUT_SECONDS": "1"})
    settings = make_settings(engine.url.render_as_string(hide_password=False), notify=notify)
    Notifier(engine, settings).apply({k: Notice(k, "warning", k, k, 1, "/")
                                      for k in NOTIFY_KINDS}, now=datetime.now(UTC))
    receivers["webhook"].delay = 0.4
    deliverer = Deliverer(engine, notify)
    passes = []
    while len(receivers["webhook"].received) < len(NOTIFY_KINDS):
        done = deliverer.run_once()
        assert not done.errors, done.errors
        passes.append(done.sent)
        assert len(passes) < 10
    assert all(1 <= n <= 4 for n in passes), passes
    assert [b["kind"] for b in receivers["webhook"].bodies()] == list(NOTIFY_KINDS)


def test_messages_are_kept_thirty_days(engine: Engine, receivers: dict[str, Any]) -> None:
    """Sent, given-up and stranded messages (queued for a channel since removed) older than
    30 days go; younger ones stay."""
    settings = settings_for(engine, receivers)
    clock = Clock(T0)
    Notifier(engine, settings, clock=clock).apply({"holding": HOLDING}, now=clock())
    Deliverer(engine, settings.notify, clock=clock).run_once()
    with engine.begin() as conn:
        conn.execute(D.insert().values(message_id="ntf_old", kind="holding", event="firing",
                                       channel="pager", status="pending", body="{}",
                                       created_at=T0, next_attempt_at=T0, attempts=0))
    clock.advance(29 * 86400)
    later = Deliverer(engine, settings.notify, clock=clock)
    later.run_once()
    assert len(queued(engine)) == 4
    clock.advance(2 * 86400)
    Deliverer(engine, settings.notify, clock=clock).run_once()
    assert queued(engine) == []
