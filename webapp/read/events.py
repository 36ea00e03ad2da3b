"""One event's page: every field, every call made for it, the audit entries touching it;
and finding an event by its id or idempotency key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, select

from ..db import reading
from ..outbox.deferred import waits_for
from ..outbox.meters import MeterInfo, known_meter
from ..outbox.sql import ATTEMPTS, AUDIT, AUDIT_EVENTS, TENANTS, T, row_dict
from .event_billing import EventBilling, event_billing
from .stripe_side import samples_for_event
from .words import answer_label


@dataclass(frozen=True)
class EventDetail:
    event: dict[str, Any]
    #: The calls made for it, newest first; each with ``answer``: how Stripe's answer is
    #: introduced (:func:`webapp.read.words.answer_label`: a note, an error, or None).
    attempts: list[dict[str, Any]]
    audit: list[dict[str, Any]]
    tenant: dict[str, Any] | None
    #: Stripe's error samples that named this event (its rejections, past and present).
    samples: list[dict[str, Any]]
    #: What a pending event waits for before it can be sent: "customer", "meter" or None
    #: (:func:`webapp.outbox.deferred.waits_for`).
    waits: str | None = None
    #: The meter it waits for, as last listed (None when Stripe never listed it): why it
    #: cannot be sent to (inactive, pre-aggregated).
    meter: MeterInfo | None = None
    #: Where its usage ended: on an invoice, late, on no invoice… (None before Stripe took it).
    billing: EventBilling | None = None


def event_detail(engine: Engine, event_id: int) -> EventDetail | None:
    """Every field of an event, every call made for it, and the audit entries touching it;
    None when there is no such event."""
    with reading(engine) as conn:
        row = conn.execute(select(T).where(T.c.id == event_id)).first()
        if row is None:
            return None
        attempts = [_with_answer(row_dict(r)) for r in conn.execute(
            select(ATTEMPTS).where(ATTEMPTS.c.event_id == event_id)
            .order_by(ATTEMPTS.c.attempted_at.desc(), ATTEMPTS.c.id.desc()))]
        audit = [row_dict(r) for r in conn.execute(
            select(AUDIT).join(AUDIT_EVENTS, AUDIT_EVENTS.c.audit_id == AUDIT.c.id)
            .where(AUDIT_EVENTS.c.event_id == event_id).order_by(AUDIT.c.id.desc()))]
        tenant = conn.execute(select(TENANTS).where(TENANTS.c.tenant_id == row.tenant_id)).first()
        samples = samples_for_event(conn, event_id)
        event = row_dict(row)
        waits = waits_for(conn, event)
        meter = known_meter(conn, event["meter"]) if waits == "meter" else None
        billing = event_billing(conn, event)
    return EventDetail(event, attempts, audit, row_dict(tenant) if tenant else None,
                       samples, waits, meter, billing)


def _with_answer(attempt: dict[str, Any]) -> dict[str, Any]:
    attempt["answer"] = answer_label(attempt["outcome"], attempt["http_status"],
                                     error_class=attempt["error_class"],
                                     error_code=attempt["error_code"],
                                     message=attempt["error_message"])
    return attempt
