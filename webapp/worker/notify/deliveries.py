"""The deliverer (a maintenance service, ``notify-delivery``): sends the queued messages, each
channel in order, with retries of its own.

A channel's oldest unsent message goes first, and while it waits for its next try the later
ones wait behind it, so a receiver never reads "resolved" before "firing". Each message is
claimed (``claimed_until``, compared and set in one UPDATE) before it is sent, so two
processes never send it at once; a process that dies while sending leaves a claim that runs
out, and the message is sent again then (a receiver that must not see it twice keeps the
message's ``id``). A failed try is retried with backoff — ``NOTIFY_RETRY_SECONDS`` (30 s)
doubling to an hour — for a day, then given up (``failed``). Each channel's last try is kept
as ``notify-<channel>`` in ``stripe_sync_state`` for the Overview. Channels are sent to side
by side, each try within ``NOTIFY_TIMEOUT_SECONDS``; this runs beside the drain, never in it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, delete, select, text
from sqlalchemy import update as sa_update

from ...config import Notify
from ...db import reading
from ...models import fit, utcnow
from ...outbox import stripe_runs
from ...outbox.sql import NOTIFY_DELIVERIES as D
from ...outbox.sql import as_utc
from ...status import DELIVERY_ALL, DELIVERY_FAILED, DELIVERY_PENDING, DELIVERY_SENT, sql_in
from .channels import NAMES, DeliveryFailed, send

log = logging.getLogger(__name__)

#: A failed message waits ``NOTIFY_RETRY_SECONDS`` (30 s), doubling up to ``MAX_BACKOFF``; it
#: is given up after ``GIVE_UP_AFTER``.
MAX_BACKOFF = timedelta(hours=1)
GIVE_UP_AFTER = timedelta(days=1)
#: At most this many messages per channel per pass.
PER_PASS = 20
#: Messages are kept this long (sent, given up, or queued for a channel since removed).
KEEP = timedelta(days=30)
#: How often kept messages are pruned.
PRUNE_EVERY = timedelta(hours=1)


#: ``ix_notify_deliveries_pending``'s predicate, as literal text.
PENDING = text(sql_in([DELIVERY_PENDING], "notify_deliveries.status", known=DELIVERY_ALL))


def run_name(channel: str) -> str:
    """The channel's row in ``stripe_sync_state``: its last try."""
    return stripe_runs.NOTIFY[channel]


def backoff(attempts: int, first: float = 30.0) -> timedelta:
    """The wait after ``attempts`` failed tries, the first one ``first`` seconds."""
    factor: int = 2 ** max(0, min(attempts - 1, 20))
    return min(MAX_BACKOFF, timedelta(seconds=first) * factor)


@dataclass
class DeliverySummary:
    sent: int = 0
    failed: int = 0
    given_up: int = 0
    errors: dict[str, str] = field(default_factory=dict)


