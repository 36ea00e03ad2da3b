"""The Audit log page: who did what to which events, and why; filterable; exported as CSV."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, select

from ..db import exporting, reading
from ..outbox.sql import AUDIT, AUDIT_EVENTS, row_dict
from .paging import MAX_PAGE

#: Sign-in events: kept in the same log, shown on their own ("sign-ins") so a day of log-ins
#: does not bury the actions taken on events.
SIGN_IN_ACTIONS = ("login", "login_failure", "login_lockout", "logout",
                   "password_change_failure")
#: A condition: the entry is not a sign-in event.
NOT_SIGN_IN = AUDIT.c.action.not_in(SIGN_IN_ACTIONS)
#: ``action`` values that name a group rather than one action.
ALL, SIGN_INS = "all", "sign-ins"


@dataclass(frozen=True)
class AuditFilters:
    actor: str = ""
    action: str = ""
    since: date | None = None
    until: date | None = None       # inclusive
    event_id: int | None = None

    def params(self) -> dict[str, str]:
        out = {"actor": self.actor, "action": self.action,
               "since": self.since.isoformat() if self.since else "",
               "until": self.until.isoformat() if self.until else "",
               "event": str(self.event_id) if self.event_id else ""}
        return {k: v for k, v in out.items() if v}

    def conditions(self) -> list[Any]:
        where: list[Any] = []
        if self.actor:
            where.append(AUDIT.c.actor.icontains(self.actor, autoescape=True))
        if self.action == SIGN_INS:
            where.append(AUDIT.c.action.in_(SIGN_IN_ACTIONS))
        elif self.action == "":
            where.append(NOT_SIGN_IN)
        elif self.action != ALL:
            where.append(AUDIT.c.action == self.action)
        if self.since:
            where.append(AUDIT.c.at >= datetime(self.since.year, self.since.month,
                                                self.since.day, tzinfo=UTC))
        if self.until:
            where.append(AUDIT.c.at < datetime(self.until.year, self.until.month,
                                               self.until.day, tzinfo=UTC) + timedelta(days=1))
        if self.event_id:
            where.append(AUDIT.c.id.in_(select(AUDIT_EVENTS.c.audit_id)
                                        .where(AUDIT_EVENTS.c.event_id == self.event_id)))
        return where


@dataclass(frozen=True)
class AuditPage:
    rows: list[dict[str, Any]]
    next: int | None       # the id to continue below
    actions: list[str]


def audit_log(engine: Engine, filters: AuditFilters, *, below: int | None = None,
              limit: int = 100) -> AuditPage:
    """Audit entries newest first, keyset on id (ids grow with time)."""
    limit = max(1, min(limit, MAX_PAGE))
    stmt = select(AUDIT).where(*filters.conditions())
    if below is not None:
        stmt = stmt.where(AUDIT.c.id < below)
    with reading(engine) as conn:
        got = [row_dict(r) for r in conn.execute(stmt.order_by(AUDIT.c.id.desc()).limit(limit + 1))]
        actions = list(conn.execute(select(AUDIT.c.action).distinct().order_by(AUDIT.c.action))
                       .scalars())
    rows = got[:limit]
    return AuditPage(rows, rows[-1]["id"] if len(got) > limit else None, actions)


#: The CSV's columns, in its order.
EXPORT_COLUMNS = (AUDIT.c.id, AUDIT.c.at, AUDIT.c.actor, AUDIT.c.action, AUDIT.c.event_count,
                  AUDIT.c.event_ids, AUDIT.c.reason_code, AUDIT.c.note)


def audit_rows(engine: Engine, filters: AuditFilters, *, batch: int = 1000
               ) -> Iterator[Sequence[Any]]:
    """Every matching audit entry, oldest first, as :data:`EXPORT_COLUMNS` (for the CSV
    export): one query in one snapshot, read ``batch`` rows at a time (a server-side cursor
    on PostgreSQL), so the file never sits in memory whole and no entry is read twice."""
    with exporting(engine) as conn:
        yield from conn.execution_options(stream_results=True, yield_per=batch).execute(
            select(*EXPORT_COLUMNS).where(*filters.conditions()).order_by(AUDIT.c.id))
