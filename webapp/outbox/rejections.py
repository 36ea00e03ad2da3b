"""Stripe's asynchronous error reports, stored once by id and applied to the events they name.

A 200 from Stripe means accepted, not billed: Stripe validates meter events again later and
reports failures as events (``v1.billing.meter.error_report_triggered``,
``v1.billing.meter.no_meter_found``), each with *sample* errors — ``error_count`` may be larger
than the samples listed; reconciliation finds the rest. A sample names the event by
``request.identifier`` (the identifier, or the idempotency key with its retry suffix): a
``sent`` event it names becomes ``rejected`` with Stripe's code and message. Samples that name
an event still in flight wait and are applied once it is sent; samples that name nothing of
ours are kept and shown, never dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, insert, select
from sqlalchemy import update as sa_update

from ..models import fit, fit_key
from .rollups import lock_sent_mark, unfold_sent
from .sql import ERROR_SAMPLES, SENT_AS, STRIPE_EVENTS, T, as_utc, insert_for
from .states import Move, Status, allowed, identifier_of

ERROR_REPORT = "v1.billing.meter.error_report_triggered"
NO_METER_FOUND = "v1.billing.meter.no_meter_found"
#: The event types the outbox reads; others are acknowledged and ignored.
REPORT_TYPES = (ERROR_REPORT, NO_METER_FOUND)
#: Stripe's codes that mean the meter itself is missing: the meter list is read again.
METER_CODES = frozenset({"no_meter", "archived_meter"})

REJECTED, WAITING, ALREADY, STALE, UNMATCHED = (
    "rejected", "waiting", "already", "stale", "unmatched")
_IN_FLIGHT = (Status.PENDING.value, Status.PROCESSING.value, Status.RETRYING.value)


@dataclass(frozen=True)
class ErrorSample:
    """One sample error of a report."""

    code: str | None
    message: str | None
    identifier: str | None


@dataclass(frozen=True)
class StripeReport:
    """A Stripe event as read in full (``GET /v2/core/events/{id}``), reduced to what the
    outbox uses; ``body`` is the whole event as JSON, kept for the record."""

    id: str
    type: str
    created: datetime
    meter_id: str | None = None
    error_count: int = 0
    summary: str | None = None
    samples: tuple[ErrorSample, ...] = ()
    body: str | None = None

    @property
    def meter_codes(self) -> bool:
        """Whether it says a meter is missing or archived (the meter list is stale)."""
        return self.type == NO_METER_FOUND or any(s.code in METER_CODES for s in self.samples)


@dataclass
class Applied:
    """What storing one report did. ``stored`` is False for a report already stored."""

    stored: bool
    rejected: int = 0
    unmatched: int = 0
    waiting: int = 0
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


def store_report(engine: Engine, report: StripeReport, *, source: str,
                 now: datetime) -> Applied:
    """Store ``report`` once by its id and apply its samples, in one transaction. A report
    already stored changes nothing (``stored`` False)."""
    return store_reports(engine, [report], source=source, now=now)[0]


def store_reports(engine: Engine, reports: Sequence[StripeReport], *, source: str,
                  now: datetime) -> list[Applied]:
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
            if row is not None and report.samples:
                fresh.append((report, applied[-1]))
        if fresh:
            outcomes = _apply(conn, [(r.id, r.samples) for r, _ in fresh], now)
            for (report, one), results in zip(fresh, outcomes, strict=True):
                for outcome, event_id in results:
                    one.rejected += outcome == REJECTED
                    one.unmatched += outcome == UNMATCHED
                    one.waiting += outcome == WAITING
                    if outcome == REJECTED and event_id is not None:
                        one.event_ids.append(event_id)
                conn.execute(sa_update(STRIPE_EVENTS).where(STRIPE_EVENTS.c.id == report.id)
                             .values(rejected=one.rejected, unmatched=one.unmatched))
        return applied


def _apply(conn: Connection, reports: Sequence[tuple[str, Sequence[ErrorSample]]],
           now: datetime) -> list[list[tuple[str, int | None]]]:
    """Match and apply the reports' samples, in order: each sample's (outcome, event id), and
    a row for each in ``stripe_error_samples``. One lookup, one lock of the rollup mark."""
    named = sorted({identifier_of(s.identifier) for _, samples in reports for s in samples
                    if s.identifier})
    events = _events_named(conn, named)
    mark = lock_sent_mark(conn) if any(e.status == Status.SENT.value
                                       for e in events.values()) else None
    out: list[list[tuple[str, int | None]]] = []
    rows: list[dict[str, Any]] = []
    moved: list[Any] = []
    done: set[int] = set()
    for report_id, samples in reports:
        results: list[tuple[str, int | None]] = []
        for s in samples:
            ev = events.get(identifier_of(s.identifier)) if s.identifier else None
            outcome = _outcome(ev, s, done)
            if outcome == REJECTED and ev is not None:
                if _reject(conn, ev, s, report_id, now):
                    moved.append(ev)
                    done.add(int(ev.id))
                else:
                    outcome = ALREADY
            event_id = None if ev is None else int(ev.id)
            results.append((outcome, event_id))
            rows.append(dict(stripe_event_id=report_id, code=s.code, message=s.message,
                             identifier=s.identifier, event_id=event_id, outcome=outcome,
                             at=now))
        out.append(results)
    if moved and mark is not None:
        unfold_sent(conn, mark, moved)
    conn.execute(insert(ERROR_SAMPLES), rows)
    return out


def _outcome(ev: Any, sample: ErrorSample, done: set[int]) -> str:
    if ev is None:
        return UNMATCHED
    if identifier_of(sample.identifier or "") != ev.sent_as:
        return STALE
    if int(ev.id) in done or not (allowed(ev.status, Move.REJECT) or ev.status in _IN_FLIGHT):
        return ALREADY
    return REJECTED if allowed(ev.status, Move.REJECT) else WAITING


def _events_named(conn: Connection, identifiers: list[str]) -> dict[str, Any]:
    """The events these identifiers name: by the identifier they now go by, else by their
    idempotency key (an identifier they went by before a requeue is still recognised)."""
    if not identifiers:
        return {}
    columns = (T.c.id, T.c.status, T.c.idempotency_key, T.c.stripe_identifier, SENT_AS,
               T.c.sent_at, T.c.occurred_at, T.c.tenant_id, T.c.meter, T.c.quantity)
    found: dict[str, Any] = {}
    for r in conn.execute(select(*columns).where(T.c.idempotency_key.in_(identifiers))):
        found[r.idempotency_key] = r
    for r in conn.execute(select(*columns).where(T.c.stripe_identifier.in_(identifiers))):
        found[r.stripe_identifier] = r
    return found


def _reject(conn: Connection, ev: Any, sample: ErrorSample, report_id: str,
            now: datetime) -> bool:
    done = conn.execute(sa_update(T).where(T.c.id == ev.id, T.c.status == Status.SENT.value)
                        .values(status=Status.REJECTED.value, rejected_at=now,
                                reject_code=fit(T.c.reject_code, sample.code),
                                reject_message=fit(T.c.reject_message, sample.message),
                                reject_event_id=fit(T.c.reject_event_id, report_id),
                                updated_at=now))
    return done.rowcount == 1


def apply_waiting(engine: Engine, *, now: datetime, limit: int = 1000) -> int:
    """Apply the samples that named an event still in flight, now that it may be sent;
    how many events this rejected."""
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
        mark = lock_sent_mark(conn)
        moved: list[Any] = []
        done: set[int] = set()
        for w in waiting:
            sample = ErrorSample(w.code, w.message, w.identifier)
            ev = events.get(identifier_of(w.identifier)) if w.identifier else None
            outcome = _outcome(ev, sample, done)
            if outcome == WAITING:
                continue
            if outcome == REJECTED and ev is not None:
                if _reject(conn, ev, sample, w.stripe_event_id, now):
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
