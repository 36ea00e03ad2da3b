"""The overview, the retries page, and the pause / resume switch."""

from __future__ import annotations

from functools import partial

from flask import Blueprint, flash, redirect, url_for
from flask.typing import ResponseReturnValue

from ..db import reading
from ..outbox import operations
from ..outbox import reconciliation as recon
from ..outbox.retention import pruned_totals
from ..read import overview as overview_reads
from ..read import retries as retries_reads
from ..read.series import RANGES
from . import charts
from .common import now, render, svc
from .params import CHART_RANGE, NEXT, Text, accepts
from .security import current_user, require_role, safe_next
from .templating import chrome

bp = Blueprint("dashboard", __name__)

SPLIT = Text("split", 20, choices=retries_reads.SPLITS, default="outcome")
PAUSE_REASON = Text("reason", 500, source="form")


@bp.get("/")
@require_role("viewer")
@accepts(CHART_RANGE)
def overview() -> ResponseReturnValue:
    """Counts, throughput, failure rate, the state of sending, the pause switch and what
    needs attention; the chart over the chosen range. The state of sending is the status
    line's, read once for the request (``chrome``), also for the live panel alone."""
    settings = svc().settings
    data = overview_reads.overview(svc().engine, now=now(), stripe_mode=settings.stripe_mode,
                                   chart_range=CHART_RANGE.get(), status=chrome()["health"],
                                   invoice_risk_seconds=settings.invoice_risk_seconds,
                                   notify_channels=settings.notify.channels)
    with reading(svc().engine) as conn:
        pruned, _, last_at = pruned_totals(conn)
        next_at = recon.next_scheduled(conn, settings.reconcile_interval_seconds, now=now())
    return render("dashboard/overview.html", ov=data, ranges=RANGES, chart=_sent_chart(data),
                  next_reconciliation=next_at,
                  retention={"days": settings.retention_days, "events": pruned,
                             "last_at": last_at})


def _sent_chart(data: overview_reads.Overview) -> charts.Chart:
    rng = data.range
    if rng.by_day:
        title = f"Sent events by the day they occurred, {rng.label}"
        x_title = "day the events occurred (UTC)"
    else:
        title = f"Sent events per {rng.bucket_label}, {rng.label}"
        x_title = "time sent (UTC)"
    return charts.time_chart("sent-chart", title, data.chart,
                             bucket_seconds=int(rng.bucket.total_seconds()), unit="sent",
                             x_title=x_title)


@bp.get("/retries")
@require_role("viewer")
@accepts(SPLIT)
def retries() -> ResponseReturnValue:
    """Attempt-count histograms and the events waiting for their next attempt."""
    split = SPLIT.get()
    data = retries_reads.retries(svc().engine, now=now(), split=split)
    max_attempts = svc().settings.max_attempts
    histograms = [charts.histogram_chart(f"hist-{i}", h, max_attempts,
                                         events_url=partial(url_for, "events.find"))
                  for i, h in enumerate(data.histograms, 1)]
    return render("dashboard/retries.html", page=data, splits=retries_reads.SPLITS,
                  max_attempts=max_attempts, histograms=histograms)


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

