"""People (admin only): list, create with a role, deactivate and reactivate."""

from __future__ import annotations

from flask import Blueprint, flash, redirect, request, url_for
from flask.typing import ResponseReturnValue

from .. import queries
from ..outbox.ops import write_audit
from ..users import MIN_PASSWORD, ROLES, UserError, create_user, set_active
from .common import now, render, svc
from .security import current_user, require_role

bp = Blueprint("users", __name__)


@bp.get("/users")
@require_role("admin")
def index() -> ResponseReturnValue:
    return render("users/index.html", users=queries.users_list(svc().engine), roles=ROLES,
                  min_password=MIN_PASSWORD)


@bp.post("/users")
@require_role("admin")
def create() -> ResponseReturnValue:
    """Create a user with a role and an initial password (they should change it… by asking
    an admin: password changes are a later feature)."""
    email = request.form.get("email", "").strip()
    role = request.form.get("role", "")
    admin = current_user()
    assert admin is not None
    try:
        create_user(svc().engine, email, request.form.get("password", ""), role, now=now())
    except UserError as exc:
        flash(f"Nothing changed: {exc}", "error")
        return redirect(url_for("users.index"), code=303)
    _audit("user_create", f"{email.lower()} as {role}")
    flash(f"Created {email.lower()} ({role}).", "ok")
    return redirect(url_for("users.index"), code=303)


@bp.post("/users/<int:user_id>/deactivate")
@require_role("admin")
def deactivate(user_id: int) -> ResponseReturnValue:
    """Deactivate a user: their sessions end at their next request."""
    admin = current_user()
    assert admin is not None
    if user_id == admin.id:
        flash("You cannot deactivate yourself.", "error")
        return redirect(url_for("users.index"), code=303)
    return _set_active(user_id, False)


@bp.post("/users/<int:user_id>/activate")
@require_role("admin")
def activate(user_id: int) -> ResponseReturnValue:
    return _set_active(user_id, True)


def _set_active(user_id: int, active: bool) -> ResponseReturnValue:
    try:
        email = set_active(svc().engine, user_id, active)
    except UserError as exc:
        flash(f"Nothing changed: {exc}", "error")
        return redirect(url_for("users.index"), code=303)
    _audit("user_activate" if active else "user_deactivate", email)
    flash(f"{email} {'reactivated' if active else 'deactivated'}.", "ok")
    return redirect(url_for("users.index"), code=303)


def _audit(action: str, note: str) -> None:
    admin = current_user()
    assert admin is not None
    with svc().engine.begin() as conn:
        write_audit(conn, actor=admin.email, action=action, event_ids=[], reason_code=None,
                    note=note, now=now())
