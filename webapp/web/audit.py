"""The audit log: who did what, when, to which events, and why; filterable; CSV."""

from __future__ import annotations

from flask import Blueprint
from flask.typing import ResponseReturnValue

from ..read import audit as reads
from ..read.paging import MAX_PAGE
from .common import csv_response, render, svc
from .params import MAX_ID, Day, Int, Text, accepts
from .security import require_role

bp = Blueprint("audit", __name__)

CSV_HEADER = [c.name for c in reads.EXPORT_COLUMNS]


ACTOR = Text("actor", 200)
ACTION = Text("action", 50)
SINCE = Day("since")
UNTIL = Day("until")
EVENT = Int("event", 1, MAX_ID)
FILTERS = (ACTOR, ACTION, SINCE, UNTIL, EVENT)
BELOW = Int("below", 1, MAX_ID)
LIMIT = Int("limit", 1, MAX_PAGE, default=100, clamp=True)


def _filters() -> reads.AuditFilters:
    return reads.AuditFilters(actor=ACTOR.get(), action=ACTION.get(), since=SINCE.get(),
                              until=UNTIL.get(), event_id=EVENT.get())


@bp.get("/audit")
@require_role("viewer")
@accepts(*FILTERS, BELOW, LIMIT)
def index() -> ResponseReturnValue:
    """Audit entries, newest first."""
    filters = _filters()
    below = BELOW.get()
    limit = LIMIT.get()
    page = reads.audit_log(svc().engine, filters, below=below, limit=limit)
    return render("audit/index.html", page=page, f=filters,
                  limit=limit if limit != 100 else None)


@bp.get("/audit.csv")
@require_role("viewer")
@accepts(*FILTERS)
def export() -> ResponseReturnValue:
    """Every matching entry, oldest first."""
    return csv_response("audit-log.csv", CSV_HEADER, reads.audit_rows(svc().engine, _filters()))
