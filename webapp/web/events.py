"""One event: every field, every call made for it, and the audit entries touching it."""

from __future__ import annotations

from flask import Blueprint, abort, flash, redirect, url_for
from flask.typing import ResponseReturnValue

from ..outbox.operations import RESOLVE_REASONS
from ..read.dead_letters import check_row
from ..read.events import event_detail, find_event
from .common import arg, now, render, svc
from .security import require_role

bp = Blueprint("events", __name__)


@bp.get("/events/<int:event_id>")
@require_role("viewer")
def show(event_id: int) -> ResponseReturnValue:
    """The event page (its status panel refreshes while the event is still moving)."""
    detail = event_detail(svc().engine, event_id)
    if detail is None:
        abort(404, f"There is no event {event_id}.")
    ev = detail.event
    requeue = (check_row(ev, now=now(),
                         window_seconds=svc().settings.dedupe_window_seconds).value
               if ev["status"] == "dead" else None)
    return render("events/show.html", d=detail, ev=ev, requeue=requeue,
                  reasons=RESOLVE_REASONS)


@bp.get("/events")
@require_role("viewer")
def find() -> ResponseReturnValue:
    """Jump to an event by id or by idempotency key."""
    q = arg("q", max_len=100)
    if q:
        found = find_event(svc().engine, q)
        if found is not None:
            return redirect(url_for("events.show", event_id=found))
        flash(f"No event has the id or idempotency key {q!r}.", "error")
    return redirect(url_for("dashboard.overview"))
