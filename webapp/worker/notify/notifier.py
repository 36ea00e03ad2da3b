"""The notifier (a maintenance service, ``notifier``): looks at the Overview's alerts every
``NOTIFY_CHECK_SECONDS`` and announces each change of an alert kind once per channel.

Each kind's state is a row of ``notify_alerts``. A change — it started, it still lasts after
``NOTIFY_REMIND_SECONDS``, it ended — is written with the row's ``version`` compared and raised,
in the transaction that queues its messages (``notify_deliveries``). However many processes
look at the same alerts, one update counts and one set of messages is queued; a process that
restarts finds the state where it was. A lease lets one process at a time do the looking
(the others skip it), so many workers do not read the alerts many times over.

An alert must stay away for ``NOTIFY_RESOLVE_SECONDS`` before it is announced as ended, so one
that flickers (a probe that fails again at once) does not page twice. Sending is the
deliverer's (:mod:`.deliveries`): nothing here waits on a receiver.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy import update as sa_update

from ...config import NOTIFY_KINDS, Notify, Settings
from ...db import reading
from ...models import fit, utcnow
from ...outbox import stripe_runs
from ...outbox.sql import NOTIFY_ALERTS as A
from ...outbox.sql import NOTIFY_DELIVERIES as D
from ...outbox.sql import as_utc, insert_for
from ...read.notices import Notice, notices
from ...read.overview import alerts_now
from ...status import DELIVERY_PENDING

log = logging.getLogger(__name__)

#: The lease's name in ``stripe_sync_state``.
LEASE = "notify"


@dataclass
class NotifySummary:
    """What one look did: the kinds that started, were repeated, ended."""

    fired: list[str] = field(default_factory=list)
    reminded: list[str] = field(default_factory=list)
    resolved: list[str] = field(default_factory=list)
    queued: int = 0
    skipped: bool = False


def new_message_id() -> str:
    return f"ntf_{uuid.uuid4().hex}"


def message(*, message_id: str, kind: str, state: str, severity: str, title: str, text: str,
            count: int, path: str, started_at: datetime | None, at: datetime,
            settings: Notify) -> dict[str, Any]:
    """A message as the webhook receives it (Slack's and the email's are made from it)."""
    return {"id": message_id, "kind": kind, "state": state, "severity": severity,
            "title": title, "text": text, "count": count,
            "url": settings.dashboard_url + path,
            "started_at": started_at.isoformat() if started_at else None,
            "at": at.isoformat()}


def queue(conn: Any, msg: Mapping[str, Any], *, event: str, channels: tuple[str, ...],
          now: datetime) -> int:
    """Queue ``msg`` once per channel; how many were queued."""
    rows = [{"message_id": msg["id"], "kind": msg["kind"], "event": event, "channel": c,
             "status": DELIVERY_PENDING, "body": json.dumps(msg), "created_at": now,
             "next_attempt_at": now, "attempts": 0} for c in channels]
    if rows:
        conn.execute(insert_for(conn, D), rows)
    return len(rows)


def _span(seconds: float) -> str:
    seconds = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


class Notifier:
    """Turns the alerts' changes into queued messages. A maintenance service."""

    name = "notifier"

    def __init__(self, engine: Engine, settings: Settings, *,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.engine = engine
        self.settings = settings
        self.notify = settings.notify
        self.clock = clock
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{id(self)}"
        self._rows_made = False

    def run_once(self) -> NotifySummary:
        now = self.clock()
        if not stripe_runs.take_lease(self.engine, LEASE, owner=self.owner, now=now,
                                      seconds=max(60.0, 3 * self.notify.check_seconds)):
            return NotifySummary(skipped=True)
        with reading(self.engine) as conn:
            alerts = alerts_now(conn, now=now,
                                api_key_here=self.settings.stripe_api_key is not None,
                                invoice_risk_seconds=self.settings.invoice_risk_seconds,
                                notify_channels=self.notify.channels)
        return self.apply(notices(alerts), now=now)

    def _channels(self, kind: str) -> tuple[str, ...]:
        return tuple(c for c in self.notify.channels if kind in self.notify.kinds_for(c))

    def apply(self, current: Mapping[str, Notice], *, now: datetime) -> NotifySummary:
        """Compare the notices on now with each kind's recorded state, and write each change
        (with its messages) if no one else wrote it first."""
        summary = NotifySummary()
        if not self._rows_made:
            with self.engine.begin() as conn:
                for kind in NOTIFY_KINDS:
                    conn.execute(insert_for(conn, A).values(kind=kind, state="ok", version=0)
                                 .on_conflict_do_nothing(index_elements=[A.c.kind]))
            self._rows_made = True
        with reading(self.engine) as conn:
            rows = {r.kind: r for r in conn.execute(select(A))}
        remind = timedelta(seconds=self.notify.remind_seconds)
        settle = timedelta(seconds=self.notify.resolve_seconds)
        for kind in NOTIFY_KINDS:
            row, notice = rows.get(kind), current.get(kind)
            if row is None:
                continue
            firing = row.state == "firing"
            last_sent = as_utc(row.last_sent_at)
            started = as_utc(row.started_at)
            event: str | None = None
            values: dict[str, Any] = {}
            if notice is not None:
                shown = {"severity": notice.severity, "title": fit(A.c.title, notice.title),
                         "text": notice.text, "count": notice.count,
                         "path": fit(A.c.path, notice.path)}
                if not firing:
                    event, started = "firing", now
                    values = {**shown, "state": "firing", "started_at": now,
                              "last_sent_at": now, "clear_since": None}
                elif last_sent is None or now - last_sent >= remind:
                    event = "reminder"
                    values = {**shown, "last_sent_at": now, "clear_since": None}
                elif row.clear_since is not None or any(
                        row._mapping[k] != v for k, v in shown.items()):
                    values = {**shown, "clear_since": None}
            elif firing:
                cleared = as_utc(row.clear_since) or now
                if now - cleared >= settle:
                    event = "resolved"
                    values = {"state": "ok", "clear_since": None, "last_sent_at": now}
                elif row.clear_since is None:
                    values = {"clear_since": now}
            if not values:
                continue
            with self.engine.begin() as conn:
                done = conn.execute(sa_update(A).where(A.c.kind == kind,
                                                       A.c.version == row.version)
                                    .values(**values, version=A.c.version + 1, updated_at=now))
                if done.rowcount != 1:
                    continue  # another process wrote this change (and queued its messages)
                if event is None:
                    continue
                summary.queued += queue(conn, self._message(kind, event, row, notice, started,
                                                            now), event=event,
                                        channels=self._channels(kind), now=now)
            {"firing": summary.fired, "reminder": summary.reminded,
             "resolved": summary.resolved}[event].append(kind)
            log.info("alert %s %s", kind, {"firing": "started", "reminder": "still on",
                                           "resolved": "ended"}[event])
        return summary

    def _message(self, kind: str, event: str, row: Any, notice: Notice | None,
                 started: datetime | None, now: datetime) -> dict[str, Any]:
        if event == "resolved" or notice is None:
            lasted = f" It lasted {_span((now - started).total_seconds())}." if started else ""
            return message(message_id=new_message_id(), kind=kind, state="resolved",
                           severity=row.severity or "info", title=row.title or kind,
                           text=f"This has ended.{lasted}", count=0, path=row.path or "/",
                           started_at=started, at=now, settings=self.notify)
        text = notice.text
        if event == "reminder" and started is not None:
            text = f"Still going on after {_span((now - started).total_seconds())}. {text}"
        return message(message_id=new_message_id(), kind=kind, state="firing",
                       severity=notice.severity, title=notice.title, text=text,
                       count=notice.count, path=notice.path, started_at=started, at=now,
                       settings=self.notify)
