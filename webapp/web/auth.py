"""Signing in and out, and the first-run page shown while no user exists."""

from __future__ import annotations

from flask import Blueprint, redirect, request, session, url_for
from flask.typing import ResponseReturnValue

from ..read.users import user_count
from ..users import authenticate, record_login
from .common import now, render, svc
from .params import Text, accepts
from .security import current_user, safe_next, sign_in

bp = Blueprint("auth", __name__)

NEXT = Text("next", 2000, source="either")
EMAIL = Text("email", 254, source="form")
PASSWORD = Text("password", 1024, source="form", strip=False)


@bp.route("/login", methods=["GET", "POST"])
@accepts(NEXT, EMAIL, PASSWORD)
def login() -> ResponseReturnValue:
    """The log-in form; with no user at all, how to create the first one."""
    engine = svc().engine
    target = safe_next(NEXT.get(), url_for("dashboard.overview"))
    if user_count(engine) == 0:
        return render("auth/first_run.html", status=200)
    if request.method == "GET":
        if current_user() is not None:
            return redirect(target)
        return render("auth/login.html", next=target, email="", error=None)
    email = EMAIL.get()
    user = authenticate(engine, email, PASSWORD.get())
    if user is None:
        return render("auth/login.html", status=401, next=target, email=email,
                      error="Wrong email or password, or the account is deactivated.")
    sign_in(user.id)
    record_login(engine, user.id, now=now())
    return redirect(target, code=303)


@bp.post("/logout")
def logout() -> ResponseReturnValue:
    """End the session (a POST with the CSRF token, so no page can sign you out)."""
    session.clear()
    return redirect(url_for("auth.login"), code=303)
