"""Stripe's figure beside ours: what reconciliation compared for a period, per Stripe customer
and meter, read from ``reconciled_months`` and ``reconciled_days`` (the months a period holds
whole, or holds every compared day of, from their one row; the other days one by one).

Each usage row shows, for the days of its period that were compared: Stripe's figure
(``stripe_units``), ours then (``compared_units``: units, or events for a ``count`` meter),
how many days, and when (``compared_at``, the latest). A row none of whose days was compared
says so: not compared yet. Reconciliation compares a whole UTC day once it has settled
(``RECONCILE_SETTLE_SECONDS`` after it ends) at its next run."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import date, timedelta
from typing import Any

from sqlalchemy import Connection, Float, cast, func, literal, null, select, tuple_, union_all

from ..outbox.sql import RECON_DAYS, RECON_METER_DAYS, RECON_MONTHS, int_sum

#: The columns :func:`compared_for` gives, beside ``customer`` and ``meter``.
COLUMNS = ("stripe_units", "compared_units", "compared_days", "compared_at")


def _months(start: date, end: date) -> list[tuple[date, date]]:
    """The calendar months ``start``…``end`` overlaps, each as its first and last day."""
    out = []
    first = start.replace(day=1)
    while first <= end:
        nxt = (first.replace(day=28) + timedelta(days=4)).replace(day=1)
        out.append((first, nxt - timedelta(days=1)))
        first = nxt
    return out


def _any_day(conn: Connection, first: date, last: date) -> bool:
    """Whether any day ``first``…``last`` was compared (``ix_reconciled_days_day``)."""
    if last < first:
        return False
    return conn.execute(select(RECON_DAYS.c.day).where(
        RECON_DAYS.c.day >= first.isoformat(), RECON_DAYS.c.day <= last.isoformat())
        .limit(1)).first() is not None


def _summed(stripe: Any, ours: Any, days: Any, compared_at: Any) -> list[Any]:
    """:data:`COLUMNS` added up from compared rows (days, or months with their day counts)."""
    return [func.sum(stripe).label("stripe_units"), int_sum(ours).label("compared_units"),
            int_sum(days).label("compared_days"), func.max(compared_at).label("compared_at")]


def compared_for(conn: Connection, start: date, end: date) -> Any:
    """What was compared on UTC days ``start``…``end``, one row per (``customer``,
    ``meter``) compared: :data:`COLUMNS`. A month is read from its row when the period holds
    it whole or holds every day of it that was compared; otherwise its days in the period
    are read one by one."""
    D, M = RECON_DAYS.c, RECON_MONTHS.c  # noqa: N806 - table columns
    pieces: list[Any] = []
    whole: list[str] = []
    for first, last in _months(start, end):
        a, b = max(first, start), min(last, end)
        outside = _any_day(conn, first, a - timedelta(days=1)) or _any_day(
            conn, b + timedelta(days=1), last)
        if (a, b) == (first, last) or not outside:
            whole.append(first.isoformat()[:7])
        else:
            pieces.append(select(D.stripe_customer_id.label("customer"), D.meter,
                                 cast(D.stripe, Float).label("stripe"), D.ours,
                                 literal(1).label("days"), D.compared_at)
                          .where(D.day >= a.isoformat(), D.day <= b.isoformat()))
    if whole:
        pieces.append(select(M.stripe_customer_id.label("customer"), M.meter,
                             cast(M.stripe, Float).label("stripe"), M.ours, M.days,
                             M.compared_at).where(M.month.in_(whole)))
    if not pieces:
        pieces.append(select(null().label("customer"), null().label("meter"),
                             null().label("stripe"), null().label("ours"),
                             null().label("days"), null().label("compared_at"))
                      .where(literal(False)))
    every = union_all(*pieces).subquery()
    return (select(every.c.customer, every.c.meter,
                   *_summed(every.c.stripe, every.c.ours, every.c.days, every.c.compared_at))
            .group_by(every.c.customer, every.c.meter).subquery())


def compared_columns(compared: Any) -> list[Any]:
    """:data:`COLUMNS` of :func:`compared_for`'s rows, in order."""
    return [compared.c[c] for c in COLUMNS]


def joined(rows: Any, compared: Any) -> Any:
    """The condition joining usage rows (``stripe_customer_id``, ``meter``) to what was
    compared of them."""
    return (compared.c.customer == rows.c.stripe_customer_id) & (
        compared.c.meter == rows.c.meter)


def compared_of(conn: Connection, pairs: Iterable[tuple[str | None, str]], start: date,
                end: date) -> dict[tuple[str, str], dict[str, Any]]:
    """:data:`COLUMNS` for each (customer, meter) of ``pairs`` (a page's rows) over UTC days
    ``start``…``end``, read from their days (a range of the primary key each); a pair none of
    whose days was compared is left out. As :func:`compared_for` gives them, for a few rows."""
    wanted = sorted({(c, m) for c, m in pairs if c})
    D = RECON_DAYS.c  # noqa: N806 - table columns
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for i in range(0, len(wanted), 500):
        for row in conn.execute(
                select(D.stripe_customer_id, D.meter,
                       *_summed(cast(D.stripe, Float), D.ours, literal(1), D.compared_at))
                .where(tuple_(D.stripe_customer_id, D.meter).in_(wanted[i:i + 500]),
                       D.day >= start.isoformat(), D.day <= end.isoformat())
                .group_by(D.stripe_customer_id, D.meter)).mappings():
            out[(row["stripe_customer_id"], row["meter"])] = {c: row[c] for c in COLUMNS}
    return out


def meter_totals(conn: Connection, start: date, end: date) -> dict[str, tuple[float, int, int]]:
    """What was compared on the period's days, per meter (every customer): Stripe's figure,
    ours then, and how many customer-days (``reconciled_meter_days``: a row per meter and
    day)."""
    MD = RECON_METER_DAYS.c  # noqa: N806 - table columns
    return {str(m): (float(s or 0), int(o or 0), int(d or 0)) for m, s, o, d in conn.execute(
        select(MD.meter, func.sum(MD.stripe), int_sum(MD.ours), int_sum(MD.customer_days))
        .where(MD.day >= start.isoformat(), MD.day <= end.isoformat()).group_by(MD.meter))}
