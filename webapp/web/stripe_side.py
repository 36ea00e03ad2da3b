"""The Stripe page: meters (and events waiting for one), the error reports read back, samples
that named nothing of ours, and when each exchange with Stripe last ran."""

from __future__ import annotations

from flask import Blueprint
from flask.typing import ResponseReturnValue

from ..read.stripe_side import stripe_page
from .common import render, svc
from .security import require_role

bp = Blueprint("stripe_side", __name__)


@bp.get("/stripe")
@require_role("viewer")
def index() -> ResponseReturnValue:
    """What the outbox knows of Stripe's side."""
    settings = svc().settings
    return render("stripe_side/index.html", page=stripe_page(svc().engine),
                  webhook=bool(settings.stripe_webhook_secret),
                  poll_seconds=settings.events_poll_seconds)
