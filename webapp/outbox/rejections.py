"""Stripe's asynchronous error reports, stored once by id and applied to the events they name.

A 200 from Stripe means accepted, not billed: Stripe validates meter events again later and
reports failures as events (``v1.billing.meter.error_report_triggered``,
``v1.billing.meter.no_meter_found``), each with *sample* errors — ``error_count`` may be larger
than the samples listed; reconciliation finds the rest. A sample names the event by
``request.identifier``: the identifier, or the idempotency key with its retry suffix, or the
``Idempotency-Key`` of the stream request that carried it (:mod:`.tracing` says which of that
request's events it singles out). A ``sent`` event it names becomes ``rejected`` with Stripe's
code and message, and how it was found. Samples that name an event still in flight wait and
are applied once it is sent; a sample naming a stream request that singles out none of its
events is kept as ``ambiguous`` and shown with the events it may be about; samples that name
nothing of ours are kept and shown, never dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, func, insert, select
from sqlalchemy import update as sa_update

from ..models import fit, fit_key
from . import refused
from .customers import CustomerCheck
from .error_reports import ErrorSample, StripeReport
from .rollups import lock_sent_mark, unfold_sent
from .sendable import ON_ITS_WAY
from .sql import ERROR_SAMPLES, SENT_AS, STRIPE_EVENTS, STRIPE_METERS, T, as_utc, insert_for
from .states import Move, Status, allowed, identifier_of
from .tracing import (
    BY_CUSTOMER,
    BY_REQUEST,
    BY_SAMPLE,
    CUSTOMER_NOT_FOUND,
    StreamRequestRecord,
    Traced,
    customers_in_question,
    requests_named,
    single_out,
)

log = logging.getLogger(__name__)

REJECTED, WAITING, ALREADY, STALE, UNMATCHED, AMBIGUOUS = (
    "rejected", "waiting", "already", "stale", "unmatched", "ambiguous")
#: No customer lookups for a report after this many (a report of a huge request set is
#: traced by samples and reconciliation; asking is bounded per report).
MAX_CUSTOMERS_PER_REPORT = 500


@dataclass
class Applied:
    """What storing one report did. ``stored`` is False for a report already stored."""

    stored: bool
    rejected: int = 0
    unmatched: int = 0
    waiting: int = 0
    #: Samples naming a stream request that singled out none of its events.
    ambiguous: int = 0
    event_ids: list[int] = field(default_factory=list)


def is_stored(conn: Connection, report_id: str) -> bool:
    """Whether the report with this id is already stored."""
    return bool(stored_ids(conn, [report_id]))


def stored_ids(conn: Connection, report_ids: Sequence[str]) -> set[str]:
    """Which of these reports are already stored (each looked up by its key, ``_key``)."""
    keys: dict[str, set[str]] = {}
    for report_id in report_ids:
        keys.setdefault(_key(report_id), set()).add(report_id)
    found: set[str] = set()
    wanted = list(keys)
    for i in range(0, len(wanted), 500):
        chunk = wanted[i:i + 500]
        for key in conn.execute(select(STRIPE_EVENTS.c.id)
                                .where(STRIPE_EVENTS.c.id.in_(chunk))).scalars():
            found |= keys[key]
    return found


def _key(report_id: str) -> str:
    """The key a report is stored once by: its id, or, for an id longer than the column (only
    a poisoned answer has one), its start and a digest of the whole (``fit_key``). Never its
    start alone: two long ids sharing one would be taken for one report, and the second never
    applied."""
    return str(fit_key(STRIPE_EVENTS.c.id, report_id))


def _fitted(report: StripeReport) -> StripeReport:
    """``report`` as it is stored and matched: its id as its key, every text of Stripe's cut
    to its column and cleaned of what a database refuses (``fit``), so that storing it can
    never fail. A sample's identifier is matched after the cut: ours are far shorter."""
    samples = tuple(ErrorSample(code=fit(ERROR_SAMPLES.c.code, s.code),
                                message=fit(ERROR_SAMPLES.c.message, s.message),
                                identifier=fit(ERROR_SAMPLES.c.identifier, s.identifier))
                    for s in report.samples)
    return replace(report, id=_key(report.id), type=fit(STRIPE_EVENTS.c.type, report.type),
                   meter_id=fit(STRIPE_EVENTS.c.meter_id, report.meter_id),
                   error_count=fit(STRIPE_EVENTS.c.error_count, report.error_count),
                   summary=fit(STRIPE_EVENTS.c.summary, report.summary),
                   body=fit(STRIPE_EVENTS.c.body, report.body), samples=samples)


