"""Process and readiness probes, and the state of sending for monitors (``/health``)."""

from __future__ import annotations

from flask import Blueprint, current_app, jsonify
from flask.typing import ResponseReturnValue

from ..db import reading
from ..read.health import health as read_health
from ..services import services_of
from .common import now, svc
from .metrics import token_refused

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz() -> ResponseReturnValue:
    """The process is up."""
    return jsonify(status="ok")


@bp.get("/readyz")
def readyz() -> ResponseReturnValue:
    """The database answers and its schema is at the newest revision. (Alembic is loaded by
    the first probe, not by every process that builds the app.)"""
    from ..migrate import is_current

    try:
        current = is_current(services_of(current_app).engine)
    except Exception as exc:  # noqa: BLE001 - any failure means not ready
        current_app.logger.warning("readyz: database unreachable: %s", type(exc).__name__)
        return jsonify(status="unavailable", reason="database unreachable"), 503
    if not current:
        return jsonify(status="unavailable", reason="schema not at head; run db upgrade"), 503
    return jsonify(status="ok")


@bp.get("/health")
def health() -> ResponseReturnValue:
    """The dashboard's status line as JSON (``webapp.read.health``): ``state`` is one of
    sending, idle, paused, holding, stalled, no_api_key, meter_missing. Always 200 while the
    database answers: Stripe failing is a state to report, not a reason to restart this
    process. Behind ``METRICS_TOKEN`` like ``/metrics``; the detail (who paused, why, which
    meter) only with that token."""
    refused = token_refused("/health")
    if refused is not None:
        return refused
    settings = svc().settings
    with reading(svc().engine) as conn:
        h = read_health(conn, now=now(), api_key_here=settings.stripe_mode != "none")
    return jsonify(h.as_dict(private=settings.metrics_token is not None))
