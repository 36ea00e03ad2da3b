"""People (admin only): list, create with a role, change a role, deactivate and reactivate,
end someone's sessions, reset a password. Each change that alters what a person may do ends
their sessions at once, and every one is audited."""

from __future__ import annotations

from flask import Blueprint, flash, redirect, url_for
from flask.typing import ResponseReturnValue

from ..read.users import users_list
from ..users import (
    MIN_PASSWORD,
    ROLES,
    UserError,
    create_user,
    end_sessions,
    reset_password,
    set_active,
    set_role,
)
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
    """Create a user with a role and an initial password (they can change it from their
    account page)."""
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


def _acting_admin(user_id: int, verb: str) -> str:
    """The signed-in admin's email, for an action on ``user_id``; refused (a message on the
    users page, nothing changed) when it is the admin themselves."""
    admin = current_user()
    assert admin is not None
    back_to(url_for("users.index"))
    if user_id == admin.id:
        raise UserError(f"you cannot {verb} yourself here; use your account page or another "
                        "admin")
    return admin.email


@bp.post("/users/<id:user_id>/role")
@require_role("admin")
@accepts(ROLE)
def change_role(user_id: int) -> ResponseReturnValue:
    """Give a user another role; their sessions end so the new role applies at once."""
    actor = _acting_admin(user_id, "change the role of")
    role = ROLE.get()
    email = set_role(svc().engine, user_id, role, now=now(), actor=actor)
    flash(f"{email} is now {role}; their sessions have ended.", "ok")
    return redirect(url_for("users.index"), code=303)


@bp.post("/users/<id:user_id>/end-sessions")
@require_role("admin")
def end_user_sessions(user_id: int) -> ResponseReturnValue:
    """Sign a user out everywhere (a lost laptop, a shared screen)."""
    actor = _acting_admin(user_id, "end the sessions of")
    email = end_sessions(svc().engine, user_id, now=now(), actor=actor)
    flash(f"Every session of {email} has ended.", "ok")
    return redirect(url_for("users.index"), code=303)


@bp.post("/users/<id:user_id>/reset-password")
@require_role("admin")
def reset(user_id: int) -> ResponseReturnValue:
    """A new random password, shown once on this page (never put in a cookie or a log); the
    user must change it at their next log-in."""
    actor = _acting_admin(user_id, "reset the password of")
    email, password = reset_password(svc().engine, user_id, now=now(), actor=actor)
    return render("users/reset.html", email=email, password=password)
