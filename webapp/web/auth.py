"""Signing in and out (throttled per account and per address), the first-run page shown while
no user exists, and a person's own account: changing their password."""

from __future__ import annotations

import math
from datetime import datetime

from flask import Blueprint, Response, flash, g, redirect, request, session, url_for
from flask.typing import ResponseReturnValue

from .. import login_throttle as throttle
from ..audit import write_audit
from ..read.users import user_count
from ..users import (
    UserError,
    WrongPassword,
    authenticate,
    change_password,
    end_sessions,
    record_login,
)
from .common import now, render, svc
from .params import Text, accepts
from .security import (
    INSECURE_TRANSPORT,
    current_user,
    insecure_transport,
    require_role,
    safe_next,
    sign_in,
)

bp = Blueprint("auth", __name__)
account_bp = Blueprint("account", __name__)

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
    warning = INSECURE_TRANSPORT if insecure_transport() else None
    if request.method == "GET":
        if current_user() is not None:
            return redirect(target)
        return render("auth/login.html", next=target, email="", error=None, warning=warning)
    email = EMAIL.get().lower()
    password = PASSWORD.get()
    address = request.remote_addr or "unknown"
    keys = [throttle.account_key(email), throttle.address_key(address)]
    actor = email or "(no email given)"
    when = now()

    locked = throttle.locked_until(engine, keys, now=when)
    if locked is not None:
        # Audited once, when the lock was set: one row per refused try would let anyone grow
        # the audit log without end.
        return _too_many(email, target, locked, when)

    user = authenticate(engine, email, password)
    if user is None:
        with engine.begin() as conn:
            write_audit(conn, actor=actor, action="login_failure", note=f"from {address}",
                        now=when)
            locks = [throttle.record_failure(conn, keys[0], throttle.ACCOUNT, now=when),
                     throttle.record_failure(conn, keys[1], throttle.ADDRESS, now=when)]
            for key, until in zip(keys, locks, strict=True):
                if until is not None:
                    write_audit(conn, actor=actor, action="login_lockout",
                                note=f"{key} locked until {until.isoformat()} after "
                                     f"repeated failures (from {address})", now=when)
        until = max((u for u in locks if u is not None), default=None)
        if until is not None:
            return _too_many(email, target, until, when)
        return render("auth/login.html", status=401, next=target, email=email, warning=warning,
                      error="Wrong email or password, or the account is deactivated.")

    with engine.begin() as conn:
        throttle.clear(conn, keys[0])
        record_login(conn, user.id, now=when)
        write_audit(conn, actor=user.email, action="login", note=f"from {address}", now=when)
    sign_in(user.id, user.session_generation)
    if user.must_change_password:
        return redirect(url_for("account.password"), code=303)
    return redirect(target, code=303)


def _locked(template: str, until: datetime, when: datetime, what: str,
            **context: object) -> Response:
    """429 with ``Retry-After``: ``template`` saying to try again in N minutes."""
    seconds = max(1, math.ceil((until - when).total_seconds()))
    minutes = max(1, math.ceil(seconds / 60))
    resp = render(template, status=429, **context,
                  error=f"{what} Try again in {minutes} minute{'s' if minutes != 1 else ''}.")
    resp.headers["Retry-After"] = str(seconds)
    return resp


def _too_many(email: str, target: str, until: datetime, when: datetime) -> Response:
    return _locked("auth/login.html", until, when, "Too many failed log-ins for this account "
                   "or from this address.", next=target, email=email, warning=None)


@bp.post("/logout")
def logout() -> ResponseReturnValue:
    """End every session of the signed-in user, on every device (a POST with the CSRF token,
    so no page can sign you out)."""
    user = current_user()
    if user is not None:
        end_sessions(svc().engine, user.id, now=now(), actor=user.email, action="logout")
    session.clear()
    flash("You are signed out.", "info")
    return redirect(url_for("auth.login"), code=303)


CURRENT_PASSWORD = Text("current_password", 1024, source="form", strip=False)
NEW_PASSWORD = Text("new_password", 1024, source="form", strip=False)
CONFIRM_PASSWORD = Text("confirm_password", 1024, source="form", strip=False)


@account_bp.route("/account/password", methods=["GET", "POST"])
@require_role("viewer")
@accepts(CURRENT_PASSWORD, NEW_PASSWORD, CONFIRM_PASSWORD)
def password() -> ResponseReturnValue:
    """Change your own password; the current one is required. Every other session ends."""
    user = current_user()
    assert user is not None
    if request.method == "GET":
        return render("auth/password.html", error=None, forced=_forced())
    new = NEW_PASSWORD.get()
    if new != CONFIRM_PASSWORD.get():
        return render("auth/password.html", status=400, forced=_forced(),
                      error="The new password and its confirmation differ.")
    # The current password is checked like a log-in: a session alone (a copied cookie, an
    # unlocked laptop) must not be a way to guess it without limit.
    engine, when, key = svc().engine, now(), throttle.account_key(user.email)
    locked = throttle.locked_until(engine, [key], now=when)
    if locked is not None:
        return _too_many_changes(locked, when)
    try:
        generation = change_password(engine, user.id, CURRENT_PASSWORD.get(), new, now=when)
    except WrongPassword as exc:
        with engine.begin() as conn:
            write_audit(conn, actor=user.email, action="password_change_failure",
                        note="wrong current password", now=when)
            until = throttle.record_failure(conn, key, throttle.ACCOUNT, now=when)
            if until is not None:
                write_audit(conn, actor=user.email, action="login_lockout",
                            note=f"{key} locked until {until.isoformat()} after repeated "
                                 "wrong current passwords", now=when)
        if until is not None:
            return _too_many_changes(until, when)
        return render("auth/password.html", status=400, error=str(exc), forced=_forced())
    except UserError as exc:
        return render("auth/password.html", status=400, error=str(exc), forced=_forced())
    sign_in(user.id, generation)  # this session goes on; every other one has ended
    flash("Password changed. Every other session of yours has been signed out.", "ok")
    return redirect(url_for("dashboard.overview"), code=303)


def _too_many_changes(until: datetime, when: datetime) -> Response:
    return _locked("auth/password.html", until, when, "Too many wrong current passwords.",
                   forced=_forced())


def _forced() -> bool:
    """The signed-in person must change their password before anything else."""
    return bool(g.get("must_change_password"))
