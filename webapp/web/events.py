"""One event: every field, every call made for it, and the audit entries touching it."""

from __future__ import annotations

from flask import Blueprint, abort, flash, redirect, url_for
from flask.typing import ResponseReturnValue
from sqlalchemy import select

from .. import queries
from ..outbox import ops
from .common import arg, now, render, svc
from .security import require_role

bp = Blueprint("events", __name__)


@bp.get("/events/<int:event_id>")
@require_role("viewer")
def show(event_id: int) -> ResponseReturnValue:
    """The event page (its status panel refreshes while the event is still moving)."""
    detail = queries.event_detail(svc().engine, event_id)
    if detail is None:
        abort(404, f"There is no event {event_id}.")
    ev = detail.event
    requeue = (queries.requeue_class(ev, now=now(),
                                     window_seconds=svc().settings.dedupe_window_seconds)
               if ev["status"] == "dead" else None)
    return render("events/show.html", d=detail, ev=ev, requeue=requeue,
                  reasons=ops.RESOLVE_REASONS)


@bp.get("/events")
@require_role("viewer")
def find() -> ResponseReturnValue:
    """Jump to an event by id or by idempotency key."""
    q = arg("q", max_len=100)
    if q.isdigit():
        return redirect(url_for("events.show", event_id=int(q)))
    if q:
        with svc().engine.connect() as conn:
            found = conn.execute(select(queries.T.c.id)
                                 .where(queries.T.c.idempotency_key == q)).scalar()
        if found is not None:
            return redirect(url_for("events.show", event_id=found))
        flash(f"No event has the id or idempotency key {q!r}.", "error")
    return redirect(url_for("dashboard.overview"))
