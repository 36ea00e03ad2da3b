"""The Overview page: counts, throughput, failure rate, the state of sending, the pause switch,
and the alerts that say what needs a person.

Whether sending is fine is decided in one place, :func:`webapp.read.health.health` (the status
line on every page): the Overview's Sending figure shows that decision, and its alert about
sending is derived from it, so the page can never say "fine" while the line says otherwise."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Connection, Engine, func, select

from ..config import CHANNEL_NAMES
from ..db import reading
from ..outbox import stripe_runs
from ..outbox.billing_watch import Watch, watched
from ..outbox.control import PauseState, pause_state
from ..outbox.sql import ATTEMPTS, T, status_is
from ..status import DEAD, ON_ITS_WAY, REJECTED, WAITING
from .alerts import EVENTS, Alert
from .alerts import human as _human
from .billing_alerts import billing_alerts
from .counts import (
    UnmappedTenant,
    age_limits,
    oldest_waiting,
    status_counts,
    unmapped_tenants,
)
from .health import Health, health
from .reconciliation import RunSummary, last_run
from .series import DEFAULT_RANGE, RANGES, Bucket, Range, sent_by_time_sent, sent_series
from .stripe_side import WaitingForMeter, waiting_for_meters
from .words import pre_aggregated_words

OLDEST_PENDING_ALERT = timedelta(minutes=15)


@dataclass(frozen=True)
class AlertFacts:
    """What the alerts are made of, read in one snapshot: by the Overview with its figures,
    and by the notifier alone (:func:`alert_facts`)."""

    now: datetime
    health: Health
    counts: dict[str, int]
    oldest_waiting_at: datetime | None
    dead_last_day: int
    near_limit: int
    over_limit: int
    unmapped: list[UnmappedTenant]
    waiting_for_meters: list[WaitingForMeter]
    billing: dict[str, Watch]
    invoice_risk_seconds: float
    last_reconciliation: RunSummary | None
    events_read: stripe_runs.RunStatus
    #: The last try of each notification channel that is set up.
    notify_runs: dict[str, stripe_runs.RunStatus] = field(default_factory=dict)

    @property
    def oldest_waiting_age(self) -> float | None:
        if self.oldest_waiting_at is None:
            return None
        return max(0.0, (self.now - self.oldest_waiting_at).total_seconds())


def alert_facts(conn: Connection, *, now: datetime, api_key_here: bool,
                invoice_risk_seconds: float = 3600.0,
                notify_channels: tuple[str, ...] = ()) -> AlertFacts:
    """The alerts' facts alone (what the Overview reads for them, without its charts)."""
    status = health(conn, now=now, api_key_here=api_key_here)
    counts = status_counts(conn)
    near, over = age_limits(conn, now, counts)
    events_read, notify_runs = _runs(conn, notify_channels)
    return AlertFacts(now, status, counts, oldest_waiting(conn), _dead_last_day(conn, now),
                      near, over, unmapped_tenants(conn), waiting_for_meters(conn),
                      watched(conn), invoice_risk_seconds, last_run(conn, whole=True),
                      events_read, notify_runs)


def _runs(conn: Connection, channels: tuple[str, ...]
          ) -> tuple[stripe_runs.RunStatus, dict[str, stripe_runs.RunStatus]]:
    """How the last read of Stripe's error reports went, and each channel's last try, in one
    read."""
    runs = stripe_runs.run_statuses(conn, [stripe_runs.EVENTS,
                                           *(stripe_runs.NOTIFY[c] for c in channels)])
    return runs[stripe_runs.EVENTS], {c: runs[stripe_runs.NOTIFY[c]] for c in channels}


