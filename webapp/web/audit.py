"""The audit log: who did what, when, to which events, and why; filterable; CSV."""

from __future__ import annotations

from flask import Blueprint, abort
from flask.typing import ResponseReturnValue

from ..read import audit as reads
from ..read.paging import MAX_PAGE
from .common import arg, csv_response, date_arg, int_arg, render, svc
from .security import require_role

bp = Blueprint("audit", __name__)

CSV_HEADER = ["id", "at", "actor", "action", "event_count", "event_ids", "reason_code", "note"]


def _filters() -> reads.AuditFilters:
    event = arg("event", max_len=20)
    if event and not event.isdigit():
        abort(400, "event must be an event id")
    return reads.AuditFilters(actor=arg("actor"), action=arg("action", max_len=50),
                                since=date_arg("since", None), until=date_arg("until", None),
                                event_id=int(event) if event else None)


@bp.get("/audit")
@require_role("viewer")
def index() -> ResponseReturnValue:
    """Audit entries, newest first."""
    filters = _filters()
    below = int_arg("below", 0, 0, 2**62) or None
    limit = int_arg("limit", 100, 1, MAX_PAGE)
    page = reads.audit_log(svc().engine, filters, below=below, limit=limit)
    return render("audit/index.html", page=page, f=filters,
                  limit=limit if limit != 100 else None)


@bp.get("/audit.csv")
@require_role("viewer")
def export() -> ResponseReturnValue:
    """Every matching entry, oldest first."""
    filters = _filters()
    rows = ([r["id"], r["at"], r["actor"], r["action"], r["event_count"], r["event_ids"],
             r["reason_code"], r["note"]] for r in reads.audit_rows(svc().engine, filters))
    return csv_response("audit-log.csv", CSV_HEADER, rows)
