"""Notifications across real ``billing-outbox worker`` processes on PostgreSQL, against local
receivers (an HTTP server for Slack and the webhook, aiosmtpd for email):

- two workers and a Stripe outage: exactly one "firing" and one "resolved" message per
  channel, though both workers watch it and one is restarted while it lasts;
- receivers that fail (500) or hang: the messages arrive once they answer again, while the
  events keep reaching Stripe as fast as without them.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import cli, start_worker, stop_process, wait_for, worker_env
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from webapp.models import OutboxEvent, utcnow
from webapp.outbox import enqueue_usage
from webapp.outbox.operations import set_tenant
from webapp.worker.notify import verify

pytestmark = pytest.mark.slow

T = OutboxEvent.__table__
SECRET = "notify-processes-secret-0123"
TENANTS = 5


def env_for(pg_url: str, fake: Any, receivers: dict[str, Any], **extra: str) -> dict[str, str]:
    return worker_env(
        pg_url, fake.base_url, fake.meter_events_url,
        NOTIFY_SLACK_WEBHOOK_URL=receivers["slack"].url,
        NOTIFY_WEBHOOK_URL=receivers["webhook"].url, NOTIFY_WEBHOOK_SECRET=SECRET,
        NOTIFY_SMTP_URL=receivers["email"].url, NOTIFY_EMAIL_FROM="outbox@example.com",
        NOTIFY_EMAIL_TO="oncall@example.com", NOTIFY_CHECK_SECONDS="1",
        NOTIFY_RESOLVE_SECONDS="3", NOTIFY_RETRY_SECONDS="1", NOTIFY_TIMEOUT_SECONDS="3",
        OUTBOX_MAX_ATTEMPTS="60", **extra)


class Producer:
    """Enqueues one event every ``every`` seconds in a thread, as an application would."""

    def __init__(self, engine: Engine, every: float = 0.1) -> None:
        self.engine, self.every = engine, every
        self.stopping = threading.Event()
        self.enqueued = 0
        now = utcnow()
        for t in range(TENANTS):
            set_tenant(engine, f"t{t}", stripe_customer_id=f"cus_t{t}", name=None, now=now)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.is_set():
            with Session(self.engine) as s, s.begin():
                enqueue_usage(s, tenant_id=f"t{self.enqueued % TENANTS}", quantity=1,
                              idempotency_key=f"ev:{self.enqueued}")
            self.enqueued += 1
            self.stopping.wait(self.every)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=10)


def sent(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).where(T.c.status == "sent")).scalar_one())


def of_kind(receivers: dict[str, Any], kind: str) -> dict[str, list[str]]:
    """Per channel, the states of the messages of ``kind`` it received, in order."""
    out = {c: [b["state"] for b in receivers[c].bodies() if b["kind"] == kind]
           for c in ("webhook",)}
    out["slack"] = [("resolved" if b["blocks"][0]["text"]["text"].startswith("✅")
                     else "firing") for b in receivers["slack"].bodies()
                    if f"kind {kind} " in b["blocks"][2]["elements"][0]["text"]]
    out["email"] = [("resolved" if "Resolved:" in str(m["Subject"]) else "firing")
                    for m in receivers["email"].messages
                    if f"kind {kind} " in m.get_body(("plain",)).get_content()]
    return out


def test_an_outage_seen_by_two_workers_is_one_message_each_way_per_channel(
        pg_url: str, pg: Engine, fake_stripe: Any, receivers: dict[str, Any],
        tmp_path: Path) -> None:
    env = env_for(pg_url, fake_stripe, receivers)
    producer = Producer(pg)
    logs = [tmp_path / "w0.log", tmp_path / "w1.log"]
    workers = [start_worker(env, logs[0]), start_worker(env, logs[1])]
    try:
        wait_for(lambda: sent(pg) >= 10, 60, message="events flowing")
        fake_stripe.set_outage(True)
        wait_for(lambda: of_kind(receivers, "holding")["webhook"] == ["firing"], 60,
                 message="the outage announced")
        # One worker is restarted while the alert lasts; both keep looking at it.
        assert stop_process(workers[0]) == 0
        workers[0] = start_worker(env, logs[0])
        time.sleep(6)  # six looks by the new worker, as many by the other
        assert of_kind(receivers, "holding") == {"webhook": ["firing"], "slack": ["firing"],
                                                 "email": ["firing"]}
        fake_stripe.set_outage(False)
        wait_for(lambda: all(len(v) == 2 for v in of_kind(receivers, "holding").values()), 90,
                 message="the end announced on every channel")
        before = sent(pg)
        wait_for(lambda: sent(pg) >= before + 20, 60, message="events flowing again")
        time.sleep(4)  # more looks: nothing more is sent
    finally:
        producer.stop()
        for w in workers:
            stop_process(w)
    assert of_kind(receivers, "holding") == {"webhook": ["firing", "resolved"],
                                             "slack": ["firing", "resolved"],
                                             "email": ["firing", "resolved"]}
    fired, ended = [b for b in receivers["webhook"].bodies() if b["kind"] == "holding"]
    assert fired["started_at"] == ended["started_at"] and fired["id"] != ended["id"]
    for r in receivers["webhook"].received:
        assert verify(SECRET, r.headers["Billing-Outbox-Signature"], r.body)
    # Nothing of any kind was sent twice.
    ids = [b["id"] for b in receivers["webhook"].bodies()]
    assert len(ids) == len(set(ids))
    states = [(b["kind"], b["state"]) for b in receivers["webhook"].bodies()]
    assert len(states) == len(set(states)), states


def test_failing_receivers_get_their_messages_later_and_never_slow_sending(
        pg_url: str, pg: Engine, fake_stripe: Any, receivers: dict[str, Any],
        tmp_path: Path) -> None:
    receivers["webhook"].status = 500
    receivers["slack"].delay = 2.5  # answers, but only after most of its timeout
    env = env_for(pg_url, fake_stripe, receivers)
    worker = start_worker(env, tmp_path / "w.log")
    producer = Producer(pg, every=0.02)
    try:
        wait_for(lambda: sent(pg) >= 10, 60, message="events flowing")
        # A burst of 50 dead events: one message.
        from support.seed import Seed

        Seed(pg).events(50, status="dead", together=True)   # one look sees all or none
        wait_for(lambda: len(receivers["webhook"].refused) >= 3, 60,
                 message="the webhook refusing, retried")
        # While the webhook refuses and Slack hangs, events go out as they come: each
        # within a second of its enqueue (the drain never waits for a receiver).
        start = sent(pg)
        time.sleep(5)
        with pg.connect() as conn:
            lags = conn.execute(select(func.extract("epoch", T.c.sent_at - T.c.created_at))
                                .where(T.c.status == "sent")
                                .order_by(T.c.sent_at.desc()).limit(100)).scalars().all()
        assert sent(pg) - start >= 100
        lags = sorted(float(x) for x in lags)
        assert lags[len(lags) // 2] < 1.0, lags
        receivers["webhook"].status = 200
        wait_for(lambda: [b["kind"] for b in receivers["webhook"].bodies()
                          ].count("dead_letters") == 1, 60, message="the late delivery")
    finally:
        producer.stop()
        stop_process(worker)
    dead = [b for b in receivers["webhook"].bodies() if b["kind"] == "dead_letters"]
    assert [(b["state"], b["count"]) for b in dead] == [("firing", 50)]
    assert len(of_kind(receivers, "dead_letters")["slack"]) == 1
    # The page and `notify test` tell the same story as the receivers.
    result = cli("notify", "test", "--channel", "webhook", env=env)
    assert result.returncode == 0, result.stderr
    assert "webhook: sent" in result.stdout
    receivers["webhook"].status = 503
    result = cli("notify", "test", env=env)
    assert result.returncode == 1
    assert "webhook: FAILED" in result.stderr and "HTTP 503" in result.stderr
    assert "did not get through on webhook" in result.stderr
    assert "slack: sent" in result.stdout and "email: sent" in result.stdout
