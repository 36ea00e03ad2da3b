"""The Stripe page: what the outbox knows of Stripe's side — its meters (and the events
waiting for one), the error reports it read, and the samples that named nothing of ours."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, case, func, select

from ..db import reading
from ..outbox import stripe_runs
from ..outbox.meters import ACTIVE, known_meters
from ..outbox.sql import (
    ERROR_SAMPLES,
    IDLE_UNSENT,
    STREAM_REQUESTS,
    STRIPE_EVENTS,
    T,
    row_dict,
    status_in,
)
from ..outbox.stripe_runs import RunStatus
from ..status import WAITING


@dataclass(frozen=True)
class WaitingForMeter:
    """Events that wait because Stripe has no meter for their event name they may be sent
    to: none, an inactive one, or a pre-aggregated one (``window``: Stripe's time window)."""

    meter: str
    status: str          # missing | inactive | pre_aggregated
    events: int
    window: str | None = None


def waiting_for_meters(conn: Connection) -> list[WaitingForMeter]:
    """Event names with events waiting whose meter may not be sent to (missing, inactive or
    pre-aggregated; none before the meters were ever read: then nothing can be said)."""
    if stripe_runs.run_status(conn, stripe_runs.METERS).ran_at is None:
        return []
    meters = known_meters(conn)
    rows = conn.execute(select(T.c.meter, func.count())
                        .where(status_in(WAITING), IDLE_UNSENT)
                        .group_by(T.c.meter)).all()
    out = []
    for meter, n in rows:
        m = meters.get(meter)
        if m is None or not m.active:
            out.append(WaitingForMeter(meter, "missing" if m is None else m.status, int(n),
                                       None if m is None else m.event_time_window))
    return sorted(out, key=lambda w: -w.events)


@dataclass(frozen=True)
class StripePage:
    meters: list[Any]
    waiting: list[WaitingForMeter]
    reports: list[dict[str, Any]]
    unmatched: list[dict[str, Any]]
    syncs: dict[str, RunStatus]


def stripe_page(engine: Engine, *, limit: int = 50) -> StripePage:
    """Meters, events waiting for one, the latest reports and unmatched samples, and when
    each exchange with Stripe last ran."""
    with reading(engine) as conn:
        meters = sorted(known_meters(conn).values(), key=lambda m: (m.status != ACTIVE,
                                                                    m.event_name))
        waiting = waiting_for_meters(conn)
        reports = [row_dict(r) for r in conn.execute(
            select(STRIPE_EVENTS.c.id, STRIPE_EVENTS.c.type, STRIPE_EVENTS.c.created,
                   STRIPE_EVENTS.c.meter_id, STRIPE_EVENTS.c.source, STRIPE_EVENTS.c.stored_at,
                   STRIPE_EVENTS.c.error_count, STRIPE_EVENTS.c.sample_count,
                   STRIPE_EVENTS.c.rejected, STRIPE_EVENTS.c.unmatched,
                   STRIPE_EVENTS.c.summary)
            .order_by(STRIPE_EVENTS.c.created.desc()).limit(limit))]
        _add_findings(conn, reports)
        unmatched = [row_dict(r) for r in conn.execute(
            select(ERROR_SAMPLES, STREAM_REQUESTS.c.events.label("request_events"))
            .select_from(ERROR_SAMPLES.outerjoin(
                STREAM_REQUESTS, STREAM_REQUESTS.c.idempotency_key == ERROR_SAMPLES.c.identifier))
            .where(ERROR_SAMPLES.c.outcome.in_(("unmatched", "stale", "waiting", "ambiguous")))
            .order_by(ERROR_SAMPLES.c.id.desc()).limit(limit))]
        syncs = {name: stripe_runs.run_status(conn, name)
                 for name in (stripe_runs.METERS, stripe_runs.EVENTS, stripe_runs.RECONCILE)}
    return StripePage(meters, waiting, reports, unmatched, syncs)


#: The outcomes of a report's rows that traced one of its errors to an event of ours.
FOUND = ("rejected", "already", "waiting")


def _add_findings(conn: Connection, reports: list[dict[str, Any]]) -> None:
    """What each report's errors came to here, so its columns add up: ``found`` (events of
    ours its samples, or asking Stripe about customers, traced them to), ``not_ours``
    (samples naming nothing of ours), ``ambiguous`` (samples naming a stream request without
    singling out the event), and ``unfound``: what Stripe counted beyond those, which
    reconciliation accounts for."""
    if not reports:
        return
    S = ERROR_SAMPLES.c
    found = case((S.outcome.in_(FOUND), S.event_id), else_=None)
    by = {r.stripe_event_id: r for r in conn.execute(
        select(S.stripe_event_id, func.count(func.distinct(found)).label("found"),
               func.sum(case((S.outcome == "unmatched", 1), else_=0)).label("not_ours"),
               func.sum(case((S.outcome == "ambiguous", 1), else_=0)).label("ambiguous"))
        .where(S.stripe_event_id.in_([r["id"] for r in reports]))
        .group_by(S.stripe_event_id))}
    for r in reports:
        got = by.get(r["id"])
        r["found"] = int(got.found) if got is not None else 0
        r["not_ours"] = int(got.not_ours or 0) if got is not None else 0
        r["ambiguous"] = int(got.ambiguous or 0) if got is not None else 0
        r["unfound"] = max(0, int(r["error_count"] or 0) - r["found"] - r["not_ours"])


def samples_for_event(conn: Connection, event_id: int) -> list[dict[str, Any]]:
    """Every error sample Stripe reported naming this event."""
    return [row_dict(r) for r in conn.execute(
        select(ERROR_SAMPLES).where(ERROR_SAMPLES.c.event_id == event_id)
        .order_by(ERROR_SAMPLES.c.id))]
