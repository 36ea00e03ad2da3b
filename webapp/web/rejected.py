"""Rejected events: Stripe accepted the call, then reported the event invalid — nothing was
billed. Find them, read why in plain words, fix the cause, then requeue them (under a new
identifier) or resolve them. "Requeue all matching" previews the exact ids first, signed into
the form, like the dead letters' (requeue and resolve of selected events are theirs)."""

from __future__ import annotations

from flask import Blueprint, flash, redirect, request, url_for
from flask.typing import ResponseReturnValue

from ..outbox import operations
from ..read import rejected as reads
from ..read.dead_letters import MAX_BULK
from ..read.paging import MAX_PAGE
from .common import now, read_snapshot, render, sign_snapshot, svc
from .errors import back_to
from .params import SNAPSHOT, Text, accepts, page_fields
from .security import current_user, require_role

bp = Blueprint("rejected", __name__)
#: Signs the preview of a bulk requeue (see ``common.sign_snapshot``).
SNAPSHOT_SALT = "requeue-rejected-v1"

FILTERS = tuple(Text(name, 200) for name in ("tenant", "meter", "code"))
LIMIT, AFTER, BEFORE = page_fields(50, MAX_PAGE)


def _filters() -> reads.RejectedFilters:
    return reads.RejectedFilters(**{f.name: f.get() for f in FILTERS})



@bp.get("/rejected")
@require_role("viewer")
@accepts(*FILTERS, LIMIT, AFTER, BEFORE)
def index() -> ResponseReturnValue:
    """Rejected events, newest report first, with their reasons and groups."""
    filters = _filters()
    limit = LIMIT.get()
    page = reads.rejected(svc().engine, filters, now=now(), after=AFTER.get(),
                          before=BEFORE.get(), limit=limit)
    groups = reads.rejected_groups(svc().engine, filters)
    return render("rejected/index.html", page=page, groups=groups, f=filters, limit=limit,
                  reasons=operations.RESOLVE_REASONS, here=request.full_path.rstrip("?"))


@bp.get("/rejected/requeue-all")
@require_role("operator")
@accepts(*FILTERS)
def requeue_all_preview() -> ResponseReturnValue:
    """What "requeue all matching" would do, with the exact ids signed into the form."""
    filters = _filters()
    preview = reads.requeue_preview(svc().engine, filters, now=now(), cap=MAX_BULK)
    user = current_user()
    assert user is not None
    token = sign_snapshot(SNAPSHOT_SALT, user.id, ok=preview.ok_ids,
                          filters=filters.params())
    return render("rejected/preview.html", p=preview, f=filters, token=token,
                  max_bulk=MAX_BULK)


@bp.post("/rejected/requeue-all")
@require_role("operator")
@accepts(SNAPSHOT)
def requeue_all() -> ResponseReturnValue:
    """Requeue exactly the previewed ids, each under a new identifier."""
    user = current_user()
    assert user is not None
    snap = read_snapshot(SNAPSHOT_SALT, user.id, SNAPSHOT.get())
    ids = [int(i) for i in snap.get("ok", [])]
    back = url_for("rejected.index", **snap.get("filters", {}))
    if not ids:
        flash("Nothing to requeue.", "error")
        return redirect(back, code=303)
    back_to(back)
    note = "requeue all matching rejected " + (
        ", ".join(f"{k}={v}" for k, v in snap.get("filters", {}).items()) or "(no filter)")
    result = operations.requeue(svc().engine, ids, actor=user.email, now=now(),
                                window_seconds=svc().settings.dedupe_window_seconds, note=note)
    flash(f"Requeued {len(result.event_ids):,} event(s), each under a new identifier.", "ok")
    # On to what becomes of them: the events list of this action's audit entry.
    return redirect(url_for("events.find", audit=result.audit_id), code=303)