def alerts_now(conn: Connection, *, now: datetime, api_key_here: bool,
               invoice_risk_seconds: float = 3600.0, notify_channels: tuple[str, ...] = (),
               oldest_alert: timedelta = OLDEST_PENDING_ALERT) -> list[Alert]:
    """The Overview's alerts as they stand, read without the rest of the page."""
    return _alerts(alert_facts(conn, now=now, api_key_here=api_key_here,
                               invoice_risk_seconds=invoice_risk_seconds,
                               notify_channels=notify_channels), oldest_alert)


def _dead_last_day(conn: Connection, now: datetime) -> int:
    return int(conn.execute(select(func.count()).where(
        status_is(DEAD), T.c.dead_at >= now - timedelta(days=1))).scalar_one())


@dataclass(frozen=True)
class AttemptRates:
    total: int
    failed: int
    by_outcome: dict[str, int]

    @property
    def failure_rate(self) -> float | None:
        return self.failed / self.total if self.total else None


@dataclass(frozen=True)
class Overview:
    now: datetime
    counts: dict[str, int]
    oldest_waiting_at: datetime | None
    per_minute: list[Bucket]
    per_hour: list[Bucket]
    attempts_hour: AttemptRates
    attempts_day: AttemptRates
    #: The state of sending (the status line's decision), and the pause switch the page's
    #: Pause / Resume buttons act on.
    health: Health
    switch: PauseState
    dead_last_day: int
    near_limit: int
    over_limit: int
    unmapped: list[UnmappedTenant]
    events_read: stripe_runs.RunStatus
    last_reconciliation: RunSummary | None
    waiting_for_meters: list[WaitingForMeter]
    range: Range
    chart: list[Bucket]          # sent events per bucket of ``range``
    #: The billing figures kept for the status line (``invoice_risk``, ``late``).
    billing: dict[str, Watch] = field(default_factory=dict)
    invoice_risk_seconds: float = 3600.0
    alerts: list[Alert] = field(default_factory=list)

    @property
    def oldest_waiting_age(self) -> float | None:
        if self.oldest_waiting_at is None:
            return None
        return max(0.0, (self.now - self.oldest_waiting_at).total_seconds())

    @property
    def waiting(self) -> int:
        return sum(self.counts[s] for s in ON_ITS_WAY)

    @property
    def sent_last_hour(self) -> int:
        return sum(b.count for b in self.per_minute)

    @property
    def sent_last_day(self) -> int:
        return sum(b.count for b in self.per_hour)


def overview(engine: Engine, *, now: datetime, stripe_mode: str = "test",
             oldest_alert: timedelta = OLDEST_PENDING_ALERT,
             chart_range: str = DEFAULT_RANGE, status: Health | None = None,
             invoice_risk_seconds: float = 3600.0,
             notify_channels: tuple[str, ...] = ()) -> Overview:
    """Everything on the overview page, read in one snapshot; the chart over
    ``chart_range`` (a key of ``series.RANGES``; the 1 h and 24 h charts are the figures'
    own buckets, so they cost no extra read). ``status``: the state of sending already read
    for this request (the status line's), which the page then shows as it is; when None it
    is read here, in the same snapshot (``stripe_mode`` "none": no API key here).
    ``notify_channels``: the notification channels set up (an alert when one fails)."""
    rng = RANGES[chart_range]
    with reading(engine) as conn:
        if status is None:
            status = health(conn, now=now, api_key_here=stripe_mode != "none")
        counts = status_counts(conn)
        oldest = oldest_waiting(conn)
        per_minute = sent_by_time_sent(conn, now, 60, 60)
        per_hour = sent_by_time_sent(conn, now, 3600, 24)
        chart = {"1h": per_minute, "24h": per_hour}.get(rng.key) or sent_series(conn, now, rng)
        hour = attempt_rates(conn, since=now - timedelta(hours=1))
        day = attempt_rates(conn, since=now - timedelta(days=1))
        switch = pause_state(conn)
        dead_day = _dead_last_day(conn, now)
        near, over = age_limits(conn, now, counts)
        unmapped = unmapped_tenants(conn)
        events_read, notify_runs = _runs(conn, notify_channels)
        reconciled = last_run(conn, whole=True)
        meters = waiting_for_meters(conn)
        billing = watched(conn)
    ov = Overview(now, counts, oldest, per_minute, per_hour, hour, day, status, switch,
                  dead_day, near, over, unmapped, events_read, reconciled, meters, rng, chart,
                  billing, invoice_risk_seconds)
    ov.alerts.extend(_alerts(AlertFacts(
        now, status, counts, oldest, dead_day, near, over, unmapped, meters, billing,
        invoice_risk_seconds, reconciled, events_read, notify_runs), oldest_alert))
    return ov


