"""Short lines: a finalized invoice line that holds fewer units than Stripe took before it
finalized (Stripe aggregates asynchronously: an event accepted moments before can miss the
line). Its missing units are late usage as one amount, ``why`` ``short_line``: Stripe has
those events, so they are never sent again as meter events. A person writes them off here
(:func:`write_off_line`), once per line, audited (``late_lines``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Connection, Engine, func, literal, select

from ..audit import write_audit
from .evidence import SHORT, SHORT_LINE, as_number
from .late import WRITTEN_OFF, LateResult
from .operations import RESOLVE_REASONS, OperationError
from .sql import INVOICE_PERIODS, LATE_LINES, TENANTS, as_utc, insert_for

AUDIT_WRITE_OFF_LINE = "late_write_off_line"


def _utc(value: Any) -> datetime:
    found = as_utc(value)
    assert found is not None
    return found


@dataclass(frozen=True)
class ShortLine:
    """A finalized line that holds fewer units than Stripe took before it finalized: late
    usage as one amount (``why``: ``short_line``)."""

    invoice_id: str
    subscription_item_id: str
    tenant_id: str | None
    stripe_customer_id: str
    meter: str
    period_start: datetime
    period_end: datetime
    finalized_at: datetime
    units: Decimal

    def as_dict(self) -> dict[str, Any]:
        return {"id": None, "tenant_id": self.tenant_id,
                "stripe_customer_id": self.stripe_customer_id, "meter": self.meter,
                "quantity": as_number(self.units), "occurred_at": None, "sent_at": None,
                "status": None, "period_start": self.period_start.isoformat(),
                "period_end": self.period_end.isoformat(), "invoice_id": self.invoice_id,
                "subscription_item_id": self.subscription_item_id,
                "finalized_at": self.finalized_at.isoformat(), "why": SHORT_LINE}


def short_lines(conn: Connection) -> list[ShortLine]:
    """The finalized lines that hold fewer units than Stripe took before they finalized,
    oldest first, with the tenant their customer is mapped to (the first, if several)."""
    lp = INVOICE_PERIODS
    tenant = (select(func.min(TENANTS.c.tenant_id))
              .where(TENANTS.c.stripe_customer_id == lp.c.stripe_customer_id)
              .scalar_subquery())
    out = []
    handled = (select(LATE_LINES.c.invoice_id).where(
        LATE_LINES.c.invoice_id == lp.c.invoice_id,
        LATE_LINES.c.subscription_item_id == lp.c.subscription_item_id).exists())
    for r in conn.execute(select(lp, tenant.label("tenant_id"))
                          .where(lp.c.verdict == literal(SHORT), ~handled)
                          .order_by(lp.c.finalized_at, lp.c.invoice_id)):
        missing = -Decimal(r.difference or "0")
        if missing > 0:
            out.append(ShortLine(str(r.invoice_id), str(r.subscription_item_id), r.tenant_id,
                                 str(r.stripe_customer_id), str(r.meter),
                                 _utc(r.period_start), _utc(r.period_end),
                                 _utc(r.finalized_at), missing))
    return out


def write_off_line(engine: Engine, invoice_id: str, item_id: str, *, actor: str, reason: str,
                   note: str, now: datetime) -> LateResult:
    """Close a short line's missing units unbilled, with a reason code and a note, audited;
    refused for a line that is not short; a second run does nothing more."""
    if reason not in RESOLVE_REASONS:
        raise OperationError(f"reason must be one of {', '.join(RESOLVE_REASONS)}, "
                             f"got {reason!r}")
    if not note or not note.strip():
        raise OperationError("a note is required")
    with engine.begin() as conn:
        done = conn.execute(select(LATE_LINES.c.action).where(
            LATE_LINES.c.invoice_id == invoice_id,
            LATE_LINES.c.subscription_item_id == item_id)).scalar()
        if done is not None:
            return LateResult(None, [], {0: str(done)}, {})
        short = [s for s in short_lines(conn)
                 if (s.invoice_id, s.subscription_item_id) == (invoice_id, item_id)]
        if not short:
            raise OperationError(f"the line of invoice {invoice_id} for item {item_id} is not "
                                 f"short: Stripe billed every unit it took before it finalized")
        conn.execute(insert_for(conn, LATE_LINES).values(
            invoice_id=invoice_id, subscription_item_id=item_id, action=WRITTEN_OFF,
            units=str(short[0].units), reason=reason, note=note, actor=actor, at=now)
            .on_conflict_do_nothing(index_elements=[LATE_LINES.c.invoice_id,
                                                    LATE_LINES.c.subscription_item_id]))
        audit_id = write_audit(conn, actor=actor, action=AUDIT_WRITE_OFF_LINE, event_ids=[],
                               reason_code=reason, note=f"{invoice_id}/{item_id}: {note}",
                               now=now)
    return LateResult(audit_id, [], {}, {})
