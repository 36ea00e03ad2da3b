"""Stripe's meters as the outbox knows them: which event names may be sent, with which payload
keys, and how each meter adds events up. Kept in ``stripe_meters`` so every process agrees;
filled by the meter refresher (``webapp.worker.meters``) from ``GET /v1/billing/meters``.

Events whose meter is missing or inactive at Stripe are not claimed: they wait, visibly, like
events of an unmapped tenant, until the meter exists (Stripe would accept the call and reject
every event later). So do the events of a pre-aggregated meter (one with an
``event_time_window``, ``day`` or ``hour``): Stripe keeps one value per customer and window,
the last one sent, and the outbox sends one event per unit of work, so all but the last event
of each window would be lost. Such a meter is kept with a status of its own,
``pre_aggregated``: every check of "can this meter be sent to" is ``status == 'active'``, in
SQL and in Python, and none of them can forget the window.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Connection, Engine, select, true
from sqlalchemy import update as sa_update

from ..models import clean, fit, fits, limit_of
from .deferred import undefer_sendable
from .sql import STRIPE_METERS, insert_for

log = logging.getLogger(__name__)
M = STRIPE_METERS.c

ACTIVE = "active"
INACTIVE = "inactive"
MISSING = "missing"
#: Active at Stripe with an ``event_time_window``: Stripe keeps one value per window; its
#: events wait (see :attr:`MeterInfo.kept_status`).
PRE_AGGREGATED = "pre_aggregated"
DEFAULT_CUSTOMER_KEY = "stripe_customer_id"
DEFAULT_VALUE_KEY = "value"
#: How a meter adds events up; reconciliation compares units for ``sum``, events for
#: ``count``, and cannot compare ``last`` (the last value a customer sent).
FORMULAS = ("sum", "count", "last")


@dataclass(frozen=True)
class MeterInfo:
    """One meter, as Stripe lists it (``status``: Stripe's, ``active`` or ``inactive``) or as
    ``stripe_meters`` keeps it (``status``: :attr:`kept_status`, or ``missing``)."""

    event_name: str
    meter_id: str | None
    status: str
    customer_key: str = DEFAULT_CUSTOMER_KEY
    value_key: str = DEFAULT_VALUE_KEY
    formula: str = "sum"
    display_name: str | None = None
    #: ``day`` or ``hour`` for a pre-aggregated meter (Stripe's text), None for an ordinary one.
    event_time_window: str | None = None

    @property
    def kept_status(self) -> str:
        """The status ``stripe_meters`` keeps: Stripe's, except that an active meter with a
        time window is ``pre_aggregated`` (its events are not sent)."""
        if self.status == ACTIVE and self.event_time_window:
            return PRE_AGGREGATED
        return self.status

    @property
    def active(self) -> bool:
        """Whether events may be sent to it: active at Stripe, and not pre-aggregated."""
        return self.kept_status == ACTIVE

    @property
    def pre_aggregated(self) -> bool:
        """Whether Stripe keeps one value per time window of it (active or not)."""
        return bool(self.event_time_window)


@dataclass
class StoredMeters:
    """What storing a listing did: how many meters are active, how many are active but
    pre-aggregated (not sent to), and the meters refused (one line each, for a person)."""

    active: int = 0
    pre_aggregated: int = 0
    refused: list[str] = field(default_factory=list)


def refusal(m: MeterInfo) -> str | None:
    """Why a listed meter cannot be stored as Stripe listed it, or None.

    Its event name, id and payload keys are used as they are (to match events, to read its
    summaries, to build each event's payload): cut, they would name another meter or send
    events with the wrong keys, which Stripe accepts and rejects later. Such a meter is
    refused rather than cut: its events wait, visibly, as for a meter Stripe does not list.
    Its display name, status, formula and time window are only shown or compared, and are
    cut instead.
    """
    for column, what, value in ((M.event_name, "event name", m.event_name),
                                (M.meter_id, "id", m.meter_id),
                                (M.customer_key, "customer payload key", m.customer_key),
                                (M.value_key, "value payload key", m.value_key)):
        if value is not None and not fits(column, value):
            return (f"meter {_shown(m.event_name)} ({_shown(m.meter_id)}): its {what} is "
                    f"{len(value)} characters long (at most {limit_of(column)} are kept "
                    "here) or holds a character no database stores")
    if not m.event_name:
        return f"meter {_shown(m.meter_id)}: no event name"
    return None


def _shown(value: str | None) -> str:
    """A value of Stripe's, short enough for a log line."""
    if value is None:
        return "None"
    return repr(clean(value[:60]) + ("…" if len(value) > 60 else ""))


def store_meters(engine: Engine, meters: Iterable[MeterInfo], *, now: datetime
                 ) -> StoredMeters:
    """Replace what is known of Stripe's meters with a complete listing: each listed meter is
    written as listed, with its :attr:`~MeterInfo.kept_status` (an active meter with a time
    window is ``pre_aggregated``); a known event name no longer listed becomes ``missing``
    (its time window forgotten). When Stripe lists two meters for one event name, an active
    one wins, a pre-aggregated one before an ordinary one. A meter that cannot be stored as
    listed (:func:`refusal`) is left out, logged and named in the result; the others are
    stored all the same. Events put off for a meter the listing shows active (and ordinary)
    are due again in the same transaction."""
    out = StoredMeters()
    by_name: dict[str, MeterInfo] = {}
    for m in meters:
        why = refusal(m)
        if why is not None:
            log.error("Stripe's meter refused, its events wait: %s", why)
            out.refused.append(why)
        elif m.event_name not in by_name or _rank(m) > _rank(by_name[m.event_name]):
            by_name[m.event_name] = m
    with engine.begin() as conn:
        for m in by_name.values():
            values = dict(meter_id=m.meter_id,
                          display_name=fit(M.display_name, m.display_name),
                          status=fit(M.status, m.kept_status), customer_key=m.customer_key,
                          value_key=m.value_key, formula=fit(M.formula, m.formula),
                          event_time_window=fit(M.event_time_window, m.event_time_window),
                          seen_at=now, updated_at=now)
            ins = insert_for(conn, STRIPE_METERS)
            conn.execute(ins.values(event_name=m.event_name, **values).on_conflict_do_update(
                index_elements=[STRIPE_METERS.c.event_name], set_=values))
        gone = STRIPE_METERS.c.event_name.not_in(list(by_name)) if by_name else true()
        conn.execute(sa_update(STRIPE_METERS).where(gone, STRIPE_METERS.c.status != MISSING)
                     .values(status=MISSING, event_time_window=None, updated_at=now))
        # Events put off for a meter this listing shows active are due again at once.
        undefer_sendable(conn, now=now, listed=True)
    out.active = sum(1 for m in by_name.values() if m.active)
    out.pre_aggregated = sum(1 for m in by_name.values() if m.kept_status == PRE_AGGREGATED)
    return out


def _rank(m: MeterInfo) -> int:
    """Which of two listed meters of one event name is kept: an active one (Stripe takes its
    events) before an inactive one; of two active ones, a pre-aggregated one, whose events
    wait, before an ordinary one (sending to the event name could lose events)."""
    return 0 if m.status != ACTIVE else 2 if m.kept_status == PRE_AGGREGATED else 1


def mark_missing(engine: Engine, event_name: str, *, now: datetime) -> bool:
    """Stripe said no active meter has this event name (a 400 on send, or an error report):
    its events wait until a listing shows the meter again. Whether anything changed."""
    with engine.begin() as conn:
        done = conn.execute(sa_update(STRIPE_METERS)
                            .where(STRIPE_METERS.c.event_name == event_name,
                                   STRIPE_METERS.c.status == ACTIVE)
                            .values(status=MISSING, updated_at=now))
        if done.rowcount == 0:
            ins = insert_for(conn, STRIPE_METERS)
            conn.execute(ins.values(event_name=event_name, status=MISSING,
                                    customer_key=DEFAULT_CUSTOMER_KEY,
                                    value_key=DEFAULT_VALUE_KEY, formula="sum",
                                    updated_at=now)
                         .on_conflict_do_nothing(index_elements=[STRIPE_METERS.c.event_name]))
        return done.rowcount > 0


_COLUMNS = (M.event_name, M.meter_id, M.status, M.customer_key, M.value_key, M.formula,
            M.display_name, M.event_time_window)


def known_meters(conn: Connection) -> dict[str, MeterInfo]:
    """Every meter known, by event name."""
    return {r.event_name: MeterInfo(*r) for r in conn.execute(select(*_COLUMNS))}


def known_meter(conn: Connection, event_name: str) -> MeterInfo | None:
    """The meter known for one event name, or None."""
    r = conn.execute(select(*_COLUMNS).where(M.event_name == event_name)).first()
    return None if r is None else MeterInfo(*r)


def active_meters(conn: Connection) -> dict[str, MeterInfo]:
    """The meters events may be sent to now, by event name: those kept ``active`` (the same
    ones as ``stripe_meters.status = 'active'`` in SQL: not pre-aggregated)."""
    return {name: m for name, m in known_meters(conn).items() if m.active}
