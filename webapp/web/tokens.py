"""Ingest tokens (admins): the bearer tokens of ``POST /api/v1/usage`` — make one (shown once,
on the page that answers the form, never in a redirect or a cookie), see each one's scopes,
rate and last use, revoke one. Every change is audited, as from the command line."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, flash, make_response, redirect, url_for
from flask.typing import ResponseReturnValue

from ..outbox.tokens import DEFAULT_RATE, TokenError, create_token, list_tokens, revoke_token
from .common import now, render, svc
from .params import Text, accepts
from .security import current_user, require_role

bp = Blueprint("tokens", __name__)

NAME = Text("name", 100, source="form")
RATE = Text("rate", 12, source="form", pattern=r"[0-9]+(\.[0-9]+)?")


def _page(**extra: Any) -> ResponseReturnValue:
    return render("tokens/index.html", tokens=list_tokens(svc().engine),
                  default_rate=DEFAULT_RATE, **extra)


@bp.get("/tokens")
@require_role("admin")
def index() -> ResponseReturnValue:
    return _page()


@bp.post("/tokens")
@require_role("admin")
@accepts(NAME, RATE)
def create() -> ResponseReturnValue:
    user = current_user()
    assert user is not None
    try:
        token, secret = create_token(svc().engine, NAME.get(),
                                     rate_per_second=float(RATE.get() or DEFAULT_RATE),
                                     actor=user.email, now=now())
    except TokenError as exc:
        flash(f"Nothing changed: {exc}.", "error")
        return redirect(url_for("tokens.index"), code=303)
    # The token is in this answer only: not in a redirect, a flash or the session cookie,
    # and no cache keeps it.
    resp = make_response(_page(made=token, secret=secret))
    resp.headers["Cache-Control"] = "no-store"
    return resp


@bp.post("/tokens/<path:name>/revoke")
@require_role("admin")
def revoke(name: str) -> ResponseReturnValue:
    user = current_user()
    assert user is not None
    try:
        revoke_token(svc().engine, name, actor=user.email, now=now())
    except TokenError as exc:
        flash(f"Nothing changed: {exc}.", "error")
    else:
        flash(f"Revoked {name!r}: its next request is refused.", "ok")
    return redirect(url_for("tokens.index"), code=303)
