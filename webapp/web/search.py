"""The search box on every page: one hit goes straight to it, several give a page grouped by
kind, and a miss stays on a page that repeats the query and says what can be found."""

from __future__ import annotations

from flask import Blueprint, redirect
from flask.typing import ResponseReturnValue

from ..read.search import GROUP_LIMIT, MAX_QUERY, search
from .common import render, svc
from .params import Text, accepts
from .security import require_role
from .templating import event_url, tenant_url

bp = Blueprint("search", __name__)

Q = Text("q", MAX_QUERY)


@bp.get("/search")
@require_role("viewer")
@accepts(Q)
def index() -> ResponseReturnValue:
    """Find a tenant, a Stripe customer or request, or an event, from one query."""
    q = Q.get()
    if not q:
        return render("search/index.html", q="", results=None, limit=GROUP_LIMIT)
    results = search(svc().engine, q)
    only = results.only()
    if only is not None:
        kind, row = only
        if kind == "tenants":
            return redirect(tenant_url(row["tenant_id"]))
        if kind == "events":
            return redirect(event_url(row["id"]))
        return redirect(f"{event_url(row['event_id'])}#attempt-{int(row['id'])}")
    return render("search/index.html", q=q, results=results, limit=GROUP_LIMIT,
                  retention_days=svc().settings.retention_days)
