"""What became of the events a bulk action touched (a requeue, a resend, a resolve): the
events list's tracking summary, read by the audit entries the action wrote."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, func, select

from ..db import reading
from ..outbox.sql import AUDIT, AUDIT_EVENTS, T, row_dict
from ..status import NEEDS_A_PERSON, ON_ITS_WAY, SENT


@dataclass(frozen=True)
class Tracking:
    """What became of the events some audit entries (a bulk action) touched."""

    audit_ids: tuple[int, ...]
    action: str
    actor: str
    at: datetime
    total: int
    sent: int
    waiting: int
    failed: int
    other: int          # resolved or cancelled since

    @property
    def settled(self) -> bool:
        """Nothing is still on its way: polling may stop."""
        return self.waiting == 0

    @property
    def requeue(self) -> bool:
        return "requeue" in self.action

    @property
    def verb(self) -> str:
        """What the action did, for the summary: ``requeued``, ``sent again`` (a resend of
        what Stripe lost), or the action's own name."""
        if self.requeue:
            return "requeued"
        return "sent again" if self.action == "resend" else self.action.replace("_", " ")


def tracking(engine: Engine, audit_ids: tuple[int, ...]) -> Tracking | None:
    """The fate of the audit entries' events by status (each event once); None when there is
    no such entry."""
    with reading(engine) as conn:
        entries = conn.execute(select(AUDIT.c.action, AUDIT.c.actor, AUDIT.c.at)
                               .where(AUDIT.c.id.in_(audit_ids)).order_by(AUDIT.c.id)).all()
        if not entries:
            return None
        by = {str(s): int(n) for s, n in conn.execute(
            select(T.c.status, func.count())
            .where(T.c.id.in_(select(AUDIT_EVENTS.c.event_id)
                              .where(AUDIT_EVENTS.c.audit_id.in_(audit_ids))))
            .group_by(T.c.status))}
    total = sum(by.values())
    sent = by.get(SENT, 0)
    waiting = sum(by.get(s, 0) for s in ON_ITS_WAY)
    failed = sum(by.get(s, 0) for s in NEEDS_A_PERSON)
    first = row_dict(entries[0])
    actions = sorted({str(e.action) for e in entries})
    return Tracking(audit_ids, " and ".join(actions), first["actor"], first["at"], total,
                    sent, waiting, failed, total - sent - waiting - failed)
