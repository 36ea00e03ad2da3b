"""People (admin only): list, create with a role, deactivate and reactivate."""

from __future__ import annotations

from flask import Blueprint, flash, redirect, url_for
from flask.typing import ResponseReturnValue

from ..read.users import users_list
from ..users import MIN_PASSWORD, ROLES, create_user, set_active
from .common import now, render, svc
from .errors import back_to
from .params import Text, accepts
from .security import current_user, require_role

bp = Blueprint("users", __name__)

EMAIL = Text("email", 254, source="form")
ROLE = Text("role", 20, source="form")
PASSWORD = Text("password", 1024, source="form", strip=False)


@bp.get("/users")
@require_role("admin")
def index() -> ResponseReturnValue:
    return render("users/index.html", users=users_list(svc().engine), roles=ROLES,
                  min_password=MIN_PASSWORD)


@bp.post("/users")
@require_role("admin")
@accepts(EMAIL, ROLE, PASSWORD)
def create() -> ResponseReturnValue:
    """Create a user with a role and an initial password (they should change it… by asking
    an admin: password changes are a later feature)."""
    email = EMAIL.get()
    role = ROLE.get()
    admin = current_user()
    assert admin is not None
    back_to(url_for("users.index"))
    create_user(svc().engine, email, PASSWORD.get(), role, now=now(),
                actor=admin.email)
    flash(f"Created {email.lower()} ({role}).", "ok")
    return redirect(url_for("users.index"), code=303)


@bp.post("/users/<id:user_id>/deactivate")
@require_role("admin")
def deactivate(user_id: int) -> ResponseReturnValue:
    """Deactivate a user: their sessions end at their next request."""
    admin = current_user()
    assert admin is not None
    if user_id == admin.id:
        flash("You cannot deactivate yourself.", "error")
        return redirect(url_for("users.index"), code=303)
    return _set_active(user_id, False)


@bp.post("/users/<id:user_id>/activate")
@require_role("admin")
def activate(user_id: int) -> ResponseReturnValue:
    return _set_active(user_id, True)


def _set_active(user_id: int, active: bool) -> ResponseReturnValue:
    admin = current_user()
    assert admin is not None
    back_to(url_for("users.index"))
    email = set_active(svc().engine, user_id, active, now=now(), actor=admin.email)
    flash(f"{email} {'reactivated' if active else 'deactivated'}.", "ok")
    return redirect(url_for("users.index"), code=303)
