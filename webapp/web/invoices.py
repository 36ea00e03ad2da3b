"""Invoices (finance): each finalized metered invoice line beside the project's own figure for
its customer, meter and period — what Stripe billed, what it took before the invoice was
final, what came too late, what may have come on either side — and the verdict, per tenant
and period, filtered by verdict; each figure a link to its events. Read from what the judge
kept (``webapp.outbox.judge``); nothing is asked of Stripe or summed per view."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from flask import Blueprint, url_for
from flask.typing import ResponseReturnValue

from ..db import reading
from ..outbox.billing_watch import OVERLAPS, watched
from ..outbox.evidence import VERDICTS
from ..read.invoices import NOT_JUDGED, PAGE, InvoiceLine, invoice_lines, verdict_counts, window
from ..read.periods import overlaps
from .common import now, render, svc
from .params import TENANT_MAX, Day, Text, accepts
from .security import require_role

bp = Blueprint("invoices", __name__)

TENANT = Text("tenant", TENANT_MAX)
VERDICT = Text("verdict", 20, choices=(*VERDICTS, NOT_JUDGED))
FROM = Day("from")
TO = Day("to")
#: The next page: ``<finalized, Unix seconds>~<invoice id>~<item id>`` of the last line shown.
AFTER = Text("after", 600, pattern=r"[0-9]{1,12}~[A-Za-z0-9_]+~[A-Za-z0-9_]+")

#: Each verdict in plain words: a title for its badge, and a sentence for the line.
VERDICT_WORDS: dict[str, tuple[str, str]] = {
    "matches": ("Matches", "Stripe billed exactly what it took before the invoice was final."),
    "late": ("Late usage", "The line is right; usage of this period reached Stripe after the "
                           "invoice was final (or has not yet), and is on no invoice."),
    "short": ("Short", "Stripe billed fewer units than it took before the invoice was final "
                       "(its totals lag a little): the difference is on no invoice."),
    "over": ("Over", "Stripe billed more units than the outbox sent for this period "
                     "(another system sending usage, or a correction made in Stripe)."),
    "free": ("Free", "A trial's or a new subscription's first invoice: its usage is not "
                     "billed here."),
    "void": ("Voided", "The invoice was voided: nothing on it is billed."),
    "uncollectible": ("Uncollectible", "The invoice was marked uncollectible: billed, but "
                                       "not expected to be paid."),
    "not_compared": ("Not compared", "A last-value meter (or one the outbox does not know): "
                                     "listed, not compared."),
    NOT_JUDGED: ("Not checked yet", "The line has not been checked yet; it is within "
                                    "minutes of the invoice being read."),
}
#: The verdicts that need a person.
NEEDS_A_PERSON = ("late", "short", "over")


def _after() -> tuple[datetime, str, str] | None:
    raw = AFTER.get()
    if not raw:
        return None
    seconds, invoice_id, item_id = raw.split("~")
    return datetime.fromtimestamp(int(seconds), UTC), invoice_id, item_id


def cursor(line: InvoiceLine) -> str:
    """The ``after`` of the page that follows ``line``."""
    return f"{int(line.finalized_at.timestamp())}~{line.invoice_id}~{line.subscription_item_id}"


def line_events_url(line: InvoiceLine, place: str) -> str:
    """The events list of the events behind one of a line's figures."""
    return url_for("events.find", line=f"{line.invoice_id}/{line.subscription_item_id}",
                   place=place)


@bp.get("/invoices")
@require_role("viewer")
@accepts(TENANT, VERDICT, FROM, TO, AFTER)
def index() -> ResponseReturnValue:
    """The finalized lines of the window, newest first, with their verdicts."""
    at = now()
    try:
        lo, hi = window(FROM.get(), TO.get(), at)
    except ValueError:
        lo, hi = window(None, None, at)
    tenant = TENANT.get() or None
    verdict = VERDICT.get() or None
    with reading(svc().engine) as conn:
        lines = invoice_lines(conn, lo, hi, tenant_id=tenant, verdict=verdict,
                              limit=PAGE + 1, after=_after())
        counts = verdict_counts(conn, lo, hi, tenant_id=tenant)
        watch = watched(conn)
        # Listed only while the kept figure says some exist (no grouping per view).
        kept = watch.get(OVERLAPS)
        doubled = overlaps(conn, limit=20) if kept is not None and kept.customers else []
    more = len(lines) > PAGE
    lines = lines[:PAGE]
    params: dict[str, Any] = {"tenant": tenant, "verdict": verdict,
                              "from": FROM.get(), "to": TO.get()}
    return render("invoices/index.html", lines=lines, counts=counts, lo=lo, hi=hi,
                  tenant=tenant, verdict=verdict, params=params,
                  next_after=cursor(lines[-1]) if more and lines else None,
                  words=VERDICT_WORDS, needs_a_person=NEEDS_A_PERSON,
                  line_events_url=line_events_url, watch=watch, overlaps=doubled,
                  total=sum(counts.values()))
