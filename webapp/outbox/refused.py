"""Every refused unit found: the events an error report counted but did not sample.

Stripe samples the errors it reports (three per code, say) and counts them all
(``error_types[].error_count``). For ``meter_event_customer_not_found`` the rest can be found
without a sample: Stripe refuses every event sent to a customer it does not have (or has
deleted). So when a report counts more such errors than its samples traced to our events, the
customers the report's meter's events went to while Stripe validated them are asked about
(:mod:`webapp.worker.customers`, before the report's transaction), and the events sent to a
customer Stripe says it lacks become ``rejected``, found by asking.

Never more than Stripe counted: if asking finds more such events than the report's count
leaves unexplained (a customer deleted part-way through the window, whose earlier events were
billed), none is marked by asking, and the report keeps showing "N refused, M found" until
reconciliation accounts for the rest. Other codes are left to samples and reconciliation.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, select

from .customers import CustomerCheck
from .sql import SENT_AS, T, status_is
from .tracing import CUSTOMER_NOT_FOUND

#: How long before Stripe began validating an event may have been sent (our clock against
#: Stripe's, and the time from its acceptance to its validation). Stripe does not document that
#: time; an event accepted longer before was validated, and reported, earlier. Too short a
#: margin only leaves events to reconciliation; too long a one is held back by the count.
SENT_BEFORE_VALIDATION = timedelta(minutes=5)
#: A report without validation times covers the day before it was created.
WITHOUT_TIMES = timedelta(days=1)
#: At most this many customers are asked about for one report.
MAX_CUSTOMERS = 500


def window(report: Any) -> tuple[datetime, datetime]:
    """When the events a report is about were sent: from a little before Stripe began
    validating to when it stopped (the day before the report, without those times)."""
    end = report.validation_end or report.created
    start = (report.validation_start - SENT_BEFORE_VALIDATION
             if report.validation_start is not None else end - WITHOUT_TIMES)
    return start, end + timedelta(minutes=1)


def unexplained(report: Any) -> bool:
    """Whether the report counts more customer-not-found errors than it samples."""
    sampled = sum(1 for s in report.samples if s.code == CUSTOMER_NOT_FOUND)
    return bool(report.count_of(CUSTOMER_NOT_FOUND) > sampled)


def customers_sent_to(conn: Connection, report: Any, meter: str | None) -> set[str]:
    """The customers the report's meter's events went to in its window (at most
    :data:`MAX_CUSTOMERS`): those to ask Stripe about. None without a known meter."""
    if meter is None or not unexplained(report):
        return set()
    start, end = window(report)
    rows = conn.execute(select(T.c.stripe_customer_id).where(
        status_is("sent"), T.c.sent_at >= start, T.c.sent_at < end, T.c.meter == meter,
        T.c.stripe_customer_id.is_not(None)).distinct().limit(MAX_CUSTOMERS))
    return {str(c) for c in rows.scalars()}


_COLUMNS = (T.c.id, T.c.status, T.c.idempotency_key, T.c.stripe_identifier, SENT_AS,
            T.c.sent_at, T.c.occurred_at, T.c.tenant_id, T.c.meter, T.c.quantity,
            T.c.stripe_customer_id)


def refused_by_asking(conn: Connection, report: Any, meter: str | None,
                      customers: Mapping[str, CustomerCheck], traced: int) -> list[Any] | None:
    """The ``sent`` events of the report's window sent to a customer Stripe says it does not
    have, when they are no more than its count of customer-not-found errors leaves after the
    ``traced`` events its samples accounted for; ``[]`` when there is nothing to find; None
    when asking found more than Stripe counted (then nothing is marked)."""
    if meter is None or not unexplained(report):
        return []
    lacking = sorted(c for c, check in customers.items() if not check.exists)
    if not lacking:
        return []
    start, end = window(report)
    rows = conn.execute(select(*_COLUMNS).where(
        status_is("sent"), T.c.sent_at >= start, T.c.sent_at < end, T.c.meter == meter,
        T.c.stripe_customer_id.in_(lacking))).all()
    left = report.count_of(CUSTOMER_NOT_FOUND) - traced
    return list(rows) if len(rows) <= left else None
