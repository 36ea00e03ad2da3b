"""One event: every field, every call made for it, what Stripe reported about it, the audit
entries touching it; and, for operators, cancelling it at Stripe within 24 hours."""

from __future__ import annotations

from flask import Blueprint, abort, flash, redirect, url_for
from flask.typing import ResponseReturnValue

from ..outbox.operations import RESOLVE_REASONS
from ..outbox.states import CANCEL_REFUSALS, CancelCheck, cancel_check
from ..read.dead_letters import check_row
from ..read.events import EventDetail, event_detail, find_event
from ..read.rejected import reason_text
from ..worker import cancel_events
from .common import now, render, svc
from .errors import back_to
from .params import NOTE, REASON, Flag, Text, accepts
from .security import current_user, require_role

bp = Blueprint("events", __name__)

CONFIRM = Flag("confirm")
Q = Text("q", 100)


def _detail(event_id: int) -> EventDetail:
    detail = event_detail(svc().engine, event_id)
    if detail is None:
        abort(404, f"There is no event {event_id}.")
    return detail


@bp.get("/events/<id:event_id>")
@require_role("viewer")
def show(event_id: int) -> ResponseReturnValue:
    """The event page (its status panel refreshes while the event is still moving)."""
    detail = _detail(event_id)
    ev = detail.event
    requeue = (check_row(ev, now=now(),
                         window_seconds=svc().settings.dedupe_window_seconds).value
               if ev["status"] in ("dead", "rejected") else None)
    cancel = cancel_check(status=ev["status"], sent_at=ev["sent_at"], now=now())
    reason = (reason_text(ev["reject_code"], customer=ev["stripe_customer_id"],
                          meter=ev["meter"], message=ev["reject_message"])
              if ev["status"] == "rejected" else None)
    return render("events/show.html", d=detail, ev=ev, requeue=requeue,
                  reasons=RESOLVE_REASONS, cancel=cancel.value, reject_reason=reason,
                  stripe_mode=svc().settings.stripe_mode)


@bp.get("/events/<id:event_id>/cancel")
@require_role("operator")
def cancel_confirm(event_id: int) -> ResponseReturnValue:
    """What cancelling does to the invoice, before it is done."""
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
    if outcome.cancelled:
        flash(f"Event {event_id} is cancelled at Stripe: it will not be billed.", "ok")
    for _, why in outcome.refused:
        flash(f"Nothing changed: {why}", "error")
    return redirect(back, code=303)


@bp.get("/events")
@require_role("viewer")
@accepts(Q)
def find() -> ResponseReturnValue:
    """Jump to an event by id or by idempotency key."""
    q = Q.get()
    if q:
        found = find_event(svc().engine, q)
        if found is not None:
            return redirect(url_for("events.show", event_id=found))
        flash(f"No event has the id or idempotency key {q!r}.", "error")
    return redirect(url_for("dashboard.overview"))
