"""The invoice-line judge: each finalized metered line compared with the project's own figure
for its customer, meter and period, the verdict kept on the line, and the events that are not
plainly on it (late, uncertain) kept in ``invoice_line_events``. What :mod:`.evidence` says,
applied to the tables; a page reads the verdicts, never sums events per view.

:func:`judge` is one pass, run after every read of Stripe's invoices, after a pushed invoice
and by the commands that list late usage. It judges the finalized lines not judged since they
(or their subscription) last changed, the lines whose period had an event sent since the last
pass began, and the lines still open to question (late or uncertain events, finalized within
:data:`OPEN_QUESTIONS`): its cost follows what changed, not the table.

For each line, its period's events (the customer fixed on a sent event, or for an event never
sent the one its tenant is mapped to; the meter; ``period.start <= occurred_at < period.end``)
are placed from their calls: Stripe took it before the finalization (``ours``), no call that
may have reached Stripe began before it (``late``), or its calls straddle it (``uncertain``,
settled by the line's quantity). Most events need no attempt row: one recorded sent before the
finalization was taken before it, one first claimed after it reached Stripe after it; only the
events claimed before and recorded after are read call by call.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Integer,
    String,
    and_,
    bindparam,
    column,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    tuple_,
    union_all,
    values,
)
from sqlalchemy import update as sa_update

from ..status import SENT
from . import evidence, stripe_runs
from .evidence import (
    COMPARED_FORMULAS,
    JUDGING,
    LATE,
    UNCERTAIN,
    Call,
    Calls,
    Placed,
    Settlement,
)
from .sql import (
    ATTEMPTS,
    IDLE_UNSENT,
    IN_FLIGHT_WHERE,
    INVOICE_PERIODS,
    INVOICES,
    LINE_EVENTS,
    STRIPE_METERS,
    SUBSCRIPTIONS,
    TENANTS,
    T,
    as_utc,
    id_in,
    status_is,
)

L = INVOICE_PERIODS
#: How far before the last pass's start the next looks again at sends: an event's
#: ``sent_at`` is when its call returned, and its commit comes a little later.
SCAN_OVERLAP = timedelta(minutes=10)
#: Lines judged at every pass while they have late or uncertain events: an unsent event may
#: be sent, closed or requeued. Past this long after the finalization nothing of its period
#: can reach Stripe any more (it refuses usage older than 35 days).
OPEN_QUESTIONS = timedelta(days=40)
#: Lines judged per round of statements.
BATCH = 200


@dataclass
class JudgeSummary:
    """What a pass did."""

    lines: int = 0
    late_events: int = 0
    uncertain_events: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"lines": self.lines, "late_events": self.late_events,
                "uncertain_events": self.uncertain_events}


@dataclass(frozen=True)
class Line:
    """A finalized metered line, as the judge reads it."""

    invoice_id: str
    item_id: str
    customer: str
    meter: str | None
    start: datetime
    end: datetime
    finalized_at: datetime
    invoice_status: str
    billing_reason: str | None
    subscription_id: str | None
    quantity_decimal: str | None
    amount: int | None

    @property
    def key(self) -> tuple[str, str]:
        return (self.invoice_id, self.item_id)


def judge(engine: Engine, *, now: datetime, revisit: bool = True) -> JudgeSummary:
    """One pass (see the module's docstring). ``revisit``: the lines still open to question
    are judged again too — the scheduled pass after each read of Stripe's invoices does; a
    command or an action about to list late usage need not (what it lists is read live).
    Safe to run from several processes at once: each line's verdict is written in one
    transaction, from what it read."""
    with engine.connect() as conn:
        mark = stripe_runs.run_status(conn, stripe_runs.JUDGE_MARK).ran_at
        wanted = _lines_to_judge(conn, mark, now, revisit=revisit)
    summary = JudgeSummary()
    for start in range(0, len(wanted), BATCH):
        with engine.begin() as conn:
            lines = _read_lines(conn, wanted[start:start + BATCH])
            _judge_lines(conn, lines, now, summary)
    stripe_runs.record_run(engine, stripe_runs.JUDGE_MARK, ok=True, now=now,
                           detail=f"{summary.lines} invoice lines judged")
    return summary


def judge_lines(engine: Engine, keys: Iterable[tuple[str, str]], *,
                now: datetime) -> JudgeSummary:
    """Judge these lines (invoice, item) now, whatever was judged before."""
    summary = JudgeSummary()
    wanted = sorted(set(keys))
    for start in range(0, len(wanted), BATCH):
        with engine.begin() as conn:
            _judge_lines(conn, _read_lines(conn, wanted[start:start + BATCH]), now, summary)
    return summary


def _finalized() -> Any:
    return L.c.finalized_at.is_not(None)


def _lines_to_judge(conn: Connection, mark: datetime | None, now: datetime, *,
                    revisit: bool) -> list[tuple[str, str]]:
    """The lines a pass judges (see the module's docstring), by (invoice, item)."""
    keys = select(L.c.invoice_id, L.c.subscription_item_id)
    parts = [keys.where(_finalized(), L.c.judged_at.is_(None))]
    if revisit:
        parts.append(keys.where(_finalized(), L.c.finalized_at > now - OPEN_QUESTIONS,
                                or_(L.c.late_events > 0, L.c.uncertain_events > 0)))
    if mark is not None:
        since = mark - SCAN_OVERLAP
        parts.append(keys.select_from(T).join(L, and_(
            L.c.stripe_customer_id == T.c.stripe_customer_id, L.c.meter == T.c.meter,
            L.c.period_start <= T.c.occurred_at, T.c.occurred_at < L.c.period_end))
            .where(status_is(SENT), T.c.sent_at > since, _finalized()))
        parts.append(keys.select_from(SUBSCRIPTIONS).join(
            L, L.c.stripe_customer_id == SUBSCRIPTIONS.c.stripe_customer_id)
            .where(SUBSCRIPTIONS.c.changed_at >= since, _finalized()))
    found = {(str(r[0]), str(r[1])) for r in conn.execute(union_all(*parts))}
    return sorted(found)


def _read_lines(conn: Connection, keys: Sequence[tuple[str, str]]) -> list[Line]:
    if not keys:
        return []
    wanted = set(keys)
    rows = conn.execute(
        select(L, INVOICES.c.status.label("invoice_status"), INVOICES.c.billing_reason)
        .join(INVOICES, INVOICES.c.id == L.c.invoice_id)
        .where(L.c.invoice_id.in_(sorted({k[0] for k in keys})), _finalized()))
    out = []
    for r in rows:
        if (str(r.invoice_id), str(r.subscription_item_id)) not in wanted:
            continue
        out.append(Line(str(r.invoice_id), str(r.subscription_item_id),
                        str(r.stripe_customer_id), r.meter, _utc(r.period_start),
                        _utc(r.period_end), _utc(r.finalized_at), str(r.invoice_status),
                        r.billing_reason, r.subscription_id, r.quantity_decimal, r.amount))
    return out


def _utc(value: Any) -> datetime:
    found = as_utc(value)
    assert found is not None
    return found


def _judge_lines(conn: Connection, lines: Sequence[Line], now: datetime,
                 summary: JudgeSummary) -> None:
    """Judge ``lines`` in the caller's transaction: each line's figures and verdict, and its
    late and uncertain events."""
    if not lines:
        return
    formulas = {str(r.event_name): str(r.formula) for r in conn.execute(
        select(STRIPE_METERS.c.event_name, STRIPE_METERS.c.formula))}
    trials = _trials(conn, {ln.subscription_id for ln in lines if ln.subscription_id})
    compared = [ln for ln in lines if _compared(ln, formulas) and not _free(ln, trials)]
    judged = {ln.key for ln in compared}
    events = _events(conn, compared)
    calls = _calls(conn, [e for ln in compared for e in events[ln.key]
                          if evidence.needs_calls(e[1], ln.finalized_at)])
    updates: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for ln in lines:
        free = _free(ln, trials)
        settlement = None
        placed: list[Placed] = []
        if ln.key in judged:
            unit_of = formulas[str(ln.meter)]
            for event_id, ev, quantity in events[ln.key]:
                if event_id in calls:
                    ev = Calls(ev.status, ev.first_claim, ev.first_unknown, ev.sent_at,
                               tuple(calls[event_id]))
                place = evidence.place_of(ev, ln.finalized_at)
                if place is not None:
                    placed.append(Placed(event_id, quantity if unit_of == "sum" else 1,
                                         place[0], place[1]))
            settlement = evidence.settle(Decimal(ln.quantity_decimal or "0"), placed)
        verdict = evidence.verdict_of(invoice_status=ln.invoice_status, free=free,
                                      compared=_compared(ln, formulas),
                                      settlement=settlement)
        if settlement is not None and verdict in JUDGING:
            rows += _line_event_rows(ln, placed, settlement, now)
        updates.append(_line_update(ln, verdict, formulas.get(str(ln.meter)), settlement, now))
        summary.lines += 1
        if settlement is not None:
            summary.late_events += settlement.late_events
            summary.uncertain_events += settlement.uncertain_events
    _write(conn, lines, updates, rows)


def _compared(line: Line, formulas: dict[str, str]) -> bool:
    return (line.meter is not None and formulas.get(line.meter) in COMPARED_FORMULAS
            and line.quantity_decimal is not None)


def _free(line: Line, trials: dict[str, tuple[datetime, datetime]]) -> bool:
    trial = trials.get(line.subscription_id or "")
    return evidence.is_free(billing_reason=line.billing_reason, amount=line.amount,
                            period_start=line.start, period_end=line.end,
                            trials=[trial] if trial is not None else [])


def _trials(conn: Connection, subscription_ids: set[str]) -> dict[str, tuple[datetime, datetime]]:
    """Each subscription's trial (start, end), where it has one."""
    if not subscription_ids:
        return {}
    return {str(r.id): (_utc(r.trial_start), _utc(r.trial_end)) for r in conn.execute(
        select(SUBSCRIPTIONS.c.id, SUBSCRIPTIONS.c.trial_start, SUBSCRIPTIONS.c.trial_end)
        .where(SUBSCRIPTIONS.c.id.in_(sorted(subscription_ids)),
               SUBSCRIPTIONS.c.trial_start.is_not(None),
               SUBSCRIPTIONS.c.trial_end.is_not(None)))}


_EVENT_COLUMNS = (T.c.id, T.c.status, T.c.quantity, T.c.first_attempt_at, T.c.first_unknown_at,
                  T.c.sent_at)


def _events(conn: Connection, lines: Sequence[Line]
            ) -> defaultdict[tuple[str, str], list[tuple[int, Calls, int]]]:
    """Every event of each line's period, but those closed unbilled: the sent ones by their
    customer (``ix_outbox_sent_customer``), the others by the customer their tenant is mapped
    to where they have none yet (``ix_outbox_unsent``, the few in flight apart). One
    statement for the lines, which are literals joined to the outbox."""
    found: defaultdict[tuple[str, str], list[tuple[int, Calls, int]]] = defaultdict(list)
    if not lines:
        return found
    lw = _lines_table(conn, lines)
    in_period = and_(T.c.meter == lw.c.meter, T.c.occurred_at >= lw.c.start,
                     T.c.occurred_at < lw.c.end)
    sent = (select(lw.c.k, *_EVENT_COLUMNS).select_from(lw)
            .join(T, and_(T.c.stripe_customer_id == lw.c.customer, in_period))
            .where(status_is(SENT)))
    customer = func.coalesce(T.c.stripe_customer_id, TENANTS.c.stripe_customer_id)

    def unsent(where: Any) -> Any:
        return (select(lw.c.k, *_EVENT_COLUMNS).select_from(lw)
                .join(T, and_(where, in_period))
                .outerjoin(TENANTS, TENANTS.c.tenant_id == T.c.tenant_id)
                .where(customer == lw.c.customer,
                       T.c.status.not_in(list(evidence.CLOSED))))

    for r in conn.execute(union_all(sent, unsent(IDLE_UNSENT), unsent(IN_FLIGHT_WHERE))):
        found[lines[int(r.k)].key].append((int(r.id), Calls(
            str(r.status), as_utc(r.first_attempt_at), as_utc(r.first_unknown_at),
            as_utc(r.sent_at)), int(r.quantity)))
    return found


def _lines_table(conn: Connection, lines: Sequence[Line]) -> Any:
    """The lines as a table (k, customer, meter, start, end) to join to the outbox: a
    ``VALUES`` list on PostgreSQL (planned in a moment, where a ``UNION ALL`` of a select per
    line cost more to plan than to run), selects of literals on SQLite (which takes no column
    names after a ``VALUES`` list's alias)."""
    at = T.c.occurred_at.type
    if conn.dialect.name == "postgresql":
        return values(column("k", Integer), column("customer", String),
                      column("meter", String), column("start", at), column("end", at),
                      name="lw").data([(i, ln.customer, ln.meter, ln.start, ln.end)
                                       for i, ln in enumerate(lines)])
    return union_all(*[select(literal(i).label("k"), literal(ln.customer).label("customer"),
                              literal(ln.meter).label("meter"),
                              literal(ln.start, at).label("start"),
                              literal(ln.end, at).label("end"))
                       for i, ln in enumerate(lines)]).subquery("lw")


def _calls(conn: Connection, events: Sequence[tuple[int, Calls, int]]) -> dict[int, list[Call]]:
    """The attempt rows of these events (those whose calls decide their place)."""
    ids = sorted({e[0] for e in events})
    out: dict[int, list[Call]] = {i: [] for i in ids}
    for start in range(0, len(ids), 1000):
        for r in conn.execute(select(ATTEMPTS.c.event_id, ATTEMPTS.c.attempted_at,
                                     ATTEMPTS.c.outcome, ATTEMPTS.c.http_status,
                                     ATTEMPTS.c.applied)
                              .where(id_in(conn, ATTEMPTS.c.event_id, ids[start:start + 1000]))):
            out[int(r.event_id)].append(Call(_utc(r.attempted_at), str(r.outcome),
                                             r.http_status, bool(r.applied)))
    return out


def _line_event_rows(line: Line, placed: Sequence[Placed], settlement: Settlement,
                     now: datetime) -> list[dict[str, Any]]:
    return [dict(event_id=p.event_id, invoice_id=line.invoice_id,
                 subscription_item_id=line.item_id, place=p.place,
                 settled=settlement.settled.get(p.event_id), period_start=line.start,
                 period_end=line.end, finalized_at=line.finalized_at, found_at=now)
            for p in placed if p.place in (LATE, UNCERTAIN)]


def _line_update(line: Line, verdict: str, formula: str | None,
                 settlement: Settlement | None, now: datetime) -> dict[str, Any]:
    figures: dict[str, Any] = dict.fromkeys(
        ("ours", "ours_events", "late", "late_events", "uncertain", "uncertain_events",
         "difference"))
    if settlement is not None:
        figures.update(ours=settlement.ours, ours_events=settlement.ours_events,
                       late=settlement.late, late_events=settlement.late_events,
                       uncertain=settlement.uncertain,
                       uncertain_events=settlement.uncertain_events,
                       difference=str(settlement.difference))
    return dict(b_invoice=line.invoice_id, b_item=line.item_id, verdict=verdict,
                formula=formula, judged_at=now, **figures)


def _write(conn: Connection, lines: Sequence[Line], updates: list[dict[str, Any]],
           rows: list[dict[str, Any]]) -> None:
    """The lines' verdicts and figures, and their late and uncertain events in place of the
    ones found before."""
    # One statement, many parameter sets; the SET clause is the parameters' other keys.
    conn.execute(sa_update(L).where(L.c.invoice_id == bindparam("b_invoice"),
                                    L.c.subscription_item_id == bindparam("b_item")), updates)
    conn.execute(delete(LINE_EVENTS).where(
        tuple_(LINE_EVENTS.c.invoice_id, LINE_EVENTS.c.subscription_item_id)
        .in_([ln.key for ln in lines])))
    if rows:
        for start in range(0, len(rows), 500):
            conn.execute(insert(LINE_EVENTS), rows[start:start + 500])


def judging_line() -> Any:
    """SQL: a line that judges its period's events (finalized; not free, void or uncompared;
    a line not judged yet counts, since it will be)."""
    return and_(_finalized(), or_(L.c.verdict.is_(None), L.c.verdict.in_(list(JUDGING))))

