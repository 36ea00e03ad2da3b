"""One event: every field, every call made for it, what Stripe reported about it, the audit
entries touching it; and, for operators, cancelling it at Stripe within 24 hours."""

from __future__ import annotations

from flask import Blueprint, abort, flash, redirect, url_for
from flask.typing import ResponseReturnValue

from ..outbox.guards import CANCEL_REFUSALS, CancelCheck, cancel_check
from ..outbox.ids import CUSTOMER_ID_PATTERN
from ..outbox.operations import RESOLVE_REASONS
from ..read import event_filters
from ..read import event_list as lists
from ..read.dead_letters import check_row
from ..read.events import EventDetail, event_detail
from ..read.rejected import reason_text
from ..read.tracking import tracking
from ..read.words import CANCEL_WORDS
from ..status import ALL, NEEDS_A_PERSON, REJECTED
from ..worker import cancel_events
from .common import csv_response, now, render, svc
from .errors import back_to
from .params import (
    MAX_ID,
    NOTE,
    REASON,
    Choices,
    Day,
    Flag,
    Ids,
    Int,
    IntRange,
    InvalidParameter,
    Text,
    accepts,
)
from .security import current_user, require_role

bp = Blueprint("events", __name__)

CONFIRM = Flag("confirm")
Q = Text("q", 100)

#: The events list's filters (``read.event_filters.EventFilters``).
STATUS = Choices("status", ALL)
TENANT = Text("tenant", 100)
CUSTOMER = Text("customer", 255, pattern=CUSTOMER_ID_PATTERN)
METER = Text("meter", 100)
CREATED_FROM, CREATED_TO = Day("created_from"), Day("created_to")
OCCURRED_FROM, OCCURRED_TO = Day("occurred_from"), Day("occurred_to")
SENT_FROM, SENT_TO = Day("sent_from"), Day("sent_to")
DUE = Flag("due", on="1", source="query")
AGE = Text("age", 10, choices=event_filters.AGES)
CODE = Text("code", 100)
ERROR_CLASS = Text("error_class", 100)
HTTP = Text("http", 3, pattern=r"[0-9]{3}|-")
WHY = Text("why", 30, choices=event_filters.WHY)
REJECT_CODE = Text("reject_code", 100)
OUTCOME = Text("outcome", 20, pattern=r"[a-z_]+")
AUDIT_ID = Ids("audit", max_count=10, source="query")
ATTEMPTS = IntRange("attempts", 0, 1_000_000)
#: A billing period, ``START-END`` in Unix seconds: the events that occurred in it.
PERIOD = IntRange("period", 0, 253_402_300_799)
#: A meter event stream request's ``Idempotency-Key``: the events it carried.
REQUEST = Text("request", 255, pattern=r"[A-Za-z0-9_:~.-]+")
#: A Stripe error report's id: the events its errors were traced to.
REPORT = Text("report", 255)
#: Where the events came from: python, sql, http or http:<token name>.
SOURCE = Text("source", 120, pattern=r"python|sql|http|http:.+")
#: An invoice line (``<invoice id>/<subscription item id>``) and where its events stand.
LINE = Text("line", 511, pattern=r"[A-Za-z0-9_]+/[A-Za-z0-9_]+")
PLACE = Text("place", 10, choices=event_filters.PLACES)
#: Usage on no invoice, by why (``any``: all of it).
UNBILLED = Text("unbilled", 10, choices=event_filters.UNBILLED)
LIST_FILTERS = (STATUS, TENANT, CUSTOMER, METER, CREATED_FROM, CREATED_TO, OCCURRED_FROM,
                OCCURRED_TO, SENT_FROM, SENT_TO, DUE, AGE, CODE, ERROR_CLASS, HTTP, WHY,
                REJECT_CODE, OUTCOME, AUDIT_ID, ATTEMPTS, REQUEST, REPORT, PERIOD, SOURCE,
                LINE, PLACE, UNBILLED)
LIMIT = Int("limit", 1, lists.MAX_LIMIT, default=lists.DEFAULT_LIMIT, clamp=True)
BEFORE = Int("before", 1, MAX_ID)


def list_filters() -> event_filters.EventFilters:
    """The events list's filters from this request (declared by the view)."""
    attempts = ATTEMPTS.get()
    lo, hi = attempts if attempts is not None else (None, None)
    period = PERIOD.get()
    start, end = period if period is not None else (None, None)
    if bool(LINE.get()) != bool(PLACE.get()):
        raise InvalidParameter("place", "goes with line: the events behind one figure of an "
                                        "invoice line")
    return event_filters.EventFilters(
        status=STATUS.get(), tenant=TENANT.get(), customer=CUSTOMER.get(), meter=METER.get(),
        created_from=CREATED_FROM.get(), created_to=CREATED_TO.get(),
        occurred_from=OCCURRED_FROM.get(), occurred_to=OCCURRED_TO.get(),
        sent_from=SENT_FROM.get(), sent_to=SENT_TO.get(), due=DUE.get(), age=AGE.get(),
        code=CODE.get(), error_class=ERROR_CLASS.get(), http=HTTP.get(), why=WHY.get(),
        reject_code=REJECT_CODE.get(), outcome=OUTCOME.get(), audit=tuple(AUDIT_ID.get()),
        attempts_min=lo, attempts_max=hi, request=REQUEST.get(), report=REPORT.get(),
        period_start=start, period_end=end, source=SOURCE.get(), line=LINE.get(),
        place=PLACE.get(), unbilled=UNBILLED.get())


