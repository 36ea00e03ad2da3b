"""Process and readiness probes."""

from __future__ import annotations

from flask import Blueprint, current_app, jsonify
from flask.typing import ResponseReturnValue

from ..migrate import is_current
from ..services import services_of

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz() -> ResponseReturnValue:
    """The process is up."""
    return jsonify(status="ok")


@bp.get("/readyz")
def readyz() -> ResponseReturnValue:
    """The database answers and its schema is at the newest revision."""
    try:
        current = is_current(services_of(current_app).engine)
    except Exception as exc:  # noqa: BLE001 - any failure means not ready
        current_app.logger.warning("readyz: database unreachable: %s", type(exc).__name__)
        return jsonify(status="unavailable", reason="database unreachable"), 503
    if not current:
        return jsonify(status="unavailable", reason="schema not at head; run db upgrade"), 503
    return jsonify(status="ok")