class Deliverer:
    """Sends what the notifier queued. A maintenance service."""

    name = "notify-delivery"

    def __init__(self, engine: Engine, settings: Notify, *,
                 clock: Callable[[], datetime] = utcnow,
                 sender: Callable[..., int] = send) -> None:
        self.engine = engine
        self.settings = settings
        self.clock = clock
        self.sender = sender
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{id(self)}"
        self.claim_for = timedelta(seconds=3 * settings.timeout_seconds + 30)
        self._pruned_at: datetime | None = None

    def run_once(self) -> DeliverySummary:
        summary = DeliverySummary()
        channels = self.settings.channels
        if channels:
            with ThreadPoolExecutor(max_workers=len(channels),
                                    thread_name_prefix="notify") as pool:
                for done in pool.map(self._channel, channels):
                    summary.sent += done.sent
                    summary.failed += done.failed
                    summary.given_up += done.given_up
                    summary.errors.update(done.errors)
        self._prune()
        return summary

    def _channel(self, channel: str) -> DeliverySummary:
        summary = DeliverySummary()
        # A slow receiver must not hold the maintenance thread (the rescuer runs there too):
        # no new try starts once a try's timeout has passed since the pass began.
        stop_at = time.monotonic() + self.settings.timeout_seconds
        for _ in range(PER_PASS):
            if time.monotonic() > stop_at:
                break
            now = self.clock()
            with reading(self.engine) as conn:
                row = conn.execute(select(D.c.id, D.c.body, D.c.attempts, D.c.created_at,
                                          D.c.next_attempt_at, D.c.claimed_until)
                                   .where(D.c.channel == channel, PENDING)
                                   .order_by(D.c.id).limit(1)).first()
            if row is None or (as_utc(row.next_attempt_at) or now) > now:
                break
            claimed = as_utc(row.claimed_until)
            if claimed is not None and claimed > now:
                break  # another process is sending it
            with self.engine.begin() as conn:
                got = conn.execute(sa_update(D).where(
                    D.c.id == row.id, D.c.status == DELIVERY_PENDING,
                    D.c.claimed_until.is_(None) | (D.c.claimed_until <= now))
                    .values(claimed_until=now + self.claim_for, claimed_by=self.owner))
            if got.rowcount != 1:
                break
            try:
                status = self.sender(channel, json.loads(row.body), self.settings)
            except DeliveryFailed as exc:
                self._failed(channel, row, exc, summary)
                break
            except Exception as exc:  # a bug here must not stop the other channels
                log.exception("notify %s: sending message %s failed", channel, row.id)
                self._failed(channel, row, DeliveryFailed(f"{type(exc).__name__}: {exc}"),
                             summary)
                break
            done_at = self.clock()
            with self.engine.begin() as conn:
                conn.execute(sa_update(D).where(D.c.id == row.id, D.c.claimed_by == self.owner)
                             .values(status=DELIVERY_SENT, sent_at=done_at, last_status=status,
                                     attempts=D.c.attempts + 1, last_error=None,
                                     claimed_until=None, claimed_by=None))
            summary.sent += 1
            stripe_runs.record_run(self.engine, run_name(channel), ok=True,
                                   detail=f"Sent to {NAMES[channel]}.", now=done_at)
        return summary

    def _failed(self, channel: str, row: Any, exc: DeliveryFailed,
                summary: DeliverySummary) -> None:
        now = self.clock()
        attempts = int(row.attempts) + 1
        created = as_utc(row.created_at) or now
        give_up = now - created >= GIVE_UP_AFTER
        with self.engine.begin() as conn:
            conn.execute(sa_update(D).where(D.c.id == row.id,
                                            D.c.claimed_by == self.owner)
                         .values(status=DELIVERY_FAILED if give_up else DELIVERY_PENDING,
                                 attempts=attempts, last_error=fit(D.c.last_error, str(exc)),
                                 last_status=exc.status,
                                 next_attempt_at=now + self._backoff(attempts),
                                 claimed_until=None, claimed_by=None))
        summary.failed += 1
        summary.given_up += int(give_up)
        summary.errors[channel] = str(exc)
        wait = self._backoff(attempts).total_seconds()
        detail = (f"{exc} — given up after {attempts} tries." if give_up
                  else f"{exc} — trying again in {wait:.0f} s (try {attempts}).")
        stripe_runs.record_run(self.engine, run_name(channel), ok=False, detail=detail, now=now)
        log.warning("notify %s: %s", channel, detail)

    def _backoff(self, attempts: int) -> timedelta:
        return backoff(attempts, self.settings.retry_seconds)

    def _prune(self) -> None:
        now = self.clock()
        if self._pruned_at is not None and now - self._pruned_at < PRUNE_EVERY:
            return
        self._pruned_at = now
        with self.engine.begin() as conn:
            # Older than a day is sent or given up, or waits for a channel no longer set up.
            conn.execute(delete(D).where(D.c.created_at < now - KEEP))


@dataclass(frozen=True)
class TestResult:
    channel: str
    ok: bool
    detail: str


def send_test(engine: Engine, settings: Notify, channel: str, *, by: str,
              clock: Callable[[], datetime] = utcnow,
              sender: Callable[..., int] = send) -> TestResult:
    """Send a test message on ``channel`` now (not queued: the person asking sees how it
    went), and keep it among the channel's messages."""
    from .notifier import message, new_message_id

    now = clock()
    if channel not in settings.channels:
        return TestResult(channel, False, f"{NAMES[channel].capitalize()} is not set up "
                          f"({SETTING[channel]} is not set).")
    msg = message(message_id=new_message_id(), kind="test", state="firing", severity="info",
                  title="Test message from billing-outbox",
                  text=f"{by} asked for this test. If you can read it, alerts reach "
                       f"{NAMES[channel]}.", count=0, path="/", started_at=None, at=now,
                  settings=settings)
    status: int | None
    try:
        status = sender(channel, msg, settings)
        ok, detail, error = True, f"Sent to {NAMES[channel]}.", None
    except DeliveryFailed as exc:
        status, ok, detail, error = exc.status, False, str(exc), str(exc)
    done = clock()
    with engine.begin() as conn:
        conn.execute(D.insert().values(
            message_id=msg["id"], kind="test", event="test", channel=channel,
            status=DELIVERY_SENT if ok else DELIVERY_FAILED, body=json.dumps(msg), created_at=now,
            next_attempt_at=now, attempts=1, last_error=fit(D.c.last_error, error),
            last_status=status, sent_at=done if ok else None))
    stripe_runs.record_run(engine, run_name(channel), ok=ok, detail=detail, now=done)
    return TestResult(channel, ok, detail)


#: The variable that turns each channel on.
SETTING = {"slack": "NOTIFY_SLACK_WEBHOOK_URL", "webhook": "NOTIFY_WEBHOOK_URL",
           "email": "NOTIFY_SMTP_URL"}