def attempt_rates(conn: Connection, *, since: datetime) -> AttemptRates:
    """Calls to Stripe since ``since`` by outcome (``ix_attempts_recent``)."""
    by = {o: int(n) for o, n in conn.execute(
        select(ATTEMPTS.c.outcome, func.count()).where(ATTEMPTS.c.attempted_at >= since)
        .group_by(ATTEMPTS.c.outcome))}
    total = sum(by.values())
    return AttemptRates(total, total - by.get("delivered", 0), by)


#: Unmapped tenants with an alert of their own (the rest are summed up in one).
UNMAPPED_ALERTS = 5
WAITING_STATUSES = list(ON_ITS_WAY)


#: The alert's title for each state of sending that needs a person; its level and words are
#: the state's own (``health.STATES``, ``Health.detail``). A missing meter has none of its
#: own: each meter events wait for has its alert (below), with what to do.
SENDING_ALERTS = {
    "no_api_key": "Nothing is being sent",
    "paused": "Sending is paused",
    "holding": "Sending is held back",
    "stalled": "Sending has stalled",
}


def sending_alert(h: Health) -> Alert | None:
    """The Overview's alert about sending, from the status line's decision ``h`` (None while
    it is fine, or for a missing meter), linked to the events it concerns: those due when
    Stripe is failing or nothing goes out, every waiting one when nothing can be sent."""
    title = SENDING_ALERTS.get(h.state)
    if title is None:
        return None
    due = h.state in ("holding", "stalled")
    return Alert(h.level, title, h.detail, EVENTS,
                 {"due": "1"} if due else {"status": WAITING_STATUSES},
                 kind=h.state, count=h.due)


