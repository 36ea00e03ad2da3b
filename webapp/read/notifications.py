"""The notifications page: each channel as it is set up (secrets masked) with its last try,
the kinds it is sent, each alert kind's state, and the latest messages."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlparse

from sqlalchemy import Engine, func, select

from ..config import CHANNEL_NAMES, NOTIFY_CHANNELS, NOTIFY_KINDS, Notify
from ..db import reading
from ..outbox import stripe_runs
from ..outbox.sql import NOTIFY_ALERTS as A
from ..outbox.sql import NOTIFY_DELIVERIES as D
from ..outbox.sql import as_utc
from ..status import DELIVERY_ALL, DELIVERY_FAILED, DELIVERY_PENDING

#: How many of the latest messages the page lists.
LATEST = 50
#: A delivery's statuses, the page's filter choices (the name ``web.notifications`` imports).
STATUSES = DELIVERY_ALL


@dataclass(frozen=True)
class Channel:
    name: str
    title: str
    on: bool
    #: Where it goes, without its secret parts.
    where: str
    kinds: tuple[str, ...]
    last: stripe_runs.RunStatus
    pending: int
    failed: int


@dataclass(frozen=True)
class AlertState:
    kind: str
    state: str
    severity: str | None
    title: str | None
    count: int | None
    path: str | None
    started_at: datetime | None
    last_sent_at: datetime | None
    clear_since: datetime | None


@dataclass(frozen=True)
class Delivery:
    id: int
    message_id: str
    kind: str
    event: str
    channel: str
    status: str
    created_at: datetime
    sent_at: datetime | None
    next_attempt_at: datetime
    attempts: int
    last_status: int | None
    last_error: str | None


@dataclass(frozen=True)
class NotificationsPage:
    channels: list[Channel]
    alerts: list[AlertState]
    deliveries: list[Delivery]
    remind_seconds: float
    dashboard_url: str

    @property
    def remind_every(self) -> str:
        """``4 h``, ``90 min``, ``2 d``: how often a lasting alert is repeated, in words."""
        s = int(self.remind_seconds)
        for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
            if s >= size and s % size == 0:
                return f"{s // size} {unit}"
        return f"{s // 60} min" if s >= 60 else f"{s} s"


def masked_url(url: str | None, *, keep_path: bool) -> str:
    """``url`` without what makes it a secret: Slack's path is its key, a query may hold a
    token, and any user name or password is left out."""
    if not url:
        return ""
    p = urlparse(url)
    host = p.hostname or ""
    if p.port:
        host += f":{p.port}"
    return f"{p.scheme}://{host}" + (p.path if keep_path else "/…")


def _where(channel: str, notify: Notify) -> str:
    if channel == "slack":
        return masked_url(notify.slack_webhook_url, keep_path=False)
    if channel == "webhook":
        return (masked_url(notify.webhook_url, keep_path=True)
                + (" (signed)" if notify.webhook_secret else ""))
    smtp = notify.smtp
    if smtp is None:
        return ""
    how = "TLS" if smtp.tls else "STARTTLS when offered"
    who = f", as {smtp.user}" if smtp.user else ""
    return (f"{smtp.host}:{smtp.port} ({how}{who}) from {notify.email_from} to "
            + ", ".join(notify.email_to))


def notifications_page(engine: Engine, notify: Notify, *, channel: str | None = None,
                       status: str | None = None) -> NotificationsPage:
    """Everything on the page; the latest messages of ``channel`` / ``status`` when given."""
    with reading(engine) as conn:
        runs = stripe_runs.run_statuses(conn, [stripe_runs.NOTIFY[c] for c in NOTIFY_CHANNELS])
        counts = {(c, s): int(n) for c, s, n in conn.execute(
            select(D.c.channel, D.c.status, func.count())
            .where(D.c.status.in_([DELIVERY_PENDING, DELIVERY_FAILED]))
            .group_by(D.c.channel, D.c.status))}
        alerts = {r.kind: r for r in conn.execute(select(A))}
        q = select(D.c.id, D.c.message_id, D.c.kind, D.c.event, D.c.channel, D.c.status,
                   D.c.created_at, D.c.sent_at, D.c.next_attempt_at, D.c.attempts,
                   D.c.last_status, D.c.last_error)
        if channel:
            q = q.where(D.c.channel == channel)
        if status:
            q = q.where(D.c.status == status)
        rows = conn.execute(q.order_by(D.c.id.desc()).limit(LATEST)).all()
    on = set(notify.channels)
    channels = [Channel(c, CHANNEL_NAMES[c], c in on, _where(c, notify), notify.kinds_for(c),
                        runs[stripe_runs.NOTIFY[c]], counts.get((c, DELIVERY_PENDING), 0),
                        counts.get((c, DELIVERY_FAILED), 0)) for c in NOTIFY_CHANNELS]
    states = []
    for kind in NOTIFY_KINDS:
        r = alerts.get(kind)
        states.append(AlertState(kind, "ok", None, None, None, None, None, None, None)
                      if r is None else
                      AlertState(kind, r.state, r.severity, r.title, r._mapping["count"], r.path,
                                 as_utc(r.started_at), as_utc(r.last_sent_at),
                                 as_utc(r.clear_since)))
    deliveries = [Delivery(r.id, r.message_id, r.kind, r.event, r.channel, r.status,
                           as_utc(r.created_at) or r.created_at, as_utc(r.sent_at),
                           as_utc(r.next_attempt_at) or r.next_attempt_at, r.attempts,
                           r.last_status, r.last_error) for r in rows]
    return NotificationsPage(channels, states, deliveries, notify.remind_seconds,
                             notify.dashboard_url)
