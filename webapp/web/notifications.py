"""Notifications: where alerts are sent (Slack, the signed webhook, email), which kinds go
where, each alert kind's state and the latest messages with how their delivery went; and a
"send a test" button per channel (admins; audited). Every signed-in person may look: the
channels' secrets are never shown."""

from __future__ import annotations

from flask import Blueprint, flash, redirect, url_for
from flask.typing import ResponseReturnValue

from ..audit import write_audit
from ..config import NOTIFY_CHANNELS, NOTIFY_KINDS
from ..read.notifications import STATUSES, notifications_page
from ..worker import NOTIFY_SETTING as SETTING
from ..worker import send_test
from .common import now, render, svc
from .params import Text, accepts
from .security import current_user, require_role

bp = Blueprint("notifications", __name__)

CHANNEL = Text("channel", 10, choices=("", *NOTIFY_CHANNELS))
STATUS = Text("status", 10, choices=("", *STATUSES))
TEST_CHANNEL = Text("channel", 10, source="form", choices=NOTIFY_CHANNELS)


@bp.get("/notifications")
@require_role("viewer")
@accepts(CHANNEL, STATUS)
def index() -> ResponseReturnValue:
    notify = svc().settings.notify
    page = notifications_page(svc().engine, notify, channel=CHANNEL.get() or None,
                              status=STATUS.get() or None)
    return render("notifications/index.html", page=page, channel=CHANNEL.get(),
                  status_filter=STATUS.get(), statuses=STATUSES, setting=SETTING,
                  kinds_total=len(NOTIFY_KINDS))


@bp.post("/notifications/test")
@require_role("admin")
@accepts(TEST_CHANNEL)
def test() -> ResponseReturnValue:
    """Send a test message on one channel now, and say how it went."""
    user = current_user()
    assert user is not None
    channel = TEST_CHANNEL.get()
    if not channel:
        flash("Choose the channel to send a test message on.", "error")
        return redirect(url_for("notifications.index"), code=303)
    result = send_test(svc().engine, svc().settings.notify, channel, by=user.email,
                       clock=svc().clock)
    with svc().engine.begin() as conn:
        write_audit(conn, actor=user.email, action="notify.test", reason_code=channel,
                    note=("sent" if result.ok else "failed: ") + ("" if result.ok
                                                                  else result.detail),
                    now=now())
    flash(f"Test message: {result.detail}", "ok" if result.ok else "error")
    return redirect(url_for("notifications.index"), code=303)
