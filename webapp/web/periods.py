"""Billing periods (finance): the periods that are closing — each draft invoice, how long
before Stripe finalizes it, and what of its usage is not at Stripe yet and why — and late
usage: what reached Stripe after its invoice was final, billed on the next invoice or written
off here (operators; viewers see). Everything is read from what the billing refresher keeps;
nothing is asked of Stripe per view."""

from __future__ import annotations

from flask import Blueprint, flash, redirect, url_for
from flask.typing import ResponseReturnValue

from ..db import reading
from ..outbox import billing_watch, late, late_lines
from ..outbox.operations import RESOLVE_REASONS
from ..read.periods import overlaps, periods_page
from .common import now, render, svc
from .errors import back_to
from .params import NOTE, REASON, Ids, Text, accepts
from .security import current_user, require_role
from .templating import chrome

bp = Blueprint("periods", __name__)

AFTER = Text("after", 255, pattern=r"[A-Za-z0-9_]+")
IDS = Ids("ids", max_count=500)
#: A short invoice line: ``<invoice id>/<subscription item id>``.
LINE = Text("line", 511, source="form", pattern=r"[A-Za-z0-9_]+/[A-Za-z0-9_]+")
#: The states of sending (``webapp.read.health``) in which nothing goes out on its own, as
#: the periods page says them.
STOPPED = {"paused": "paused", "holding": "held (Stripe is failing)", "stalled": "stalled",
           "no_api_key": "off (no API key)"}
#: The late events a page lists at most (oldest first).
LATE_SHOWN = 500


@bp.get("/periods")
@require_role("viewer")
@accepts(AFTER)
def index() -> ResponseReturnValue:
    """The closing periods, soonest to finalize first."""
    settings = svc().settings
    with reading(svc().engine) as conn:
        page = periods_page(conn, now(), after=AFTER.get() or None)
        kept = page.watch.get(billing_watch.OVERLAPS)
        doubled = overlaps(conn, limit=20) if kept is not None and kept.customers else []
    # Events "on the way" are not, while sending is stopped: say so beside them.
    sending = chrome()["health"]
    stopped = STOPPED.get(sending.state) if sending is not None else None
    return render("periods/index.html", page=page, risk_seconds=settings.invoice_risk_seconds,
                  refresh_seconds=settings.billing_refresh_seconds,
                  keyed=settings.stripe_mode != "none", stopped=stopped, overlaps=doubled)


@bp.get("/periods/late")
@require_role("viewer")
def late_usage() -> ResponseReturnValue:
    """Late usage not handled yet, with units per customer."""
    with reading(svc().engine) as conn:
        found = late.late_events(conn)
        short = late_lines.short_lines(conn)
    per_customer: dict[tuple[str, str], list[int]] = {}
    for e in found:
        totals = per_customer.setdefault((e.stripe_customer_id, e.meter), [0, 0])
        totals[0] += 1
        totals[1] += e.quantity
    return render("periods/late.html", events=found[:LATE_SHOWN], total=len(found),
                  units=sum(e.quantity for e in found), per_customer=per_customer,
                  reasons=RESOLVE_REASONS, short=short,
                  short_units=sum(s.units for s in short))


def _done() -> ResponseReturnValue:
    billing_watch.keep_late(svc().engine, now=now())
    return redirect(url_for("periods.late_usage"), code=303)


@bp.post("/periods/late/bill-next")
@require_role("operator")
@accepts(IDS, NOTE)
def bill_next() -> ResponseReturnValue:
    """Bill the selected late events on their customers' next invoices."""
    back_to(url_for("periods.late_usage"))
    user = current_user()
    assert user is not None
    result = late.bill_next(svc().engine, IDS.get(), actor=user.email, note=NOTE.get(),
                            now=now())
    if result.new_events:
        flash(f"Billing {len(result.new_events):,} late event(s) on the next invoice: each "
              "was enqueued again, timestamped now, and goes out with the next drain.", "ok")
    if result.already:
        flash(f"{len(result.already):,} event(s) had been handled before; nothing more was "
              "done for them.", "info")
    return _done()


@bp.post("/periods/late/write-off")
@require_role("operator")
@accepts(IDS, REASON, NOTE)
def write_off() -> ResponseReturnValue:
    """Close the selected late events unbilled, with a reason."""
    back_to(url_for("periods.late_usage"))
    user = current_user()
    assert user is not None
    result = late.write_off(svc().engine, IDS.get(), actor=user.email, reason=REASON.get(),
                            note=NOTE.get(), now=now())
    if result.handled:
        flash(f"Wrote off {len(result.handled):,} late event(s): they will not be billed.",
              "ok")
    if result.already:
        flash(f"{len(result.already):,} event(s) had been handled before; nothing more was "
              "done for them.", "info")
    return _done()


@bp.post("/periods/late/write-off-line")
@require_role("operator")
@accepts(LINE, REASON, NOTE)
def write_off_line() -> ResponseReturnValue:
    """Close the units a short line lacks, unbilled, with a reason."""
    back_to(url_for("periods.late_usage"))
    user = current_user()
    assert user is not None
    invoice_id, _, item_id = LINE.get().partition("/")
    result = late_lines.write_off_line(svc().engine, invoice_id, item_id, actor=user.email,
                                 reason=REASON.get(), note=NOTE.get(), now=now())
    if result.already:
        flash("That line had been handled before; nothing more was done.", "info")
    else:
        flash(f"Wrote off the units invoice {invoice_id} is short of: they will not be "
              "billed.", "ok")
    return _done()
