"""Where a period's usage comes from, for every reader of it (``usage_in``: the ``usage``
command and a tenant's page; ``usage_table``: the paged Tenants & usage table and its CSV):
the sent rollups (whole months, or a month's part when it stands for the rest, from the
monthly rollup; other days from the daily one), the sent rows past the rollup's mark, the
unsent rows through ``ix_outbox_unsent``, the rows in flight, and resolved and cancelled
events past retention from the pruned-usage rollup. One definition, so the two readers
cannot count differently."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, func, or_, select

from ..outbox.retention import PRUNABLE
from ..outbox.rollups import SENT_USAGE, live_sent, read_mark
from ..outbox.sql import (
    IDLE_UNSENT,
    IN_FLIGHT,
    PRUNED_ROLLUP,
    SENT_MONTHLY,
    SENT_ROLLUP,
    T,
    int_sum,
    sql_str,
    status_in,
)

#: The usage table's columns. Rejected and cancelled events were accepted by Stripe but are
#: not billed: they are shown apart from ``sent``, never inside it.
USAGE_STATUSES = ("sent", "pending", "retrying", "rejected", "dead", "cancelled", "resolved")
#: Statuses whose pruned events are read from the pruned-usage rollup (pruned sent events
#: stay in the sent rollups).
PRUNED_APART = tuple(s for s in PRUNABLE if s != "sent")


def period_bounds(start: date, end: date) -> tuple[datetime, datetime]:
    if end < start:
        raise ValueError("the period ends before it starts")
    lo = datetime(start.year, start.month, start.day, tzinfo=UTC)
    return lo, datetime(end.year, end.month, end.day, tzinfo=UTC) + timedelta(days=1)


def usage_pieces(conn: Connection, start: date, end: date, tenant_id: str | None = None, *,
                 in_flight_apart: bool = False) -> tuple[list[Any], list[Any]]:
    """Every source of the period's usage, the way ``usage_in`` reads them, each summed per
    tenant and meter: sent (``(tenant_id, meter, events, quantity)`` selects: whole months
    from the monthly rollup, the days around them from the daily one, plus the rows past
    its mark), and the other statuses (``(tenant_id, meter, status, events, quantity)``:
    through ``ix_outbox_unsent``, events in flight as pending (as ``processing`` with
    ``in_flight_apart``), pruned resolved and cancelled events from the pruned-usage
    rollup)."""
    lo, hi = period_bounds(start, end)
    span = [T.c.occurred_at >= lo, T.c.occurred_at < hi]
    if tenant_id is not None:
        span.append(T.c.tenant_id == tenant_id)
    unsent = status_in(tuple(s for s in USAGE_STATUSES if s != "sent"))
    mark = read_mark(conn, SENT_USAGE)
    months, days = _months_and_days(conn, start, end)
    sent: list[Any] = []
    if months:                     # a row per tenant and meter and month
        sent.append(_summed(SENT_MONTHLY, SENT_MONTHLY.c.month.in_(months),
                            tenant_id=tenant_id))
    for first, last in days:       # the other days, a row per tenant and meter and day
        sent.append(_summed(SENT_ROLLUP, SENT_ROLLUP.c.day >= first.isoformat(),
                            SENT_ROLLUP.c.day <= last.isoformat(), tenant_id=tenant_id))
    sent.append(select(T.c.tenant_id, T.c.meter, func.count().label("events"),
                       int_sum(T.c.quantity).label("quantity"))
                .where(live_sent(mark), *span).group_by(T.c.tenant_id, T.c.meter))
    other = [
        select(T.c.tenant_id, T.c.meter, T.c.status, func.count().label("events"),
               int_sum(T.c.quantity).label("quantity"))
        .where(unsent, IDLE_UNSENT, *span).group_by(T.c.tenant_id, T.c.meter, T.c.status),
        select(T.c.tenant_id, T.c.meter,
               sql_str("processing" if in_flight_apart else "pending").label("status"),
               func.count().label("events"), int_sum(T.c.quantity).label("quantity"))
        .where(IN_FLIGHT, *span).group_by(T.c.tenant_id, T.c.meter),
    ]
    # Resolved and cancelled events past retention, from the pruned-usage rollup (pruned
    # sent events stay in the sent rollups, read above).
    pruned = (select(PRUNED_ROLLUP.c.tenant_id, PRUNED_ROLLUP.c.meter, PRUNED_ROLLUP.c.status,
                     int_sum(PRUNED_ROLLUP.c.events).label("events"),
                     int_sum(PRUNED_ROLLUP.c.quantity).label("quantity"))
              .where(PRUNED_ROLLUP.c.day >= start.isoformat(),
                     PRUNED_ROLLUP.c.day <= end.isoformat(),
                     PRUNED_ROLLUP.c.status.in_([sql_str(s) for s in PRUNED_APART]))
              .group_by(PRUNED_ROLLUP.c.tenant_id, PRUNED_ROLLUP.c.meter,
                        PRUNED_ROLLUP.c.status))
    if tenant_id is not None:
        pruned = pruned.where(PRUNED_ROLLUP.c.tenant_id == tenant_id)
    return sent, other + [pruned]


def _months_and_days(conn: Connection, start: date,
                     end: date) -> tuple[list[str], list[tuple[date, date]]]:
    """The months (``YYYY-MM``) whose monthly rollup row can stand for days ``start``…``end``,
    and the stretches of days that must be read day by day. Whole months can (as
    ``split_months`` says); so can part of a month when the daily rollup holds nothing for
    the rest of that month, as for "this month so far": nothing has occurred after today
    (one probe of the daily rollup's key each). At 100,000 tenants on the 30th, this month
    is then 100,000 rows to sum instead of 3,000,000."""
    whole, stretches = split_months(start, end)
    months: list[str] = []
    if whole is not None:
        first = date.fromisoformat(whole[0] + "-01")
        while first.isoformat()[:7] <= whole[1]:
            months.append(first.isoformat()[:7])
            first = _next_month(first)
    days: list[tuple[date, date]] = []
    for a, b in stretches:
        while a <= b:              # each stretch month by month
            month_first = a.replace(day=1)
            month_last = _next_month(a) - timedelta(days=1)
            last = min(b, month_last)
            rest = conn.execute(select(SENT_ROLLUP.c.day).where(or_(
                and_(SENT_ROLLUP.c.day >= month_first.isoformat(),
                     SENT_ROLLUP.c.day < a.isoformat()),
                and_(SENT_ROLLUP.c.day > last.isoformat(),
                     SENT_ROLLUP.c.day <= month_last.isoformat()))).limit(1)).first()
            if rest is None:
                months.append(a.isoformat()[:7])
            else:
                days.append((a, last))
            a = last + timedelta(days=1)
    return months, days


def _next_month(d: date) -> date:
    return (d.replace(day=28) + timedelta(days=4)).replace(day=1)


def _summed(table: Any, *where: Any, tenant_id: str | None) -> Any:
    """A sent rollup's events and units per tenant and meter, over the rows ``where``."""
    if tenant_id is not None:
        where = (*where, table.c.tenant_id == tenant_id)
    return (select(table.c.tenant_id, table.c.meter, int_sum(table.c.events).label("events"),
                   int_sum(table.c.quantity).label("quantity"))
            .where(*where).group_by(table.c.tenant_id, table.c.meter))


def split_months(start: date, end: date) -> tuple[tuple[str, str] | None,
                                                  list[tuple[date, date]]]:
    """Days ``start``…``end`` as the whole months among them (first and last ``YYYY-MM``,
    or None) and the stretches of days before and after them (inclusive pairs)."""
    first = start if start.day == 1 else _next_month(start)
    after = end + timedelta(days=1)
    stop = after if after.day == 1 else after.replace(day=1)   # first day past the months
    if first >= stop:
        return None, [(start, end)]
    days = []
    if start < first:
        days.append((start, first - timedelta(days=1)))
    if stop <= end:
        days.append((stop, end))
    last = stop - timedelta(days=1)
    return (first.isoformat()[:7], last.isoformat()[:7]), days
