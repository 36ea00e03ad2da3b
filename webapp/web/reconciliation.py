"""Reconciliation: the last runs against Stripe's meter event summaries and what they found;
operators can run one now (in the background: it can take minutes at many customers)."""

from __future__ import annotations

import logging
import threading

from flask import Blueprint, flash, redirect, url_for
from flask.typing import ResponseReturnValue

from ..outbox import sync
from ..read.reconciliation import reconciliation_page
from ..worker import RECONCILE_LEASE_SECONDS, reconcile
from .common import render, svc
from .params import MAX_ID, Int, accepts
from .security import current_user, require_role

bp = Blueprint("reconciliation", __name__)
log = logging.getLogger(__name__)

RUN = Int("run", 1, MAX_ID)


@bp.get("/reconciliation")
@require_role("viewer")
@accepts(RUN)
def index() -> ResponseReturnValue:
    """The last runs, and the mismatches of the chosen (or latest) one."""
    run_id = RUN.get()
    page = reconciliation_page(svc().engine, run_id=run_id, now=svc().clock())
    settings = svc().settings
    return render("reconciliation/index.html", page=page, pinned=run_id is not None,
                  settle=settings.reconcile_settle_seconds,
                  interval=settings.reconcile_interval_seconds)


@bp.post("/reconciliation/run")
@require_role("operator")
def run() -> ResponseReturnValue:
    """Start a reconciliation of the last 35 days, unless one is running."""
    user = current_user()
    assert user is not None
    services = svc()
    gateway = services.gateway()
    if gateway is None:
        flash("STRIPE_API_KEY is not set: Stripe cannot be asked.", "error")
        return redirect(url_for("reconciliation.index"), code=303)
    owner = f"button:{user.email}"
    if not sync.take_lease(services.engine, sync.RECONCILE, owner=owner, now=services.clock(),
                           seconds=RECONCILE_LEASE_SECONDS):
        flash("A reconciliation is already running; this page shows it when it ends.", "ok")
        return redirect(url_for("reconciliation.index"), code=303)

    def work() -> None:
        try:
            reconcile(services.engine, gateway, services.settings, trigger="button",
                      actor=user.email, now=services.clock())
        except Exception:
            log.exception("reconciliation started from the dashboard failed")
        finally:
            sync.drop_lease(services.engine, sync.RECONCILE, owner=owner)

    threading.Thread(target=work, name="reconcile-button", daemon=True).start()
    flash("Reconciliation started: it compares the last 35 days with Stripe; this page shows "
          "it when it ends.", "ok")
    return redirect(url_for("reconciliation.index"), code=303)
