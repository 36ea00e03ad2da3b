"""The alerts that are sent to people, one notice per kind, made of the Overview's own alerts
(:func:`webapp.read.overview.alerts_now`): what the Overview shows is what the messages say.

Several alerts of one kind (a meter each, a tenant each) make one notice: the worst level,
the rows of all of them counted, and the page where they are all listed."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from ..config import NOTIFY_KINDS
from .alerts import Alert

#: The dashboard's pages the alerts link to, by endpoint (kept true by a test against the app).
PAGES = {
    "dashboard.overview": "/",
    "dashboard.retries": "/retries",
    "events.find": "/events",
    "dead_letters.index": "/dead-letters",
    "rejected.index": "/rejected",
    "reconciliation.index": "/reconciliation",
    "stripe_side.index": "/stripe",
    "tenants.mappings": "/mappings",
    "periods.index": "/periods",
    "periods.late_usage": "/periods/late",
}
#: How alarming each level is (the worst of a kind's alerts is the notice's).
LEVELS = {"info": 0, "warning": 1, "critical": 2}


@dataclass(frozen=True)
class Notice:
    """An alert kind that is on, as a message says it."""

    kind: str
    severity: str
    title: str
    text: str
    count: int
    #: The dashboard page with the rows it counts (a path and query).
    path: str


def page(endpoint: str | None, params: Mapping[str, Any] | None = None) -> str:
    """The path of ``endpoint`` with ``params`` as its query (lists repeated)."""
    path = PAGES.get(endpoint or "", "/")
    query = urlencode({k: v for k, v in (params or {}).items() if v not in (None, "")},
                      doseq=True)
    return f"{path}?{query}" if query else path


def notices(alerts: Iterable[Alert], kinds: Iterable[str] = NOTIFY_KINDS) -> dict[str, Notice]:
    """The notices of ``alerts`` by kind, for the kinds sent to people."""
    by: dict[str, list[Alert]] = {}
    for a in alerts:
        if a.kind is not None:
            by.setdefault(a.kind, []).append(a)
    out = {}
    for kind in kinds:
        group = by.get(kind)
        if not group:
            continue
        first = group[0]
        severity = max((a.level for a in group), key=lambda lv: LEVELS.get(lv, 0))
        count = sum(a.count or 0 for a in group)
        if len(group) == 1:
            out[kind] = Notice(kind, severity, first.title, first.detail, count,
                               page(first.link, first.params))
            continue
        text = "\n".join(f"• {a.title}" for a in group)
        where = page(first.fix_link) if first.fix_link else page(first.link, first.params)
        out[kind] = Notice(kind, severity, f"{first.title}, and {len(group) - 1} more", text,
                           count, where)
    return out
