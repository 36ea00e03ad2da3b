"""Reconciliation: the last runs against Stripe's meter event summaries and what they found;
operators can run one now (in the background: it can take minutes at many customers), and
send again a day Stripe lost (all of it where Stripe holds none, chosen events where it holds
part), after a preview."""

from __future__ import annotations

import logging
import threading
from datetime import datetime

from flask import Blueprint, abort, flash, redirect, url_for
from flask.typing import ResponseReturnValue
from markupsafe import Markup

from ..db import reading
from ..outbox import reconciliation as recon
from ..outbox import stripe_runs
from ..outbox.findings import number
from ..outbox.resend import MAX_CHOSEN, resend_chosen, resend_day
from ..read.reconciliation import reconciliation_page
from ..read.resend import day_page, mismatch_bucket, offers, resend_preview
from ..worker import RECONCILE_LEASE_SECONDS, reconcile
from .common import now, read_snapshot, render, sign_snapshot, svc
from .errors import back_to
from .params import MAX_ID, SNAPSHOT, Ids, Int, accepts
from .security import current_user, require_role

bp = Blueprint("reconciliation", __name__)
log = logging.getLogger(__name__)

RUN = Int("run", 1, MAX_ID)
#: The events a person chose to send again (none: the whole day).
CHOSEN = Ids("ids", max_count=MAX_CHOSEN, source="query")
#: Signs the preview of a resend (see ``common.sign_snapshot``).
SNAPSHOT_SALT = "resend-lost-v1"


@bp.get("/reconciliation")
@require_role("viewer")
@accepts(RUN)
def index() -> ResponseReturnValue:
    """The last runs, and the mismatches of the chosen (or latest) one."""
    run_id = RUN.get()
    page = reconciliation_page(svc().engine, run_id=run_id, now=svc().clock())
    settings = svc().settings
    with reading(svc().engine) as conn:
        next_run = recon.next_scheduled(conn, settings.reconcile_interval_seconds,
                                        now=svc().clock())
    return render("reconciliation/index.html", page=page, pinned=run_id is not None,
                  settle=settings.reconcile_settle_seconds,
                  interval=settings.reconcile_interval_seconds, next_run=next_run,
                  offers=offers(page.mismatches))


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
    if start_in_background(user.email):
        flash("Reconciliation started: it compares the last 35 days with Stripe; this page "
              "shows it when it ends.", "ok")
    else:
        flash("A reconciliation is already running; this page shows it when it ends.", "ok")
    return redirect(url_for("reconciliation.index"), code=303)


def start_in_background(actor: str, *, since: datetime | None = None,
                        until: datetime | None = None, trigger: str = "button") -> bool:
    """Start a reconciliation (of ``since``…``until``, default the last 35 days) in a thread
    of its own, as ``actor``, unless one is running (the lease every process takes); whether
    it started. It can take minutes at many customers: the page that asked shows it when it
    ends. It reads Stripe's summaries and writes nothing but the comparison."""
    services = svc()
    gateway = services.gateway()
    assert gateway is not None
    owner = f"{trigger}:{actor}"
    if not stripe_runs.take_lease(services.engine, stripe_runs.RECONCILE, owner=owner,
                                  now=services.clock(), seconds=RECONCILE_LEASE_SECONDS):
        return False

    def work() -> None:
        try:
            reconcile(services.engine, gateway, services.settings, trigger=trigger,
                      actor=actor, clock=services.clock, since=since, until=until)
        except Exception:
            log.exception("reconciliation started from the dashboard failed")
        finally:
            stripe_runs.drop_lease(services.engine, stripe_runs.RECONCILE, owner=owner)

    threading.Thread(target=work, name=f"reconcile-{trigger}", daemon=True).start()
    return True


@bp.get("/reconciliation/mismatches/<id:mismatch_id>")
@require_role("viewer")
def day(mismatch_id: int) -> ResponseReturnValue:
    """A mismatch's day: ours beside Stripe's, and the events that reconciliation compared,
    each a link to its page; for operators, what can be sent again."""
    page = day_page(svc().engine, mismatch_id, now=now())
    if page is None:
        abort(404, f"There is no mismatch {mismatch_id}.")
    return render("reconciliation/day.html", p=page, max_chosen=MAX_CHOSEN, figure=number)


@bp.get("/reconciliation/mismatches/<id:mismatch_id>/resend")
@require_role("operator")
@accepts(CHOSEN)
def resend_confirm(mismatch_id: int) -> ResponseReturnValue:
    """What sending the day (or the chosen events) again would do, before it is done; the
    exact ids are signed into the form."""
    preview = resend_preview(svc().engine, mismatch_id, CHOSEN.get(), now=now())
    if preview is None:
        abort(404, f"There is no mismatch {mismatch_id}.")
    user = current_user()
    assert user is not None
    plan = preview.plan
    token = None if plan is None else sign_snapshot(
        SNAPSHOT_SALT, user.id, mismatch=mismatch_id, ids=plan.ids, chosen=plan.chosen)
    return render("reconciliation/resend.html", p=preview, token=token, figure=number)


@bp.post("/reconciliation/mismatches/<id:mismatch_id>/resend")
@require_role("operator")
@accepts(SNAPSHOT)
def resend(mismatch_id: int) -> ResponseReturnValue:
    """Send again exactly the previewed events, under new identifiers (audited)."""
    user = current_user()
    assert user is not None
    snap = read_snapshot(SNAPSHOT_SALT, user.id, SNAPSHOT.get())
    found = mismatch_bucket(svc().engine, mismatch_id)
    if found is None or snap.get("mismatch") != mismatch_id:
        abort(400, "This preview is of another mismatch; preview again.")
    run_id, bucket = found
    if bucket is None:
        abort(400, "This mismatch is not a whole day; nothing is sent again.")
    back_to(url_for("reconciliation.index", run=run_id))
    ids = [int(i) for i in snap.get("ids", [])]
    done = (resend_chosen(svc().engine, bucket, ids, actor=user.email, now=now())
            if snap.get("chosen") else
            resend_day(svc().engine, bucket, actor=user.email, now=now(), expected=ids))
    plan = done.plan
    flash(Markup("Sent again: {0} event(s), {1:,} units of {2}, each under a new identifier; "
                 'the worker sends them now. <a href="{3}">See what becomes of them</a>.')
          .format(len(plan.events), plan.units, bucket.words(),
                  url_for("events.find", audit=done.audit_id)), "ok")
    return redirect(url_for("reconciliation.index", run=run_id), code=303)
