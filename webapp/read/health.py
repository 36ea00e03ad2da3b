"""The status line at the top of every page, ``stats --json``'s ``health`` and ``/health``:
one state, read from what is really happening, never from a flag someone forgot to clear.

- **No API key** — nothing can be sent (this process has no ``STRIPE_API_KEY`` and no running
  drainer has one).
- **Paused** — an operator (or a worker, after Stripe refused the key) switched sending off.
- **Holding** — a drainer's circuit breaker is open: Stripe is failing and claims are held
  back until the next probe; or Stripe's meters were never read, so nothing can be sent yet.
- **Stalled** — events a drainer could send are due and nothing has been sent for
  ``STALLED_AFTER``: no drainer is running, or it is stuck (ahead of a missing meter, which it
  then names too).
- **Meter missing** — events are due for a meter Stripe does not have (active); they wait.
- **Sending** — an event went out within ``STALLED_AFTER`` (the only green state).
- **Idle** — nothing is due (events may wait for their retry time), or only events of tenants
  without a Stripe customer are (the line says how many wait for a mapping).

Every read is bounded: the due events are sampled from the claim's own index
(``ix_outbox_claimable``), at most ``SAMPLE`` of them, oldest first, where held ones collect;
when every one of them waits (for a meter or a customer), one more read looks past them for the
oldest event a drainer could send, so a stall behind them still shows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, false, func, select

from ..outbox import stripe_runs
from ..outbox.control import pause_state
from ..outbox.deferred import DEFER_FOR, UNCLAIMED
from ..outbox.meters import active_meters, known_meter
from ..outbox.sendable import TENANT_MAPPED, WAITING_SQL, addressed, due, sendable_now_sql
from ..outbox.sql import HEARTBEATS as H
from ..outbox.sql import TENANTS, T, as_utc, status_is
from ..status import SENT
from .words import pre_aggregated_words

#: Nothing sent for this long while events are due: stalled.
STALLED_AFTER = timedelta(minutes=5)
#: A drainer that has not written its heartbeat for this long is gone.
GONE_AFTER = timedelta(seconds=60)
#: How many of the oldest due events are looked at.
SAMPLE = 1000

#: state -> (level, title) ; level decides the colour: ok (green), info, warning, critical.
STATES = {
    "sending": ("ok", "Sending"),
    "idle": ("info", "Idle"),
    "paused": ("critical", "Paused"),
    "holding": ("critical", "Holding"),
    "stalled": ("critical", "Stalled"),
    "no_api_key": ("critical", "No API key"),
    "meter_missing": ("warning", "Meter missing"),
}


@dataclass(frozen=True)
class Health:
    state: str
    detail: str
    #: When the state began, where known (paused at, holding since, last sent at).
    since: datetime | None = None
    next_probe_at: datetime | None = None
    last_sent_at: datetime | None = None
    due: int = 0
    due_more: bool = False
    drainers: int = 0
    #: Who paused and the meter that is missing, where they apply.
    paused_by: str | None = None
    meter: str | None = None

    @property
    def level(self) -> str:
        return STATES[self.state][0]

    @property
    def title(self) -> str:
        return STATES[self.state][1]

    def as_dict(self, *, private: bool = True) -> dict[str, object]:
        """JSON-ready; ``private=False`` leaves out who paused and why (anonymous callers)."""
        out: dict[str, object] = {k: (v.isoformat() if isinstance(v, datetime) else v)
                                  for k, v in asdict(self).items()}
        out["title"], out["level"] = self.title, self.level
        if not private:
            out.pop("paused_by")
            out["detail"] = self.title
        return out


@dataclass(frozen=True)
class _Due:
    sendable: int
    oldest_sendable: datetime | None
    held_by_meter: dict[str, int]
    more: bool
    #: Not due: put off by the deferrer for a meter Stripe does not have (in a sample of
    #: ``SAMPLE``), and whether that sample was full.
    put_off_by_meter: dict[str, int]
    put_off_more: bool

    def waiting_for_meters(self) -> tuple[dict[str, int], bool]:
        """Events waiting for a meter, by meter, and whether there may be more: the due
        ones, or else the put-off ones."""
        if self.held_by_meter:
            return self.held_by_meter, self.more
        return self.put_off_by_meter, self.put_off_more


def health(conn: Connection, *, now: datetime, api_key_here: bool) -> Health:
    """The state of sending now (see the module's docstring for the order they win in)."""
    beats = conn.execute(select(H.c.can_send, H.c.breaker, H.c.holding_since,
                                H.c.next_probe_at, H.c.last_failure, H.c.last_sent_at)
                         .where(H.c.seen_at >= now - GONE_AFTER)).all()
    last_sent = as_utc(conn.execute(select(func.max(T.c.sent_at))
                                    .where(status_is(SENT))).scalar())
    listing = stripe_runs.run_status(conn, stripe_runs.METERS)
    active = set(active_meters(conn)) if listing.ran_at is not None else None
    due = _due(conn, now, active)

    def state(name: str, detail: str, *, since: datetime | None = None,
              next_probe_at: datetime | None = None, paused_by: str | None = None,
              meter: str | None = None) -> Health:
        return Health(name, detail, since=since, next_probe_at=next_probe_at,
                      last_sent_at=last_sent, due=due.sendable, due_more=due.more,
                      drainers=len(beats), paused_by=paused_by, meter=meter)

    waiting = _count(due.sendable + sum(due.held_by_meter.values()), due.more)

    if not (beats and any(b.can_send for b in beats)) and not api_key_here:
        return state("no_api_key", f"STRIPE_API_KEY is not set: nothing is sent. "
                      f"{waiting} due.")
    pause = pause_state(conn)
    if pause.paused:
        who = pause.changed_by or ("a worker" if pause.kind == "systemic" else "an operator")
        return state("paused", f"Sending is paused for every worker: "
                     f"{pause.reason or 'no reason given'} (by {who}). {waiting} due.",
                     since=pause.changed_at, paused_by=who)
    holding = [b for b in beats if b.breaker != "closed"]
    if holding:
        since = _earliest(as_utc(b.holding_since) for b in holding)
        probe = _earliest(as_utc(b.next_probe_at) for b in holding)
        failure = next((b.last_failure for b in holding if b.last_failure), None)
        return state("holding", f"Stripe is failing: {failure or 'calls fail'}. Sending is "
                     f"held back and tried again with one probe call. {waiting} due.",
                     since=since, next_probe_at=probe)
    if active is not None and not active and listing.ok is False and due.held_by_meter:
        # Stripe's meters were never read: a drainer sends nothing until it can list them.
        why = listing.detail or "no answer"
        return state("holding", f"Stripe's meters cannot be read ({why}); sending waits "
                     f"until they can. {waiting} due.", since=listing.ran_at)
    missing, meter = "", None
    by_meter, more = due.waiting_for_meters()
    if by_meter:
        meter, n = max(by_meter.items(), key=lambda kv: kv[1])
        others = len(by_meter) - 1
        verb = "waits" if n == 1 and not more else "wait"
        info = known_meter(conn, meter)
        if info is not None and info.pre_aggregated:
            missing = (f"{_count(n, more)} {verb} for the meter “{meter}”, which is "
                       + pre_aggregated_words(info.event_time_window, lower=True)
                       + (f" Events of {others} other meter(s) wait too." if others else ""))
        else:
            missing = (f"{_count(n, more)} {verb} for the meter “{meter}”, which Stripe does "
                       "not have (active)" + (f", and {others} other meter(s)" if others else "")
                       + ".")
    quiet = last_sent is None or now - last_sent >= STALLED_AFTER
    if (due.oldest_sendable is not None and now - due.oldest_sendable >= STALLED_AFTER
            and quiet):
        # Ahead of a missing meter: events that could go out and do not are the worse news.
        minutes = int((now - (last_sent or due.oldest_sendable)).total_seconds() // 60)
        why = ("no drainer is running" if not beats
               else "the running drainers are not sending them")
        # Beside a missing meter, the count is of the events that could go out (all of
        # them "Events" when the sample held only waiting ones: how many is not known).
        due_here = waiting if not due.held_by_meter else (
            "Events" if due.more else _count(due.sendable, False))
        return state("stalled", f"{due_here} due and nothing sent for {minutes} min: {why}."
                     + (f" Also, {missing[0].lower()}{missing[1:]}" if missing else ""),
                     since=last_sent, meter=meter)
    if missing:
        return state("meter_missing", missing, meter=meter)
    if not quiet:
        return state("sending", f"Events are going out to Stripe. {waiting} due.",
                      since=last_sent)
    if due.sendable:
        return state("idle", f"{waiting} due recently; none sent yet.")
    unmapped, more = _waiting_for_customer(conn, now)
    if unmapped:
        verb = "waits" if unmapped == 1 and not more else "wait"
        return state("idle", f"Nothing can be sent now: {_count(unmapped, more)} {verb} for "
                     "a Stripe customer (their tenant is not mapped yet).")
    return state("idle", "Nothing is due to be sent.")


def _due(conn: Connection, now: datetime, active: set[str] | None) -> _Due:
    """The oldest due events (the claim's index, at most ``SAMPLE``), split into those a
    drainer can send and those held for a meter Stripe does not have (``active``: the active
    meters' event names, None before the meters were ever read). Events of tenants without a
    customer are left out: they wait for a mapping (an alert of their own)."""
    picked = (select(T.c.next_attempt_at, T.c.meter, T.c.tenant_id, T.c.stripe_customer_id)
              .where(WAITING_SQL, due(now))
              .order_by(T.c.next_attempt_at, T.c.id).limit(SAMPLE).subquery())
    rows = conn.execute(
        select(picked.c.next_attempt_at, picked.c.meter, picked.c.stripe_customer_id,
               TENANTS.c.stripe_customer_id.label("tenant_customer"))
        .select_from(picked.outerjoin(TENANTS, TENANTS.c.tenant_id == picked.c.tenant_id))
    ).all()
    sendable, oldest, held = 0, None, dict[str, int]()
    for at, meter, customer, tenant_customer in rows:
        if not addressed(customer, tenant_customer):
            continue
        if active is not None and meter not in active:
            held[meter] = held.get(meter, 0) + 1
            continue
        sendable += 1
        when = as_utc(at)
        if when is not None and (oldest is None or when < oldest):
            oldest = when
    more = len(rows) >= SAMPLE
    put_off, put_off_more = (_put_off_for_meters(conn, now, active)
                             if active is not None and not held else ({}, False))
    if more and not sendable:
        # The whole sample waits (for a meter or a customer): a sendable event may be due
        # behind it, and nobody sending it would be a stall no one sees. Look past them for
        # the oldest one, as a claim does.
        oldest = _oldest_sendable(conn, now, active)
        sendable = int(oldest is not None)
    return _Due(sendable, oldest, held, more, put_off, put_off_more)


def _put_off_for_meters(conn: Connection, now: datetime,
                        active: set[str]) -> tuple[dict[str, int], bool]:
    """Events the deferrer put off for a meter Stripe does not have (active), by meter (at most
    ``SAMPLE`` of them), and whether there were that many: no longer due, they still wait for
    it, and the line says so. They are never-claimed pending events due within ``DEFER_FOR``
    of now; the conditions come before the limit, so retries due in that time cannot hide
    them (PostgreSQL reads them through ``ix_outbox_unsent``'s pending entries or the claim's
    index, whichever holds fewer)."""
    where: list[Any] = [*UNCLAIMED, T.c.next_attempt_at > now,
                        T.c.next_attempt_at <= now + DEFER_FOR]
    if active:
        where.append(T.c.meter.not_in(sorted(active)))
    picked = (select(T.c.meter).where(*where).order_by(T.c.next_attempt_at, T.c.id)
              .limit(SAMPLE).subquery())
    by = {str(m): int(n) for m, n in conn.execute(
        select(picked.c.meter, func.count()).group_by(picked.c.meter))}
    return by, sum(by.values()) >= SAMPLE


def _waiting_for_customer(conn: Connection, now: datetime) -> tuple[int, bool]:
    """Never-claimed events of tenants without a Stripe customer, due or put off by the
    deferrer (due again within ``DEFER_FOR``), at most ``SAMPLE`` (any of them: a count needs no
    order, and the read stops at the limit); and whether there were that many. Read only when
    nothing else is due, so that Idle does not say "nothing is due" while they wait for a
    mapping."""
    picked = (select(T.c.id)
              .where(*UNCLAIMED, T.c.next_attempt_at <= now + DEFER_FOR, ~TENANT_MAPPED)
              .limit(SAMPLE).subquery())
    n = int(conn.execute(select(func.count()).select_from(picked)).scalar_one())
    return n, n >= SAMPLE


def _oldest_sendable(conn: Connection, now: datetime,
                     active: set[str] | None) -> datetime | None:
    """When the oldest due event a drainer can send came due (the claim's index, past the
    events that wait for a meter or a customer); None if there is none."""
    where: list[Any] = [*sendable_now_sql(now)]
    if active is not None:
        where.append(T.c.meter.in_(sorted(active)) if active else false())
    return as_utc(conn.execute(select(T.c.next_attempt_at).where(*where)
                               .order_by(T.c.next_attempt_at, T.c.id).limit(1)).scalar())


def _count(n: int, more: bool) -> str:
    if more:
        return f"More than {n:,} events"
    return f"{n:,} event" + ("" if n == 1 else "s")


def _earliest(times: Iterable[datetime | None]) -> datetime | None:
    return min((t for t in times if t is not None), default=None)