def _alerts(ov: AlertFacts, oldest_alert: timedelta) -> list[Alert]:
    """What needs a person: each alert links to the events it counts (the events list,
    filtered) and to the action that fixes it."""
    alerts: list[Alert] = []
    sending = sending_alert(ov.health)
    if sending is not None:
        alerts.append(sending)
    if ov.counts[DEAD]:
        alerts.append(Alert(
            "critical" if ov.dead_last_day else "warning",
            f"{ov.counts[DEAD]:,} dead letter{'s' if ov.counts[DEAD] != 1 else ''}",
            f"{ov.dead_last_day:,} new in the last 24 h",
            EVENTS, {"status": DEAD},
            "Requeue or resolve them", "dead_letters.index",
            kind="dead_letters", count=ov.counts[DEAD]))
    age = ov.oldest_waiting_age
    if age is not None and age > oldest_alert.total_seconds():
        alerts.append(Alert("warning", "Events are waiting too long",
                            f"the oldest waiting event was enqueued {_human(age)} ago "
                            f"(threshold {_human(oldest_alert.total_seconds())})",
                            EVENTS, {"due": "1"},
                            "See why they are retried", "dashboard.retries",
                            kind="waiting_long"))
    if ov.over_limit:
        alerts.append(Alert("critical", f"{ov.over_limit:,} events past Stripe's 35-day limit",
                            "Stripe will reject them: bill them by hand and resolve them.",
                            EVENTS, {"age": "over"},
                            "Resolve the dead ones", "dead_letters.index",
                            {"age": "near_limit"}, kind="past_age_limit",
                            count=ov.over_limit))
    if ov.near_limit:
        alerts.append(Alert("warning",
                            f"{ov.near_limit:,} events within 7 days of the 35-day limit",
                            "unsent events that Stripe will reject once 35 days old",
                            EVENTS, {"age": "near"},
                            *(("Map the tenants without a customer", "tenants.mappings")
                              if ov.unmapped else
                              ("Requeue the dead ones", "dead_letters.index")),
                            {} if ov.unmapped else {"age": "near_limit"},
                            kind="near_age_limit", count=ov.near_limit))
    if ov.counts.get(REJECTED):
        n = ov.counts[REJECTED]
        alerts.append(Alert("critical", f"{n:,} event{'s' if n != 1 else ''} rejected by Stripe",
                            "Stripe accepted them, then reported them invalid: nothing was "
                            "billed. Fix the cause, then requeue or resolve them.",
                            EVENTS, {"status": REJECTED},
                            "Requeue or resolve them", "rejected.index",
                            kind="rejected", count=n))
    for w in ov.waiting_for_meters:
        alerts.append(Alert("critical", f"{w.events:,} events wait for meter {w.meter}",
                            pre_aggregated_words(w.window) if w.window else
                            f"Stripe has no active meter named {w.meter!r} ({w.status}): "
                            "create or reactivate it in Stripe; they go out once it exists.",
                            EVENTS, {"meter": w.meter, "status": list(WAITING)},
                            "See Stripe's meters", "stripe_side.index",
                            kind="meter_missing", count=w.events))
    alerts += billing_alerts(ov.billing, now=ov.now, within=ov.invoice_risk_seconds)
    rec = ov.last_reconciliation
    if rec is not None and rec.mismatches:
        alerts.append(Alert("critical", f"Reconciliation found {rec.mismatches:,} "
                            f"mismatch{'es' if rec.mismatches != 1 else ''}",
                            "Stripe's totals differ from the units sent for some customers "
                            "and days.", "reconciliation.index",
                            kind="reconcile_mismatch", count=rec.mismatches))
    if ov.events_read.ok is False:
        alerts.append(Alert("warning", "Stripe's error reports could not be read",
                            ov.events_read.detail or "", "stripe_side.index",
                            kind="error_reports_unread"))
    for channel, run in ov.notify_runs.items():
        if run.ok is False:
            alerts.append(Alert("warning", f"Alerts are not reaching {CHANNEL_NAMES[channel]}",
                                f"{run.detail or 'The last message failed.'} Sending to "
                                "Stripe goes on as usual.", "notifications.index",
                                kind="notify_failing"))
    for u in ov.unmapped[:UNMAPPED_ALERTS]:
        alerts.append(Alert("warning",
                            f"Tenant {u.tenant_id} has no Stripe customer: "
                            f"{u.events:,} event{'s' if u.events != 1 else ''} waiting",
                            "Its events wait, neither attempted nor dead-lettered, until it "
                            "is mapped.",
                            EVENTS, {"tenant": u.tenant_id, "status": list(WAITING)},
                            "Map the tenant", "tenants.mappings", {"tenant": u.tenant_id},
                            kind="unmapped_waiting", count=u.events))
    if len(ov.unmapped) > UNMAPPED_ALERTS:
        rest = ov.unmapped[UNMAPPED_ALERTS:]
        alerts.append(Alert("warning",
                            f"{len(rest)} more tenant{'s' if len(rest) != 1 else ''} "
                            "without a Stripe customer "
                            f"{'have' if len(rest) != 1 else 'has'} waiting events",
                            ", ".join(u.tenant_id for u in rest[:5])
                            + (" and more" if len(rest) > 5 else "") + ": map them to start "
                            "sending", "tenants.mappings", {},
                            "Map the tenants", "tenants.mappings",
                            kind="unmapped_waiting", count=sum(u.events for u in rest)))
    return alerts

