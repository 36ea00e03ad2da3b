"""Every refused unit found: the events an error report counted but did not sample.

Stripe samples the errors it reports (three per code, say) and counts them all
(``error_types[].error_count``). For ``meter_event_customer_not_found`` part of the rest can be
found without a sample, by asking Stripe about the customers the report's meter's events went
to while Stripe validated them (:mod:`webapp.worker.customers`, before the report's
transaction). What was kept of those customers from before Stripe began validating (the
report's ``validation_start``, or its window's start without one) is stale and asked again: a
customer kept as active may have been deleted since (:func:`fresh_after`).

Only what the answer proves is marked ``rejected`` (found by asking):

- a customer Stripe never had (a 404, ``missing``) refused every event sent to it: the
  ``sent`` events of the report's window to it;
- a customer Stripe has deleted refused only the events that reached it after the deletion.
  A deleted customer's stub carries no time; the time is the ``created`` of Stripe's v1 event
  ``customer.deleted`` (``GET /v1/events``, kept 30 days: :attr:`CustomerCheck.deleted_at`).
  An event is taken as sent after it only when the first call for it that may have reached
  Stripe (an attempt answered ``delivered`` or ``unknown``, or its ``first_unknown_at``) began
  at or after the deletion (plus :data:`AFTER_DELETION`); those accepted before stay ``sent``
  (they were billed: marking them would have a requeue bill them twice). When the deletion
  time cannot be had (no such event listed, Stripe could not be asked), none of that
  customer's events is marked.

Never more than Stripe counted: if asking finds more such events than the report's count
leaves unexplained, none is marked by asking. Whatever is not marked stays counted on the
report ("N refused, M found") for reconciliation to account for. Other codes are left to
samples and reconciliation.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, func, select

from ..status import SENT
from .customers import DELETED, MISSING, CustomerCheck
from .sql import ATTEMPTS, SENT_AS, T, as_utc, status_is
from .states import Outcome
from .tracing import CUSTOMER_NOT_FOUND

log = logging.getLogger(__name__)

#: How long before Stripe began validating an event may have been sent (our clock against
#: Stripe's, and the time from its acceptance to its validation). Stripe does not document that
#: time; an event accepted longer before was validated, and reported, earlier. Too short a
#: margin only leaves events to reconciliation; too long a one is held back by the count.
SENT_BEFORE_VALIDATION = timedelta(minutes=5)
#: A report without validation times covers the day before it was created.
WITHOUT_TIMES = timedelta(days=1)
#: At most this many customers are asked about for one report.
MAX_CUSTOMERS = 500
#: Stripe's ``created`` is whole seconds, and its clock is not ours: an event reached Stripe
#: after a customer's deletion, for the outbox, only when its first call that may have reached
#: Stripe began at least this long after the deletion's ``created``. Too long a margin only
#: leaves events to reconciliation; too short a one could mark an event Stripe billed.
AFTER_DELETION = timedelta(seconds=2)
#: The attempts that may have left the event at Stripe.
_MAY_HAVE_REACHED = (Outcome.DELIVERED.value, Outcome.UNKNOWN.value)


def window(report: Any) -> tuple[datetime, datetime]:
    """When the events a report is about were sent: from a little before Stripe began
    validating to when it stopped (the day before the report, without those times)."""
    end = report.validation_end or report.created
    start = (report.validation_start - SENT_BEFORE_VALIDATION
             if report.validation_start is not None else end - WITHOUT_TIMES)
    return start, end + timedelta(minutes=1)


def fresh_after(report: Any) -> datetime:
    """Before when a kept answer about a customer this report may be about is stale: when
    Stripe began validating its events (``validation_start``), or its window's start."""
    start: datetime = report.validation_start or window(report)[0]
    return start


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
        status_is(SENT), T.c.sent_at >= start, T.c.sent_at < end, T.c.meter == meter,
        T.c.stripe_customer_id.is_not(None)).distinct().limit(MAX_CUSTOMERS))
    return {str(c) for c in rows.scalars()}