def _detail(event_id: int) -> EventDetail:
    detail = event_detail(svc().engine, event_id)
    if detail is None:
        abort(404, f"There is no event {event_id}. Sent, resolved and cancelled events are "
                   f"removed {svc().settings.retention_days} days after their last change "
                   "(their usage stays counted): it may have been one of those.")
    return detail


@bp.get("/events/<id:event_id>")
@require_role("viewer")
def show(event_id: int) -> ResponseReturnValue:
    """The event page (its status panel refreshes while the event is still moving)."""
    detail = _detail(event_id)
    ev = detail.event
    requeue = (check_row(ev, now=now(),
                         window_seconds=svc().settings.dedupe_window_seconds).value
               if ev["status"] in NEEDS_A_PERSON else None)
    cancel = cancel_check(status=ev["status"], sent_at=ev["sent_at"], now=now())
    reason = (reason_text(ev["reject_code"], customer=ev["stripe_customer_id"],
                          meter=ev["meter"], message=ev["reject_message"])
              if ev["status"] == REJECTED else None)
    return render("events/show.html", d=detail, ev=ev, requeue=requeue,
                  reasons=RESOLVE_REASONS, cancel=cancel.value, reject_reason=reason)


@bp.get("/events/<id:event_id>/cancel")
@require_role("operator")
def cancel_confirm(event_id: int) -> ResponseReturnValue:
    """What a cancel at Stripe does (and does not do), before it is done."""
    detail = _detail(event_id)
    ev = detail.event
    check = cancel_check(status=ev["status"], sent_at=ev["sent_at"], now=now())
    if check is not CancelCheck.OK:
        abort(409, f"Event {event_id} cannot be cancelled: {CANCEL_REFUSALS[check]}.")
    return render("events/cancel.html", ev=ev, reasons=RESOLVE_REASONS)


@bp.post("/events/<id:event_id>/cancel")
@require_role("operator")
@accepts(CONFIRM, REASON, NOTE)
def cancel(event_id: int) -> ResponseReturnValue:
    """Cancel the event at Stripe (a meter event adjustment), then record it."""
    user = current_user()
    assert user is not None
    back = url_for("events.show", event_id=event_id)
    back_to(back)
    gateway = svc().gateway()
    if gateway is None:
        flash("STRIPE_API_KEY is not set: Stripe cannot be asked.", "error")
        return redirect(back, code=303)
    if not CONFIRM.get():
        flash("Nothing changed: tick the confirmation to cancel the event at Stripe.", "error")
        return redirect(url_for("events.cancel_confirm", event_id=event_id), code=303)
    outcome = cancel_events(svc().engine, gateway, [event_id], actor=user.email,
                            reason=REASON.get(), note=NOTE.get(), now=now())
    for done, adjustment in outcome.adjustments.items():
        flash(f"Event {done} is cancelled at Stripe: {adjustment.words()}. Its usage "
              f"comes off the meter. {CANCEL_WORDS.finalized_invoice}", "ok")
    for _, why in outcome.refused:
        flash(f"Nothing changed: {why}", "error")
    return redirect(back, code=303)


@bp.get("/events")
@require_role("viewer")
@accepts(Q, *LIST_FILTERS, LIMIT, BEFORE)
def find() -> ResponseReturnValue:
    """With ``q`` (the old jump box's address, kept for bookmarks and scripts): the search,
    which goes straight to a single hit. Without: the events list, filtered (each filter
    shown, removable), newest first, keyset-paginated by id."""
    q = Q.get()
    if q:
        return redirect(url_for("search.index", q=q))
    filters = list_filters()
    limit = LIMIT.get()
    page = lists.event_list(svc().engine, filters, now=now(), before=BEFORE.get(), limit=limit)
    track = tracking(svc().engine, filters.audit) if filters.audit else None
    params = dict(filters.params(), **({"limit": limit} if limit != lists.DEFAULT_LIMIT
                                       else {}))
    return render("events/index.html", page=page, f=filters, params=params, limit=limit,
                  track=track, statuses=ALL, ages=event_filters.AGES,
                  sources=event_filters.SOURCES, paged=BEFORE.get() is not None,
                  poll_url=url_for("events.find", **params, before=BEFORE.get()))


@bp.get("/events.csv")
@require_role("viewer")
@accepts(*LIST_FILTERS)
def export() -> ResponseReturnValue:
    """Every event the list shows for the same filters, as CSV (streamed)."""
    rows = lists.export_rows(svc().engine, list_filters(), now=now())
    return csv_response(f"events-{now():%Y%m%d-%H%M%S}.csv", lists.CSV_HEADER, rows)