def customers_to_ask(conn: Connection, reports: Sequence[StripeReport]
                     ) -> dict[str, datetime | None]:
    """The customers to ask Stripe about before these reports are applied, each with the time
    before which a kept answer is stale (None: any kept within the refresh): those of the
    stream requests ``meter_event_customer_not_found`` samples name (of the report's meter),
    at most ``MAX_CUSTOMERS_PER_REPORT`` per report; and, for a report counting more such
    errors than it samples, those its meter's events went to in its window, kept answers
    from before Stripe validated them stale (:func:`.refused.fresh_after`). A read."""
    out: dict[str, datetime | None] = {}

    def want(customers: set[str], fresh: datetime | None) -> None:
        for c in customers:
            kept = out.get(c)
            out[c] = fresh if kept is None else kept if fresh is None else max(kept, fresh)

    for report in reports:
        meter = _meter_names(conn, [report.meter_id]).get(report.meter_id or "")
        want(refused.customers_sent_to(conn, report, meter), refused.fresh_after(report))
        asked = [s for s in report.samples if s.code == CUSTOMER_NOT_FOUND and s.identifier]
        requests = requests_named(conn, [s.identifier or "" for s in asked])
        if not requests:
            continue
        events = _events_by_id(conn, {c.event_id for r in requests.values() for c in r.events})
        found: set[str] = set()
        for s in asked:
            request = requests.get(s.identifier or "")
            if request is not None:
                found |= customers_in_question(s.message, request, events, meter)
        want(set(sorted(found)[:MAX_CUSTOMERS_PER_REPORT]), None)
    return out


def store_report(engine: Engine, report: StripeReport, *, source: str, now: datetime,
                 customers: Mapping[str, CustomerCheck] | None = None) -> Applied:
    """Store ``report`` once by its id and apply its samples, in one transaction. A report
    already stored changes nothing (``stored`` False). ``customers``: Stripe's answers about
    the customers :func:`customers_to_ask` named."""
    return store_reports(engine, [report], source=source, now=now, customers=customers)[0]


def store_reports(engine: Engine, reports: Sequence[StripeReport], *, source: str,
                  now: datetime, customers: Mapping[str, CustomerCheck] | None = None
                  ) -> list[Applied]:
    """Store and apply several reports in one transaction, in their order (a poll's chunk):
    what each did. All of them or none: a failure leaves every one to the next poll."""
    with engine.begin() as conn:
        applied: list[Applied] = []
        fresh: list[tuple[StripeReport, Applied]] = []
        for report in map(_fitted, reports):
            row = conn.execute(insert_for(conn, STRIPE_EVENTS).values(
                id=report.id, type=report.type, created=report.created,
                meter_id=report.meter_id, source=source, stored_at=now,
                error_count=report.error_count, sample_count=len(report.samples), rejected=0,
                unmatched=0, summary=report.summary, body=report.body)
                .on_conflict_do_nothing(index_elements=[STRIPE_EVENTS.c.id])
                .returning(STRIPE_EVENTS.c.id)).first()
            applied.append(Applied(stored=row is not None))
            if row is not None and (report.samples or refused.unexplained(report)):
                fresh.append((report, applied[-1]))
        if fresh:
            meters = _meter_names(conn, [r.meter_id for r, _ in fresh])
            outcomes = _apply(conn, [(r.id, meters.get(r.meter_id or ""), r.samples)
                                     for r, _ in fresh], now, customers or {})
            for (report, one), results in zip(fresh, outcomes, strict=True):
                for outcome, event_id in results:
                    one.rejected += outcome == REJECTED
                    one.unmatched += outcome == UNMATCHED
                    one.waiting += outcome == WAITING
                    one.ambiguous += outcome == AMBIGUOUS
                    if outcome == REJECTED and event_id is not None:
                        one.event_ids.append(event_id)
                found = _find_by_asking(conn, report, meters.get(report.meter_id or ""),
                                        customers or {}, now)
                one.rejected += len(found)
                one.event_ids += found
                conn.execute(sa_update(STRIPE_EVENTS).where(STRIPE_EVENTS.c.id == report.id)
                             .values(rejected=one.rejected, unmatched=one.unmatched))
        return applied