_COLUMNS = (T.c.id, T.c.status, T.c.idempotency_key, T.c.stripe_identifier, SENT_AS,
            T.c.sent_at, T.c.occurred_at, T.c.tenant_id, T.c.meter, T.c.quantity,
            T.c.stripe_customer_id, T.c.first_unknown_at)


def refused_by_asking(conn: Connection, report: Any, meter: str | None,
                      customers: Mapping[str, CustomerCheck], traced: int) -> list[Any] | None:
    """The ``sent`` events of the report's window that Stripe's answers prove refused: those
    to a customer it never had, and those to a deleted one that reached Stripe after its
    deletion (:func:`reached_after`); when they are no more than the report's count of
    customer-not-found errors leaves after the ``traced`` events its samples accounted for.
    ``[]`` when there is nothing to find; None when asking found more than Stripe counted
    (then nothing is marked). A deleted customer without a deletion time adds nothing."""
    if meter is None or not unexplained(report):
        return []
    missing = {c for c, check in customers.items() if check.state == MISSING}
    deleted = {c: check.deleted_at for c, check in customers.items()
               if check.state == DELETED and check.deleted_at is not None}
    wanted = sorted(missing | set(deleted))
    if not wanted:
        return []
    start, end = window(report)
    rows = conn.execute(select(*_COLUMNS).where(
        status_is(SENT), T.c.sent_at >= start, T.c.sent_at < end, T.c.meter == meter,
        T.c.stripe_customer_id.in_(wanted))).all()
    found = [r for r in rows if r.stripe_customer_id in missing]
    after = [r for r in rows if r.stripe_customer_id in deleted]
    if after:
        found += reached_after(conn, after, deleted)
    left = report.count_of(CUSTOMER_NOT_FOUND) - traced
    return found if len(found) <= left else None


def untimed(conn: Connection, report: Any, meter: str | None,
            customers: Mapping[str, CustomerCheck]) -> list[str]:
    """The deleted customers without a deletion time that the report's meter's events went
    to in its window: none of their events can be marked by asking (said in the log)."""
    wanted = sorted(c for c, check in customers.items()
                    if check.state == DELETED and check.deleted_at is None)
    if meter is None or not wanted or not unexplained(report):
        return []
    start, end = window(report)
    found = sorted(str(c) for c in conn.execute(select(T.c.stripe_customer_id).where(
        status_is(SENT), T.c.sent_at >= start, T.c.sent_at < end, T.c.meter == meter,
        T.c.stripe_customer_id.in_(wanted)).distinct()).scalars())
    if found:
        log.warning("Stripe's report %s: when Stripe deleted customer(s) %s could not be had: "
                    "none of their events is marked by asking, reconciliation decides",
                    report.id, ", ".join(found[:5]))
    return found


def reached_after(conn: Connection, rows: list[Any],
                  deleted_at: Mapping[str, datetime | None]) -> list[Any]:
    """The events of ``rows`` whose first call that may have reached Stripe began at or
    after their customer's deletion (plus :data:`AFTER_DELETION`): the earliest of their
    attempts answered ``delivered`` or ``unknown`` (claim taken over or not) and their
    ``first_unknown_at``. An event with neither is not known to be after it: left out."""
    first = first_reached(conn, [int(r.id) for r in rows])
    out = []
    for r in rows:
        at = deleted_at.get(r.stripe_customer_id)
        candidates = [t for t in (first.get(int(r.id)), as_utc(r.first_unknown_at))
                      if t is not None]
        if at is not None and candidates and min(candidates) >= at + AFTER_DELETION:
            out.append(r)
    return out


def first_reached(conn: Connection, event_ids: list[int]) -> dict[int, datetime]:
    """When the first attempt of each event that may have reached Stripe began, by id."""
    A = ATTEMPTS.c
    out: dict[int, datetime] = {}
    for i in range(0, len(event_ids), 500):
        for event_id, at in conn.execute(
                select(A.event_id, func.min(A.attempted_at))
                .where(A.event_id.in_(event_ids[i:i + 500]), A.outcome.in_(_MAY_HAVE_REACHED))
                .group_by(A.event_id)):
            when = as_utc(at)
            if when is not None:
                out[int(event_id)] = when
    return out
