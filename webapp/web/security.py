"""Who is asking and what they may do: the signed-in user, roles, CSRF, security headers.

Installed on the app by :func:`init_app`; blueprints only use :func:`require_role`,
:func:`current_user` and :func:`csrf_token`.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any, TypeVar
from urllib.parse import urlsplit

from flask import Flask, Response, abort, g, redirect, request, session, url_for

from ..read.users import signed_in_user
from ..services import services_of
from ..users import ROLES, has_role, same_token
from .params import CSRF_TOKEN

F = TypeVar("F", bound=Callable[..., Any])

#: Endpoints that answer without a session and never touch the user table.
PUBLIC = frozenset({"static", "health.healthz", "health.readyz", "metrics.metrics",
                    "auth.login", "auth.logout", "webhook.receive"})
#: Endpoints whose POSTs carry Stripe's signature instead of a session's CSRF token.
SIGNED_BY_STRIPE = frozenset({"webhook.receive"})

# Only our own scripts and styles: no inline script or style anywhere (htmx's own indicator
# style is turned off in base.html's htmx-config), no framing, no plugins.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
       "form-action 'self'; frame-ancestors 'none'")


@dataclass(frozen=True)
class CurrentUser:
    id: int
    email: str
    role: str

    def can(self, role: str) -> bool:
        return has_role(self.role, role)


def current_user() -> CurrentUser | None:
    """The signed-in user of this request, if any."""
    user = g.get("user")
    return user if isinstance(user, CurrentUser) else None


def csrf_token() -> str:
    """This session's CSRF token (created on first use)."""
    token = session.get("csrf")
    if not token:
        token = session["csrf"] = secrets.token_urlsafe(32)
    return str(token)


def is_htmx() -> bool:
    return request.headers.get("HX-Request") == "true"


def safe_next(target: str | None, default: str) -> str:
    """``target`` if it is a path on this site, else ``default`` (no open redirects)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return default
    parts = urlsplit(target)
    if parts.scheme or parts.netloc:
        return default
    return target


def login_redirect() -> Response:
    """Send an anonymous request to the log-in page (htmx: with ``HX-Redirect``)."""
    if is_htmx() and request.headers.get("HX-Current-URL"):
        # A poll or a fragment: come back to the page the browser shows, not the fragment.
        current = urlsplit(request.headers["HX-Current-URL"])
        here = current.path + (f"?{current.query}" if current.query else "")
    elif request.method == "GET":
        here = request.full_path
    else:
        here = urlsplit(request.referrer or "/").path
    here = here[:-1] if here.endswith("?") else here
    target = url_for("auth.login", next=safe_next(here, "/"))
    if is_htmx():
        resp = Response("", status=401)
        resp.headers["HX-Redirect"] = target
        return resp
    return redirect(target)  # type: ignore[return-value]


def require_role(role: str) -> Callable[[F], F]:
    """Decorate a view: anonymous → log-in page; signed in without ``role`` → 403."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}")

    def decorate(view: F) -> F:
        @wraps(view)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            user = current_user()
            if user is None:
                return login_redirect()
            if not user.can(role):
                abort(403, f"This needs the {role} role; you are signed in as {user.role}.")
            return view(*args, **kwargs)

        wrapped.required_role = role  # type: ignore[attr-defined]
        return wrapped  # type: ignore[return-value]

    return decorate


def sign_in(user_id: int) -> None:
    """Start a fresh session for ``user_id``: nothing from before survives (no fixation)."""
    session.clear()
    session["uid"] = int(user_id)
    session["csrf"] = secrets.token_urlsafe(32)
    session.permanent = True


def init_app(app: Flask) -> None:
    """Install the user loader, the CSRF check and the security headers."""

    @app.before_request
    def load_user() -> None:
        g.user = None
        if request.endpoint in PUBLIC - {"auth.login", "auth.logout"}:
            return
        uid = session.get("uid")
        if uid is None:
            return
        row = signed_in_user(services_of(app).engine, int(uid))
        if row is None or not row["active"]:
            session.clear()  # deactivated or deleted: the session ends now
            return
        g.user = CurrentUser(row["id"], row["email"], row["role"])

    @app.before_request
    def check_csrf() -> None:
        # Every mutation is a POST, and every POST carries the session's token: in a hidden
        # form field, or in the X-CSRF-Token header that htmx sends from <body hx-headers>.
        if request.method in ("GET", "HEAD", "OPTIONS") or request.endpoint in SIGNED_BY_STRIPE:
            return
        sent = request.headers.get("X-CSRF-Token") or CSRF_TOKEN.parse()
        if not same_token(sent, session.get("csrf")):
            abort(400, "The form's security token is missing or out of date. "
                       "Reload the page and try again.")

    @app.after_request
    def headers(resp: Response) -> Response:
        h = resp.headers
        h.setdefault("Content-Security-Policy", CSP)
        h.setdefault("X-Frame-Options", "DENY")
        h.setdefault("X-Content-Type-Options", "nosniff")
        h.setdefault("Referrer-Policy", "same-origin")
        h.setdefault("Cross-Origin-Opener-Policy", "same-origin")
        h.setdefault("Permissions-Policy", "camera=(), microphone=(), geolocation=()")
        if request.endpoint != "static":
            # Billing data: never kept by a shared cache or the back button of a kiosk.
            h.setdefault("Cache-Control", "no-store")
        return resp