def _find_by_asking(conn: Connection, report: StripeReport, meter: str | None,
                    customers: Mapping[str, CustomerCheck], now: datetime) -> list[int]:
    """Reject the events counted, not sampled, that Stripe's answers prove refused
    (:mod:`.refused`); their ids, each with an error sample naming no identifier."""
    if not refused.unexplained(report):
        return []
    refused.untimed(conn, report, meter, customers)
    traced = int(conn.execute(select(func.count(func.distinct(ERROR_SAMPLES.c.event_id))).where(
        ERROR_SAMPLES.c.stripe_event_id == report.id, ERROR_SAMPLES.c.code == CUSTOMER_NOT_FOUND,
        ERROR_SAMPLES.c.outcome.in_((REJECTED, ALREADY, WAITING)))).scalar_one())
    rows = refused.refused_by_asking(conn, report, meter, customers, traced)
    if not rows:
        if rows is None:
            log.warning("Stripe's report %s counts %d customer-not-found errors; asking about "
                        "the customers found more events than that: none is marked, "
                        "reconciliation decides", report.id,
                        report.count_of(CUSTOMER_NOT_FOUND))
        return []
    mark = lock_sent_mark(conn)
    said = next((s.message for s in report.samples if s.code == CUSTOMER_NOT_FOUND), None)
    moved, samples = [], []
    for ev in rows:
        why = ErrorSample(CUSTOMER_NOT_FOUND, fit(ERROR_SAMPLES.c.message, said or (
            f"Stripe has no customer {ev.stripe_customer_id} (asked)")), None)
        if _reject(conn, ev, why, report.id, now, BY_CUSTOMER):
            moved.append(ev)
            samples.append(dict(stripe_event_id=report.id, code=why.code, message=why.message,
                                identifier=None, event_id=int(ev.id), outcome=REJECTED,
                                at=now))
    if moved:
        unfold_sent(conn, mark, moved)
        conn.execute(insert(ERROR_SAMPLES), samples)
    return [int(ev.id) for ev in moved]


def _apply(conn: Connection, reports: Sequence[tuple[str, str | None, Sequence[ErrorSample]]],
           now: datetime, customers: Mapping[str, CustomerCheck]
           ) -> list[list[tuple[str, int | None]]]:
    """Match and apply the reports' samples (each report: its id, the event name of its
    meter when known, its samples), in order: each outcome with its event id (a sample naming
    a stream request may single out several events: one each), and a row for each in
    ``stripe_error_samples``. One lookup, one lock of the rollup mark."""
    named = sorted({identifier_of(s.identifier) for _, _, samples in reports for s in samples
                    if s.identifier})
    events = _events_named(conn, named)
    requests = requests_named(conn, [s.identifier for _, _, samples in reports for s in samples
                                     if s.identifier and identifier_of(s.identifier)
                                     not in events])
    carried = _events_by_id(conn, {c.event_id for r in requests.values() for c in r.events})
    mark = lock_sent_mark(conn) if any(
        e.status == Status.SENT.value for e in [*events.values(), *carried.values()]) else None
    out: list[list[tuple[str, int | None]]] = []
    rows: list[dict[str, Any]] = []
    moved: list[Any] = []
    done: set[int] = set()

    def settle(ev: Any, s: ErrorSample, outcome: str, report_id: str, found_by: str) -> str:
        if outcome == REJECTED:
            if _reject(conn, ev, s, report_id, now, found_by):
                moved.append(ev)
                done.add(int(ev.id))
                return REJECTED
            return ALREADY
        return outcome

    for report_id, meter, samples in reports:
        results: list[tuple[str, int | None]] = []
        for s in samples:
            ev = events.get(identifier_of(s.identifier)) if s.identifier else None
            request = requests.get(s.identifier or "") if ev is None else None
            got: list[tuple[str, int | None]]
            if request is not None:
                traced = _trace(s, request, carried, meter, customers)
                got = [(settle(e, s, _state(e, done), report_id, traced.found_by), int(e.id))
                       for e in traced.events] or [
                    (STALE, request.events[0].event_id) if traced.stale else (AMBIGUOUS, None)]
            elif ev is not None:
                got = [(settle(ev, s, _outcome(ev, s, done), report_id, BY_SAMPLE), int(ev.id))]
            else:
                got = [(UNMATCHED, None)]
            results += got
            rows += [dict(stripe_event_id=report_id, code=s.code, message=s.message,
                          identifier=s.identifier, event_id=event_id, outcome=outcome, at=now)
                     for outcome, event_id in got]
        out.append(results)
    if moved and mark is not None:
        unfold_sent(conn, mark, moved)
    conn.execute(insert(ERROR_SAMPLES), rows)
    return out


def _trace(s: ErrorSample, request: StreamRequestRecord, carried: Mapping[int, Any],
           meter: str | None, customers: Mapping[str, CustomerCheck]) -> Traced:
    return single_out(s.code, s.message, request, carried, meter=meter, customers=customers)


def _state(ev: Any, done: set[int]) -> str:
    """What a sample does to an event it singled out (its identifier already checked)."""
    if int(ev.id) in done or not (allowed(ev.status, Move.REJECT) or ev.status in ON_ITS_WAY):
        return ALREADY
    return REJECTED if allowed(ev.status, Move.REJECT) else WAITING


def _outcome(ev: Any, sample: ErrorSample, done: set[int]) -> str:
    if ev is None:
        return UNMATCHED
    if identifier_of(sample.identifier or "") != ev.sent_as:
        return STALE
    return _state(ev, done)


