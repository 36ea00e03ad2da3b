"""Dead letters: find them, understand them, requeue or resolve them.

"Requeue all matching" is two steps. The preview snapshots the matching ids and signs them
(itsdangerous, keyed by SECRET_KEY) into the form; the action requeues exactly those ids,
never rows that died after the preview. ``operations.requeue`` is all or nothing, so a snapshot of
which any event changed meanwhile is refused whole and the operator previews again.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, abort, flash, redirect, request, url_for
from flask.typing import ResponseReturnValue

from ..outbox import operations
from ..read import dead_letters as reads
from ..read.paging import MAX_PAGE
from .common import cursor_arg, form_ids, int_arg, now, read_snapshot, render, sign_snapshot, svc
from .errors import back_to
from .security import current_user, require_role, safe_next

bp = Blueprint("dead_letters", __name__)
#: Signs the preview of a bulk requeue (see ``common.sign_snapshot``).
SNAPSHOT_SALT = "requeue-all-v1"



def _filters(source: Any = None) -> reads.DeadFilters:
    src = request.args if source is None else source
    try:
        return reads.DeadFilters(
            status=src.get("status", "dead") or "dead",
            tenant=src.get("tenant", "").strip(), meter=src.get("meter", "").strip(),
            code=src.get("code", "").strip(), error_class=src.get("error_class", "").strip(),
            age=src.get("age", ""), q=src.get("q", "").strip())
    except ValueError as exc:
        abort(400, str(exc))


def _window() -> float:
    return svc().settings.dedupe_window_seconds



@bp.get("/dead-letters")
@require_role("viewer")
def index() -> ResponseReturnValue:
    """Dead (or resolved) events, filtered, newest death first, keyset-paginated."""
    filters = _filters()
    limit = int_arg("limit", 50, 1, MAX_PAGE)
    page = reads.dead_letters(svc().engine, filters, now=now(), window_seconds=_window(),
                                after=cursor_arg("after"), before=cursor_arg("before"),
                                limit=limit)
    return render("dead_letters/index.html", page=page, f=filters, limit=limit,
                  ages=reads.AGES, statuses=reads.DEAD_STATUSES,
                  reasons=operations.RESOLVE_REASONS, here=request.full_path.rstrip("?"))


@bp.get("/dead-letters/groups")
@require_role("viewer")
def groups() -> ResponseReturnValue:
    """The matching events grouped by error (loaded into the dead-letter page by htmx)."""
    filters = _filters()
    data = reads.dead_letter_groups(svc().engine, filters, now=now())
    return render("dead_letters/groups.html", groups=data, f=filters, kinds=reads.KINDS)


@bp.post("/dead-letters/requeue")
@require_role("operator")
def requeue() -> ResponseReturnValue:
    """Requeue the selected dead events. Those whose outcome is unknown past Stripe's 24-hour
    window need an explicit, confirmed force (the CLI's ``--force``)."""
    ids = form_ids()
    back = _back()
    if not ids:
        flash("Select at least one event.", "error")
        return redirect(back, code=303)
    classes = reads.classify_for_requeue(svc().engine, ids, now=now(),
                                           window_seconds=_window())
    if classes["wrong_status"] or classes["too_old"]:
        flash(_refusal(classes), "error")
        return redirect(back, code=303)
    force = request.form.get("force") == "1"
    if classes["force"] and not (force and request.form.get("confirm_force") == "yes"):
        return render("dead_letters/confirm_force.html", status=409, ids=ids,
                      force_ids=classes["force"], back=back)
    return _do_requeue(classes["ok"], classes["force"], back, note=None)


@bp.post("/dead-letters/resolve")
@require_role("operator")
def resolve() -> ResponseReturnValue:
    """Close the selected dead events with a reason code and a note (kept in history)."""
    ids = form_ids()
    back = _back()
    back_to(back)
    user = current_user()
    assert user is not None
    result = operations.resolve(svc().engine, ids, actor=user.email,
                                reason=request.form.get("reason", ""),
                                note=request.form.get("note", "")[:2000], now=now())
    flash(f"Resolved {len(result.event_ids):,} event(s).", "ok")
    return redirect(back, code=303)


@bp.get("/dead-letters/requeue-all")
@require_role("operator")
def requeue_all_preview() -> ResponseReturnValue:
    """What "requeue all matching" would do, with the exact ids signed into the form."""
    filters = _filters()
    if filters.status != "dead":
        abort(400, "only dead events can be requeued")
    preview = reads.requeue_preview(svc().engine, filters, now=now(),
                                      window_seconds=_window())
    user = current_user()
    assert user is not None
    token = sign_snapshot(SNAPSHOT_SALT, user.id, ok=preview.ok_ids, force=preview.force_ids,
                          filters=filters.params())
    return render("dead_letters/preview.html", p=preview, f=filters, token=token,
                  max_bulk=reads.MAX_BULK)


@bp.post("/dead-letters/requeue-all")
@require_role("operator")
def requeue_all() -> ResponseReturnValue:
    """Requeue exactly the previewed ids (and the forced ones only if confirmed)."""
    user = current_user()
    assert user is not None
    snap = read_snapshot(SNAPSHOT_SALT, user.id)
    ok = [int(i) for i in snap.get("ok", [])]
    forced = [int(i) for i in snap.get("force", [])]
    if request.form.get("include_forced") != "yes":
        forced = []
    back = url_for("dead_letters.index", **snap.get("filters", {}))
    if not ok and not forced:
        flash("Nothing to requeue.", "error")
        return redirect(back, code=303)
    return _do_requeue(ok, forced, back, note="requeue all matching "
                       + (", ".join(f"{k}={v}" for k, v in snap.get("filters", {}).items())
                          or "(no filter)"))


def _do_requeue(ok: list[int], forced: list[int], back: str, *, note: str | None
                ) -> ResponseReturnValue:
    """Requeue ``ok`` normally and ``forced`` with force: two all-or-nothing steps, so a
    forced resend never clears the unknown-outcome clock of an event that did not need it."""
    user = current_user()
    assert user is not None
    engine, window, done = svc().engine, _window(), 0
    back_to(back)
    for ids, force in ((ok, False), (forced, True)):
        if not ids:
            continue
        try:
            result = operations.requeue(engine, ids, actor=user.email, now=now(), force=force,
                                        window_seconds=window, note=note)
        except operations.OperationError as exc:
            if not done:
                raise  # nothing changed: the usual refusal
            flash(f"Requeued {done:,}; then nothing more changed: {exc}", "error")
            return redirect(back, code=303)
        done += len(result.event_ids)
    flash(f"Requeued {done:,} event(s)" + (f", {len(forced):,} of them forced" if forced else "")
          + ".", "ok")
    return redirect(back, code=303)


def _refusal(classes: dict[str, list[int]]) -> str:
    parts = []
    if classes["wrong_status"]:
        parts.append("neither dead nor rejected (any more): " + _ids(classes["wrong_status"]))
    if classes["too_old"]:
        parts.append("past Stripe's 35-day limit, resolve them instead: "
                     + _ids(classes["too_old"]))
    return "Nothing changed. " + "; ".join(parts)


def _ids(ids: list[int]) -> str:
    shown = ", ".join(str(i) for i in ids[:20])
    return shown + (f" and {len(ids) - 20} more" if len(ids) > 20 else "")


def _back() -> str:
    return safe_next(request.form.get("next"), url_for("dead_letters.index"))

