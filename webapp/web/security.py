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

from flask import (
    Flask,
    Response,
    abort,
    current_app,
    flash,
    g,
    redirect,
    request,
    session,
    url_for,
)

from ..read.users import signed_in_user
from ..services import services_of
from ..users import ROLES, has_role, same_token
from .params import CSRF_TOKEN

F = TypeVar("F", bound=Callable[..., Any])

#: Endpoints that answer without a session and never touch the user table.
PUBLIC = frozenset({"static", "health.healthz", "health.readyz", "metrics.metrics",
                    "auth.login", "auth.logout", "webhook.receive", "api.ingest_usage",
                    "api.openapi"})
#: Endpoints whose POSTs carry Stripe's signature, or an ingest token, instead of a
#: session's CSRF token (no session is read for them).
SIGNED_BY_STRIPE = frozenset({"webhook.receive", "api.ingest_usage"})

#: Where the ingest API answers: a bearer token is its only credential, so no session is read
#: there and no CSRF token asked for (any method, any path under it).
API_PREFIX = "/api/"

#: Endpoints a user who must change their password may still reach.
PASSWORD_CHANGE_ONLY = frozenset({"static", "account.password", "auth.logout", "auth.login"})

#: Seconds between refreshes of a session's "last seen" time (each one re-sends the cookie).
SEEN_RESOLUTION = 60

LOOPBACK = frozenset({"localhost", "127.0.0.1", "[::1]"})

#: Shown when the log-in form comes back without its cookie over plain http.
INSECURE_TRANSPORT = (
    "This page was opened over plain http, but the sign-in cookie is set to travel over HTTPS "
    "only (SESSION_COOKIE_SECURE is on), so the browser did not send it back and you cannot "
    "sign in. Open the dashboard at its https:// address. On a private test machine only, "
    "set SESSION_COOKIE_SECURE=false instead.")

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


def is_background_poll() -> bool:
    """A page refreshing itself (an htmx poll from an element whose id ends in ``-live``), not
    a person: it does not keep an idle session alive, so a laptop left open still signs out."""
    return is_htmx() and request.headers.get("HX-Trigger", "").endswith("-live")


def safe_next(target: str | None, default: str) -> str:
    """``target`` if it is a path on this site, else ``default`` (no open redirects)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return default
    # Browsers drop tabs and newlines from URLs ("/\t/evil.example" becomes "//evil.example").
    if len(target) > 2000 or any(ch.isspace() or not ch.isprintable() for ch in target):
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


def sign_in(user_id: int, generation: int) -> None:
    """Start a fresh session for ``user_id`` under its current session ``generation``: nothing
    from before survives (no fixation), and moving the generation on ends it."""
    stamp = int(services_of(current_app).clock().timestamp())
    session.clear()
    session.update(uid=int(user_id), gen=int(generation), iat=stamp, seen=stamp,
                   csrf=secrets.token_urlsafe(32))
    session.permanent = True


def insecure_transport() -> bool:
    """The cookie needs HTTPS but this request came over plain http (browsers keep Secure
    cookies for localhost, so loopback addresses are fine)."""
    host = request.host.rsplit(":", 1)[0] if not request.host.endswith("]") else request.host
    return (bool(current_app.config.get("SESSION_COOKIE_SECURE")) and not request.is_secure
            and host not in LOOPBACK)


def _session_problem(now: float, idle: float, max_age: float) -> str | None:
    """Why the session cookie may no longer sign anyone in (before asking the database)."""
    try:
        issued, seen = float(session["iat"]), float(session["seen"])
        int(session["uid"]), int(session["gen"])
    except (KeyError, TypeError, ValueError):
        return "Please sign in again."  # a cookie from before sessions carried their times
    if now - issued > max_age:
        return f"You were signed out: sessions last at most {_hours(max_age)}."
    if now - seen > idle:
        return f"You were signed out after {_hours(idle)} without activity."
    return None


def _hours(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        n = int(seconds // 3600)
        return f"{n} hour{'s' if n != 1 else ''}"
    n = max(1, round(seconds / 60))
    return f"{n} minute{'s' if n != 1 else ''}"


def init_app(app: Flask) -> None:
    """Install the user loader, the CSRF check and the security headers."""

    @app.before_request
    def load_user() -> Response | None:
        g.user = None
        if (request.endpoint in PUBLIC - {"auth.login", "auth.logout"}
                or request.path.startswith(API_PREFIX)):
            return None
        if session.get("uid") is None:
            return None
        services = services_of(app)
        settings = services.settings
        stamp = services.clock().timestamp()
        problem = _session_problem(stamp, settings.session_idle_seconds,
                                   settings.session_max_age_seconds)
        row = None if problem else signed_in_user(services.engine, int(session["uid"]))
        if problem is None and (row is None or not row["active"]
                                or int(row["session_generation"]) != int(session["gen"])):
            # Signed out elsewhere, deactivated, a new password or role: this session ended.
            problem = "Your session has ended; please sign in again."
        if problem or row is None:
            session.clear()
            if problem and request.endpoint != "auth.logout":
                flash(problem, "info")
            return None
        g.user = CurrentUser(row["id"], row["email"], row["role"])
        g.must_change_password = bool(row["must_change_password"])
        if stamp - float(session["seen"]) >= SEEN_RESOLUTION and not is_background_poll():
            session["seen"] = int(stamp)
        if row["must_change_password"] and request.endpoint not in PASSWORD_CHANGE_ONLY:
            target = url_for("account.password")
            if is_htmx():
                resp = Response("", status=401)
                resp.headers["HX-Redirect"] = target
                return resp
            return redirect(target)  # type: ignore[return-value]
        return None

    @app.before_request
    def check_csrf() -> None:
        # Every mutation is a POST, and every POST carries the session's token: in a hidden
        # form field, or in the X-CSRF-Token header that htmx sends from <body hx-headers>.
        if (request.method in ("GET", "HEAD", "OPTIONS") or request.endpoint in SIGNED_BY_STRIPE
                or request.path.startswith(API_PREFIX)):
            return
        sent = request.headers.get("X-CSRF-Token") or CSRF_TOKEN.parse()
        if not same_token(sent, session.get("csrf")):
            if insecure_transport():
                abort(400, INSECURE_TRANSPORT)
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
        if app.config.get("SESSION_COOKIE_SECURE"):
            # The cookie only travels over HTTPS, so the browser must never try plain http.
            h.setdefault("Strict-Transport-Security", "max-age=31536000")
        if request.endpoint != "static":
            # Billing data: never kept by a shared cache or the back button of a kiosk.
            h.setdefault("Cache-Control", "no-store")
        return resp
