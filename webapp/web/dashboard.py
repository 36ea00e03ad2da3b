"""The overview, the retries page, and the pause / resume switch."""

from __future__ import annotations

from flask import Blueprint, flash, redirect, url_for
from flask.typing import ResponseReturnValue

from ..outbox import operations
from ..read import overview as overview_reads
from ..read import retries as retries_reads
from .common import now, render, svc
from .params import NEXT, Text, accepts
from .security import current_user, require_role, safe_next

bp = Blueprint("dashboard", __name__)

SPLIT = Text("split", 20, choices=retries_reads.SPLITS, default="outcome")
PAUSE_REASON = Text("reason", 500, source="form")


@bp.get("/")
@require_role("viewer")
def overview() -> ResponseReturnValue:
    """Counts, throughput, failure rate, the sending switch and what needs attention."""
    settings = svc().settings
    data = overview_reads.overview(svc().engine, now=now(), stripe_mode=settings.stripe_mode)
    return render("dashboard/overview.html", ov=data, stripe_mode=settings.stripe_mode)


@bp.get("/retries")
@require_role("viewer")
@accepts(SPLIT)
def retries() -> ResponseReturnValue:
    """Attempt-count histograms and the events waiting for their next attempt."""
    split = SPLIT.get()
    data = retries_reads.retries(svc().engine, now=now(), split=split)
    return render("dashboard/retries.html", page=data, splits=retries_reads.SPLITS,
                  max_attempts=svc().settings.max_attempts)


@bp.post("/sending/pause")
@require_role("operator")
@accepts(PAUSE_REASON, NEXT)
def pause() -> ResponseReturnValue:
    """Stop sending for every worker (stored in the database)."""
    reason = PAUSE_REASON.get() or None
    user = current_user()
    assert user is not None
    changed = operations.pause(svc().engine, actor=user.email, reason=reason, now=now())
    flash("Sending paused for every worker." if changed else "Sending was already paused.",
          "ok")
    return redirect(_back(), code=303)


@bp.post("/sending/resume")
@require_role("operator")
@accepts(NEXT)
def resume() -> ResponseReturnValue:
    """Restart sending."""
    user = current_user()
    assert user is not None
    changed = operations.resume(svc().engine, actor=user.email, now=now())
    flash("Sending resumed." if changed else "Sending was already running.", "ok")
    return redirect(_back(), code=303)


def _back() -> str:
    return safe_next(NEXT.get(), url_for("dashboard.overview"))

