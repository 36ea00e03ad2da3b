"""Dead letters: find them, understand them, requeue or resolve them.

"Requeue all matching" is two steps. The preview snapshots the matching ids and signs them
(itsdangerous, keyed by SECRET_KEY) into the form; the action requeues exactly those ids,
never rows that died after the preview. ``operations.requeue`` is all or nothing, so a snapshot of
which any event changed meanwhile is refused whole and the operator previews again.
"""

from __future__ import annotations

from flask import Blueprint, abort, flash, redirect, request, url_for
from flask.typing import ResponseReturnValue

from ..outbox import operations
from ..outbox.guards import REQUEUE_BULK_WORDS
from ..read import dead_letters as reads
from ..read.paging import MAX_PAGE
from ..status import DEAD
from .common import now, read_snapshot, render, sign_snapshot, svc
from .errors import back_to
from .params import NEXT, NOTE, REASON, SNAPSHOT, Flag, Ids, Text, accepts, page_fields
from .security import current_user, require_role, safe_next

bp = Blueprint("dead_letters", __name__)
#: Signs the preview of a bulk requeue (see ``common.sign_snapshot``).
SNAPSHOT_SALT = "requeue-all-v1"

STATUS = Text("status", 20, choices=reads.DEAD_STATUSES, default=DEAD)
AGE = Text("age", 20, choices=reads.AGES)
TEXT_FILTERS = tuple(Text(name, 200) for name in ("tenant", "meter", "code", "error_class", "q"))
FILTERS = (STATUS, AGE, *TEXT_FILTERS)
LIMIT, AFTER, BEFORE = page_fields(50, MAX_PAGE)
IDS = Ids("ids", max_count=reads.MAX_BULK)
FORCE = Flag("force", on="1")
CONFIRM_FORCE = Flag("confirm_force")
INCLUDE_FORCED = Flag("include_forced")


def _filters() -> reads.DeadFilters:
    texts = {f.name: f.get() for f in TEXT_FILTERS}
    return reads.DeadFilters(status=STATUS.get(), age=AGE.get(), **texts)


def _window() -> float:
    return svc().settings.dedupe_window_seconds



@bp.get("/dead-letters")
@require_role("viewer")
@accepts(*FILTERS, LIMIT, AFTER, BEFORE)
def index() -> ResponseReturnValue:
    """Dead (or resolved) events, filtered, newest death first, keyset-paginated."""
    filters = _filters()
    limit = LIMIT.get()
    page = reads.dead_letters(svc().engine, filters, now=now(), window_seconds=_window(),
                              after=AFTER.get(), before=BEFORE.get(), limit=limit)
    return render("dead_letters/index.html", page=page, f=filters, limit=limit,
                  ages=reads.AGES, statuses=reads.DEAD_STATUSES,
                  reasons=operations.RESOLVE_REASONS, here=request.full_path.rstrip("?"))


@bp.get("/dead-letters/groups")
@require_role("viewer")
@accepts(*FILTERS)
def groups() -> ResponseReturnValue:
    """The matching events grouped by error (loaded into the dead-letter page by htmx)."""
    filters = _filters()
    data = reads.dead_letter_groups(svc().engine, filters, now=now())
    return render("dead_letters/groups.html", groups=data, f=filters, kinds=reads.KINDS)


@bp.post("/dead-letters/requeue")
@require_role("operator")
@accepts(IDS, NEXT, FORCE, CONFIRM_FORCE)
def requeue() -> ResponseReturnValue:
    """Requeue the selected dead events. Those whose outcome is unknown past Stripe's 24-hour
    window need an explicit, confirmed force (the CLI's ``--force``)."""
    ids = IDS.get()
    back = _back()
    if not ids:
        flash("Select at least one event.", "error")
        return redirect(back, code=303)
    classes = reads.classify_for_requeue(svc().engine, ids, now=now(),
                                           window_seconds=_window())
    if classes["wrong_status"] or classes["too_old"]:
        flash(_refusal(classes), "error")
        return redirect(back, code=303)
    if classes["force"] and not (FORCE.get() and CONFIRM_FORCE.get()):
        return render("dead_letters/confirm_force.html", status=409, ids=ids,
                      force_ids=classes["force"], back=back)
    return _do_requeue(classes["ok"], classes["force"], back, note=None)


@bp.post("/dead-letters/resolve")
@require_role("operator")
@accepts(IDS, NEXT, REASON, NOTE)
def resolve() -> ResponseReturnValue:
    """Close the selected dead events with a reason code and a note (kept in history)."""
    ids = IDS.get()
    back = _back()
    back_to(back)
    user = current_user()
    assert user is not None
    result = operations.resolve(svc().engine, ids, actor=user.email,
                                reason=REASON.get(), note=NOTE.get(), now=now())
    flash(f"Resolved {len(result.event_ids):,} event(s).", "ok")
    return redirect(back, code=303)


@bp.get("/dead-letters/requeue-all")
@require_role("operator")
@accepts(*FILTERS)
def requeue_all_preview() -> ResponseReturnValue:
    """What "requeue all matching" would do, with the exact ids signed into the form."""
    filters = _filters()
    if filters.status != DEAD:
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
@accepts(SNAPSHOT, INCLUDE_FORCED)
def requeue_all() -> ResponseReturnValue:
    """Requeue exactly the previewed ids (and the forced ones only if confirmed)."""
    user = current_user()
    assert user is not None
    snap = read_snapshot(SNAPSHOT_SALT, user.id, SNAPSHOT.get())
    ok = [int(i) for i in snap.get("ok", [])]
    forced = [int(i) for i in snap.get("force", [])]
    if not INCLUDE_FORCED.get():
        forced = []
    back = url_for("dead_letters.index", **snap.get("filters", {}))
    if not ok and not forced:
        flash("Nothing to requeue.", "error")
        return redirect(back, code=303)
    return _do_requeue(ok, forced, back, note="requeue all matching "
                       + (", ".join(f"{k}={v}" for k, v in snap.get("filters", {}).items())
                          or "(no filter)"), track=True)


def _do_requeue(ok: list[int], forced: list[int], back: str, *, note: str | None,
                track: bool = False) -> ResponseReturnValue:
    """Requeue ``ok`` normally and ``forced`` with force: two all-or-nothing steps, so a
    forced resend never clears the unknown-outcome clock of an event that did not need it.
    ``track``: then show what becomes of them (the events list of the audit entries)."""
    user = current_user()
    assert user is not None
    engine, window, done = svc().engine, _window(), 0
    audits: list[int] = []
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
            return redirect(_tracking(audits) if track else back, code=303)
        done += len(result.event_ids)
        audits.append(result.audit_id)
    flash(f"Requeued {done:,} event(s)" + (f", {len(forced):,} of them forced" if forced else "")
          + ".", "ok")
    return redirect(_tracking(audits) if track else back, code=303)


def _tracking(audit_ids: list[int]) -> str:
    """The page that follows what becomes of a bulk action's events."""
    return url_for("events.find", audit=audit_ids)


def _refusal(classes: dict[str, list[int]]) -> str:
    parts = [f"{words}: {_ids(classes[check.value])}"
             for check, words in REQUEUE_BULK_WORDS.items() if classes[check.value]]
    return "Nothing changed. " + "; ".join(parts)


def _ids(ids: list[int]) -> str:
    shown = ", ".join(str(i) for i in ids[:20])
    return shown + (f" and {len(ids) - 20} more" if len(ids) > 20 else "")


def _back() -> str:
    return safe_next(NEXT.get(), url_for("dead_letters.index"))