_COLUMNS = (T.c.id, T.c.status, T.c.idempotency_key, T.c.stripe_identifier, SENT_AS,
            T.c.sent_at, T.c.occurred_at, T.c.tenant_id, T.c.meter, T.c.quantity,
            T.c.stripe_customer_id)


def _events_named(conn: Connection, identifiers: list[str]) -> dict[str, Any]:
    """The events these identifiers name: by the identifier they now go by, else by their
    idempotency key (an identifier they went by before a requeue is still recognised)."""
    found: dict[str, Any] = {}
    for i in range(0, len(identifiers), 500):
        chunk = identifiers[i:i + 500]
        for r in conn.execute(select(*_COLUMNS).where(T.c.idempotency_key.in_(chunk))):
            found[r.idempotency_key] = r
        for r in conn.execute(select(*_COLUMNS).where(T.c.stripe_identifier.in_(chunk))):
            found[r.stripe_identifier] = r
    return found


def _events_by_id(conn: Connection, ids: set[int]) -> dict[int, Any]:
    """The events of these ids (those that still exist), by id."""
    wanted = sorted(ids)
    found: dict[int, Any] = {}
    for i in range(0, len(wanted), 500):
        for r in conn.execute(select(*_COLUMNS).where(T.c.id.in_(wanted[i:i + 500]))):
            found[int(r.id)] = r
    return found


def _meter_names(conn: Connection, meter_ids: Sequence[str | None]) -> dict[str, str]:
    """The event names of Stripe's meters by their ids (those known)."""
    wanted = sorted({m for m in meter_ids if m})
    if not wanted:
        return {}
    return {str(r.meter_id): str(r.event_name) for r in conn.execute(
        select(STRIPE_METERS.c.meter_id, STRIPE_METERS.c.event_name)
        .where(STRIPE_METERS.c.meter_id.in_(wanted)))}


def _reject(conn: Connection, ev: Any, sample: ErrorSample, report_id: str,
            now: datetime, found_by: str) -> bool:
    done = conn.execute(sa_update(T).where(T.c.id == ev.id, T.c.status == Status.SENT.value)
                        .values(status=Status.REJECTED.value, rejected_at=now,
                                reject_code=fit(T.c.reject_code, sample.code),
                                reject_message=fit(T.c.reject_message, sample.message),
                                reject_event_id=fit(T.c.reject_event_id, report_id),
                                reject_found_by=found_by, updated_at=now))
    return done.rowcount == 1


def apply_waiting(engine: Engine, *, now: datetime, limit: int = 1000) -> int:
    """Apply the samples that named an event still in flight, now that it may be sent;
    how many events this rejected. A sample row that a stream request's sample singled its
    event out for names the event by id (its identifier was checked then)."""
    with engine.begin() as conn:
        waiting = conn.execute(
            select(ERROR_SAMPLES.c.id, ERROR_SAMPLES.c.stripe_event_id, ERROR_SAMPLES.c.code,
                   ERROR_SAMPLES.c.message, ERROR_SAMPLES.c.identifier,
                   ERROR_SAMPLES.c.event_id)
            .where(ERROR_SAMPLES.c.outcome == WAITING).order_by(ERROR_SAMPLES.c.id)
            .limit(limit)).all()
        if not waiting:
            return 0
        events = _events_named(conn, sorted({identifier_of(w.identifier) for w in waiting
                                             if w.identifier}))
        traced = _events_by_id(conn, {int(w.event_id) for w in waiting
                                      if w.event_id is not None and (
                                          not w.identifier
                                          or identifier_of(w.identifier) not in events)})
        mark = lock_sent_mark(conn)
        moved: list[Any] = []
        done: set[int] = set()
        for w in waiting:
            sample = ErrorSample(w.code, w.message, w.identifier)
            ev = events.get(identifier_of(w.identifier)) if w.identifier else None
            if ev is not None:
                outcome, found_by = _outcome(ev, sample, done), BY_SAMPLE
            else:
                ev = traced.get(int(w.event_id)) if w.event_id is not None else None
                outcome = UNMATCHED if ev is None else _state(ev, done)
                found_by = BY_REQUEST
            if outcome == WAITING:
                continue
            if outcome == REJECTED and ev is not None:
                if _reject(conn, ev, sample, w.stripe_event_id, now, found_by):
                    moved.append(ev)
                    done.add(int(ev.id))
                else:
                    outcome = ALREADY
            conn.execute(sa_update(ERROR_SAMPLES).where(ERROR_SAMPLES.c.id == w.id)
                         .values(outcome=outcome, at=now))
        unfold_sent(conn, mark, moved)
    return len(moved)


def last_report_created(conn: Connection) -> datetime | None:
    """When the newest stored report was created at Stripe (where the next poll starts)."""
    return as_utc(conn.execute(select(STRIPE_EVENTS.c.created)
                               .order_by(STRIPE_EVENTS.c.created.desc()).limit(1)).scalar())
