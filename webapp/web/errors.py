"""The one place that turns an error into an answer: a page, an htmx fragment, JSON, or —
for a refused action posted from a form — a message on the page the person came from.

Views raise narrowly (``abort(400, …)``, :class:`~webapp.outbox.operations.OperationError`,
:class:`~webapp.users.UserError`) and never format errors themselves.
"""

from __future__ import annotations

import logging

from flask import Flask, Response, current_app, flash, g, jsonify, redirect, request
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import HTTPException, InternalServerError

from ..outbox.operations import OperationError
from ..users import UserError
from .common import render
from .security import is_htmx

log = logging.getLogger(__name__)

#: Endpoints whose callers are machines: errors answer in their own format.
_MACHINE = {"health.healthz": "json", "health.readyz": "json", "metrics.metrics": "text"}


def back_to(url: str) -> None:
    """Where a refused action sends the person back to (with the reason as a message)."""
    g.back = url


def init_app(app: Flask) -> None:
    """Install the error handlers."""

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> ResponseReturnValue:
        if request.path.startswith("/api/"):
            from .api import problem

            resp = problem(exc.code or 500, exc.name, exc.description or exc.name)
            for name, value in exc.get_headers():  # Allow on a 405, for instance
                if name.lower() != "content-type":
                    resp.headers[name] = value
            return resp
        return _answer(exc.code or 500, exc.name, exc.description or exc.name)

    @app.errorhandler(OperationError)
    @app.errorhandler(UserError)
    def refused(exc: Exception) -> ResponseReturnValue:
        back = g.get("back")
        if back is not None and request.method == "POST" and not is_htmx():
            # Kept short: the message travels in the session cookie (browsers drop ~4 KB+).
            message = str(exc)
            if len(message) > 500:
                message = message[:480].rstrip() + "… (shortened)"
            flash(f"Nothing changed: {message}", "error")
            return redirect(back, code=303)
        return _answer(409, "Refused", f"Nothing changed: {exc}")

    @app.errorhandler(Exception)
    def unexpected(exc: Exception) -> ResponseReturnValue:
        if current_app.testing:
            raise exc  # a test sees the traceback, not a page
        log.exception("unhandled error on %s %s", request.method, request.path)
        error = InternalServerError()
        return _answer(500, error.name, "Something went wrong on our side; nothing you did "
                       "caused it. The error is logged; try again in a moment.")


def _answer(code: int, title: str, message: str) -> ResponseReturnValue:
    if request.path.startswith("/api/"):
        from .api import problem

        return problem(code, title, message)
    kind = _MACHINE.get(request.endpoint or "")
    if kind == "json" or (kind is None and _wants_json()):
        resp = jsonify(status="error", code=code, error=title, message=message)
        resp.status_code = code
        return resp
    if kind == "text":
        return Response(f"{code} {title}: {message}\n", status=code, mimetype="text/plain")
    return render("errors/error.html", status=code, code=code, title=title, message=message)


def _wants_json() -> bool:
    best = request.accept_mimetypes.best_match(["text/html", "application/json"])
    return best == "application/json" and not is_htmx()
