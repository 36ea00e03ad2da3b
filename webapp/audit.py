"""The audit log's one writer: every action a person takes is appended here, inside the
action's own transaction, so an action and its audit entry commit or roll back together."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import cast

from sqlalchemy import Connection, Table, insert

from .models import AuditEntry, AuditEvent

AUDIT = cast(Table, AuditEntry.__table__)
AUDIT_EVENTS = cast(Table, AuditEvent.__table__)


def write_audit(conn: Connection, *, actor: str, action: str, event_ids: Sequence[int] = (),
                reason_code: str | None = None, note: str | None = None,
                now: datetime) -> int:
    """Append one audit entry (and its event links) in the caller's transaction; its id."""
    audit_id = conn.execute(insert(AUDIT).values(
        at=now, actor=actor, action=action, event_ids=",".join(str(i) for i in event_ids),
        event_count=len(event_ids), reason_code=reason_code, note=note)
        .returning(AUDIT.c.id)).scalar_one()
    if event_ids:
        conn.execute(insert(AUDIT_EVENTS),
                     [{"audit_id": audit_id, "event_id": i} for i in event_ids])
    return int(audit_id)
