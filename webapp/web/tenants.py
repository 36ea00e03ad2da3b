"""Usage per tenant and meter, its CSV, a tenant's own page, and the Stripe customer mapping."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from flask import Blueprint, abort, flash, redirect, url_for
from flask.typing import ResponseReturnValue

from ..db import reading
from ..outbox import reconciliation as recon
from ..outbox.operations import OperationError, mapping_problem, set_tenant
from ..outbox.rollups import fold_margin
from ..read import invoices as invoice_reads
from ..read import mappings as mapping_reads
from ..read import tenants as reads
from ..read import usage_reports as reports
from ..read import usage_table as table_reads
from ..read.paging import MAX_PAGE
from ..read.usage_sources import period_bounds
from ..status import SENT
from ..worker import ReportBusy, check_customers
from ..worker import prepare_report as prepare_usage_report
from . import charts
from .common import csv_response, now, render, svc
from .errors import back_to
from .params import TENANT_MAX, Day, Int, Text, accepts, page_fields
from .reconciliation import start_in_background
from .security import current_user, require_role
from .templating import fmt_age, fmt_utc

bp = Blueprint("tenants", __name__)
log = logging.getLogger(__name__)

MAX_PERIOD = timedelta(days=400)

FROM = Day("from")
TO = Day("to")
LIMIT, AFTER, BEFORE = page_fields(50, MAX_PAGE)
TENANT_ID = Text("tenant_id", TENANT_MAX, source="form")
CUSTOMER = Text("stripe_customer_id", 255, source="form")
NAME = Text("name", 200, source="form")
#: The CSV of one tenant's usage (its page's "Download CSV"); on the mappings page, the
#: tenant id its form starts with.
TENANT = Text("tenant", TENANT_MAX)
#: The CSV of a prepared report: its id (the report the page showed).
REPORT = Int("report", 1, 2**62)
#: The tenants page's table: its order, its page, and which rows (an id's start, part of a
#: name, a customer id's start; rows with dead or waiting events, tenants without a customer).
SORT = Text("sort", 20, choices=table_reads.SORTS, default="tenant")
ORDER = Text("order", 4, choices=("asc", "desc"))
PAGE = Int("page", 1, 1_000_000, default=1)
FIND = Text("q", TENANT_MAX)
ONLY = Text("only", 10, choices=table_reads.ONLY)
#: The mappings page's keyset (tenant ids), and ``show=waiting``: every tenant waiting for a
#: customer, a page at a time.
AFTER_ID = Text("after", TENANT_MAX, strip=False)
BEFORE_ID = Text("before", TENANT_MAX, strip=False)
SHOW = Text("show", 10, choices=("waiting",))
#: The report form: its period, and the page's view to come back to.
REPORT_FROM = Day("from", source="form")
REPORT_TO = Day("to", source="form")
REPORT_VIEW = (Text("sort", 20, choices=table_reads.SORTS, source="form"),
               Text("order", 4, choices=("asc", "desc"), source="form"),
               Text("q", TENANT_MAX, source="form"),
               Text("only", 10, choices=table_reads.ONLY, source="form"))

#: The usage table's columns, in the screen's order: the figures a person comes for first
#: (sent, and Stripe's figure beside it), so they stay on a phone's screen; the file adds the
#: tenant's name after its id, and when the comparison was made at its end.
OTHER_STATUSES = tuple(s for s in reads.USAGE_STATUSES if s != SENT)
CSV_HEADER = ["Tenant", "Tenant name", "Meter", "sent units", "Stripe units",
              "Stripe difference", "sent events", "Stripe customer"] + [
    f"{status} {what}" for status in OTHER_STATUSES for what in ("units", "events")] + [
    "Stripe compared days", "Stripe compared at (UTC)", "our units on the compared days",
    # Stripe's quantity on the finalized invoice lines (not voided) of the row's customer and
    # meter whose billing period lies within the file's days; empty where there is none.
    "invoiced_units"]


def _period() -> tuple[date, date]:
    """The ``from``/``to`` dates (inclusive, UTC); this month so far by default."""
    today = now().date()
    return _checked(FROM.get() or reads.month_start(now()), TO.get() or today)


def _checked(start: date, end: date) -> tuple[date, date]:
    """``start``…``end``, or 400 naming what is wrong with the period."""
    if end < start:
        abort(400, "the period ends before it starts")
    if end - start > MAX_PERIOD:
        abort(400, f"the period can be at most {MAX_PERIOD.days} days")
    return start, end


@bp.get("/tenants")
@require_role("viewer")
@accepts(FROM, TO, SORT, ORDER, PAGE, FIND, ONLY)
def index() -> ResponseReturnValue:
    """A page of the period's usage per tenant and meter (sorted and filtered in the
    database), the period's totals, and the tenants waiting for a customer."""
    start, end = _period()
    sort = SORT.get()
    # Tenants A to Z; figures largest first, unless the person asks otherwise.
    descending = ORDER.get() == "desc" if ORDER.get() else sort != "tenant"
    query = table_reads.UsageQuery(start, end, sort=sort, descending=descending,
                                   text=FIND.get(), only=ONLY.get(), page=PAGE.get())
    data = table_reads.tenants_page(svc().engine, query, now=now(),
                                    margin=fold_margin(svc().settings.claim_timeout_seconds))
    period = {"from": start.isoformat(), "to": end.isoformat()}
    view = {**period, "sort": sort, "order": "desc" if descending else "asc",
            "q": query.text, "only": query.only}
    settings = svc().settings
    with reading(svc().engine) as conn:
        next_at = recon.next_scheduled(conn, settings.reconcile_interval_seconds, now=now())
    return render("tenants/index.html", page=data, t=data.table, start=start, end=end,
                  settle_words=fmt_age(settings.reconcile_settle_seconds),
                  next_reconcile=next_at,
                  statuses=reads.USAGE_STATUSES, quick=_quick_periods(), period=period,
                  view={k: v for k, v in view.items() if v}, sorts=SORT_WORDS,
                  only_words=ONLY_WORDS, live_days=reports.LIVE_DAYS,
                  keep_days=reports.KEEP.days, schedule=reports.SCHEDULE,
                  refresh_minutes=int(reports.REFRESH.total_seconds() // 60))


@bp.post("/tenants/check-with-stripe")
@require_role("viewer")
@accepts(REPORT_FROM, REPORT_TO, *REPORT_VIEW)
def check_with_stripe() -> ResponseReturnValue:
    """Compare the period shown with Stripe's meter summaries now (a reconciliation of its
    days within Stripe's 35, in the background): anyone who can see the figures may ask, as
    it reads Stripe and writes nothing but the comparison. Audited in the runs' list."""
    start, end = REPORT_FROM.get(), REPORT_TO.get()
    user = current_user()
    assert user is not None
    if start is None or end is None:
        abort(400, "the check needs a period: a from and a to date")
    view: dict[str, Any] = {f.name: f.get() for f in REPORT_VIEW if f.get()}
    back = url_for("tenants.index", **{"from": start.isoformat(), "to": end.isoformat(),
                                       **view})
    back_to(back)
    if svc().gateway() is None:
        flash("STRIPE_API_KEY is not set: Stripe cannot be asked.", "error")
        return redirect(back, code=303)
    earliest, latest = recon.default_window(now())
    since = max(datetime.combine(start, time(0), UTC), earliest)
    until = min(datetime.combine(end + timedelta(days=1), time(0), UTC), latest)
    if until <= since:
        flash("Nothing of this period can be compared yet: Stripe's figures are compared "
              "for the last 35 days, once an hour has ended.", "error")
        return redirect(back, code=303)
    if not start_in_background(user.email, since=since, until=until, trigger="check"):
        flash("A comparison with Stripe is already running; the figures appear when it "
              "ends.", "ok")
        return redirect(back, code=303)
    flash(f"Comparing {since:%Y-%m-%d} – {until - timedelta(seconds=1):%Y-%m-%d} with Stripe: "
          "Stripe's figures appear beside ours when it ends (seconds to minutes, with many "
          "customers). A day is compared once it has ended and settled.", "ok")
    return redirect(back, code=303)


@bp.post("/tenants/report")
@require_role("viewer")
@accepts(REPORT_FROM, REPORT_TO, *REPORT_VIEW)
def prepare_report() -> ResponseReturnValue:
    """Sum every tenant's usage over the period and keep it, then show it: a period longer
    than a month, or a shorter one the page shows from a report (at many tenants) to bring
    up to the minute."""
    start, end = REPORT_FROM.get(), REPORT_TO.get()
    user = current_user()
    assert user is not None
    if start is None or end is None:
        abort(400, "the report needs a period: a from and a to date")
    view: dict[str, Any] = {f.name: f.get() for f in REPORT_VIEW if f.get()}
    back = url_for("tenants.index", **{"from": start.isoformat(), "to": end.isoformat(),
                                       **view})
    back_to(back)
    _checked(start, end)
    try:
        done = prepare_usage_report(svc().engine, start, end, now=now(), actor=user.email)
    except ReportBusy:
        flash("Another report is being prepared right now (with many tenants each takes a "
              "few seconds); nothing was started. Try again in a moment.", "error")
        return redirect(back, code=303)
    log.info("usage report %s prepared for %s: %s to %s, %s rows in %.1f s", done.id,
             user.email, start, end, done.rows, done.seconds)
    flash(f"The report is ready: {done.rows:,} tenant × meter rows, exact as of "
          f"{done.as_of.astimezone(UTC):%H:%M:%S} UTC.", "ok")
    return redirect(back, code=303)


#: The orders and filters of the tenants page, in words.
SORT_WORDS = {"tenant": "Tenant id", "sent_units": "Sent units", "sent_events": "Sent events",
              "waiting_events": "Waiting events (pending and retrying)",
              "dead_events": "Dead events"}
ONLY_WORDS = {"dead": "with dead events", "waiting": "with events waiting to be sent",
              "unmapped": "without a Stripe customer"}


def _quick_periods() -> list[tuple[str, date, date]]:
    return reports.quick_periods(now().date())


@bp.get("/mappings")
@require_role("viewer")
@accepts(TENANT, FIND, AFTER_ID, BEFORE_ID, SHOW)
def mappings() -> ResponseReturnValue:
    """A page of tenants and their Stripe customers (found by id, name or customer), and
    those waiting for one; ``show=waiting`` lists every one of those a page at a time.
    ``tenant`` fills in the mapping form (an alert's "Map the tenant")."""
    query = mapping_reads.MappingQuery(FIND.get(), AFTER_ID.get() or None,
                                       BEFORE_ID.get() or None)
    if SHOW.get() == "waiting":
        return render("tenants/waiting.html", waiting=mapping_reads.unmapped_page(
            svc().engine, query), q=query.text, prefill=TENANT.get())
    data = mapping_reads.mappings_page(svc().engine, query)
    return render("tenants/mappings.html", page=data, tenants=data.tenants.rows,
                  unmapped=data.unmapped, q=query.text, prefill=TENANT.get())


@bp.get("/tenants.csv")
@require_role("viewer")
@accepts(FROM, TO, TENANT, REPORT)
def export() -> ResponseReturnValue:
    """The tenants page's table as a file: the period and when it was made, then the page's
    columns in its order, one row per tenant and meter (every one of them, read from the
    database as the file is sent), and the totals row. A period the page reads from a report
    is read from report ``report`` (the one the page showed), else from the period's newest;
    with none kept, it is summed live."""
    start, end = _period()
    tenant = TENANT.get() or None
    preamble = [["Period (UTC days, by when each event occurred)", start.isoformat(),
                 end.isoformat()],
                ["Generated at (UTC)", fmt_utc(now())]]
    report = _report_for(start, end, REPORT.get()) if tenant is None else None
    if report is not None:
        rows = table_reads.report_rows_streamed(svc().engine, report.id)
        preamble.append(["Figures exact as of (UTC), a prepared report",
                         fmt_utc(report.as_of)])
    else:
        rows = table_reads.usage_rows_streamed(svc().engine, start=start, end=end,
                                               tenant_id=tenant)
    if TENANT.get():
        preamble.append(["Tenant", TENANT.get()])
    lo, hi = period_bounds(start, end)
    with reading(svc().engine) as conn:
        invoiced = invoice_reads.invoiced_units(conn, None, lo, hi)
    return csv_response(f"usage-{start.isoformat()}-{end.isoformat()}.csv", CSV_HEADER,
                        _csv_rows(rows, invoiced), preamble=preamble)


def _report_for(start: date, end: date, report_id: int | None) -> reports.Report | None:
    """Report ``report_id`` (the one the page showed) if it is still kept and is of this
    period, else the report the page would read the period from now (None: summed live)."""
    with reading(svc().engine) as conn:
        chosen = reports.report_by_id(conn, report_id) if report_id is not None else None
        if chosen is not None and (chosen.start, chosen.end) == (start, end):
            return chosen
        return reports.shown_report(conn, start, end, now=now())[1]


#: The file's Stripe units cell where no day of the period was compared (never a blank, which
#: reads as nothing to bill; a spreadsheet's sums skip text).
NOT_COMPARED = "not compared yet"


def _csv_rows(rows: Iterator[reads.UsageRow],
              invoiced: dict[tuple[str, str], Decimal]) -> Iterator[list[Any]]:
    """Each row's cells (Stripe's units "not compared yet" and the difference empty where
    nothing was compared; the invoiced units of its customer and meter, empty where no
    finalized line lies in the period), then a totals row per meter (summed as the rows go
    by: units of different meters are never added together). Stripe's figures are per
    customer: tenants billed to one customer each show the customer's, and the total counts
    it once."""
    totals: dict[str, reads.UsageRow] = {}
    counted: set[tuple[str | None, str]] = set()
    seen: set[tuple[str | None, str]] = set()
    invoiced_totals: dict[str, Decimal] = {}
    for r in rows:
        total = totals.setdefault(r.meter, reads.UsageRow("", r.meter))
        for status in reads.USAGE_STATUSES:
            total.quantity[status] += r.quantity[status]
            total.events[status] += r.events[status]
        pair = (r.stripe_customer_id, r.meter)
        if (r.stripe_units is not None and r.compared_units is not None
                and pair not in counted):
            counted.add(pair)
            total.stripe_units = (total.stripe_units or 0.0) + r.stripe_units
            total.compared_units = (total.compared_units or 0) + r.compared_units
            total.compared_days += r.compared_days
        billed = invoiced.get((r.stripe_customer_id or "", r.meter))
        if billed is not None and (r.stripe_customer_id, r.meter) not in seen:
            seen.add((r.stripe_customer_id, r.meter))
            invoiced_totals[r.meter] = invoiced_totals.get(r.meter, Decimal(0)) + billed
        yield _csv_cells(r, r.tenant_id, r.name) + [_figure(billed)]
    for meter, total in sorted(totals.items()):
        yield _csv_cells(total, "Total", "") + [_figure(invoiced_totals.get(meter))]


def _csv_cells(r: reads.UsageRow, first: str, name: str | None) -> list[Any]:
    """One row of the file, in :data:`CSV_HEADER`'s order."""
    compared = r.stripe_units is not None
    cells: list[Any] = [first, name, r.meter, r.quantity[SENT],
                        _figure(r.stripe_units) if compared else NOT_COMPARED,
                        _figure(r.difference) if compared else "", r.events[SENT],
                        r.stripe_customer_id]
    for status in OTHER_STATUSES:
        cells += [r.quantity[status], r.events[status]]
    return cells + [r.compared_days, fmt_utc(r.compared_at) if r.compared_at else "",
                    r.compared_units if compared else ""]


def _figure(value: float | Decimal | None) -> int | float | str:
    """A figure of Stripe's as it reads best: whole numbers without a decimal point."""
    if value is None:
        return ""
    return int(value) if float(value).is_integer() else round(float(value), 6)


@bp.get("/tenants/<tenant:tenant_id>")
@require_role("viewer")
@accepts(FROM, TO, LIMIT, AFTER, BEFORE)
def show(tenant_id: str) -> ResponseReturnValue:
    """One tenant: its mapping, its usage by meter and its events, newest first."""
    start, end = _period()
    data = reads.tenant_detail(svc().engine, tenant_id, start=start, end=end,
                               after=AFTER.get(), before=BEFORE.get(), limit=LIMIT.get())
    chart = charts.time_chart("tenant-daily", "Sent events by the day they occurred",
                              data.daily, bucket_seconds=86400, unit="sent",
                              x_title="day the events occurred (UTC)")
    return render("tenants/show.html", t=data, start=start, end=end,
                  statuses=reads.USAGE_STATUSES, limit=LIMIT.get(), quick=_quick_periods(),
                  chart=chart)


@bp.post("/tenants/mapping")
@require_role("admin")
@accepts(TENANT_ID, CUSTOMER, NAME)
def set_mapping() -> ResponseReturnValue:
    """Map a tenant to its Stripe customer (audited), once Stripe says it has it (with a
    key set; without one it is mapped and the message says it was not checked). Its waiting
    events become sendable; events already attempted keep the customer fixed at their first
    attempt."""
    tenant_id = TENANT_ID.get()
    customer = CUSTOMER.get()
    name = NAME.get() or None
    user = current_user()
    assert user is not None
    back = url_for("tenants.show", tenant_id=tenant_id) if tenant_id else url_for("tenants.index")
    if not customer:
        flash("A Stripe customer id (cus_…) is required.", "error")
        return redirect(back, code=303)
    back_to(back)
    problem = mapping_problem(tenant_id, customer)
    if problem:
        raise OperationError(problem)
    customers = check_customers(svc().engine, svc().gateway(), svc().settings, [customer],
                                clock=svc().clock)
    set_tenant(svc().engine, tenant_id, stripe_customer_id=customer, name=name, now=now(),
               actor=user.email, customers=customers)
    if customers.checked:
        flash(f"{tenant_id} is now billed to {customer} (Stripe has this customer).", "ok")
    else:
        flash(f"{tenant_id} is now billed to {customer}. Stripe was not asked whether it has "
              "this customer: no Stripe API key is set here, so check the id in Stripe's "
              "dashboard.", "warning")
    return redirect(back, code=303)
