"""Cancelling sent events at Stripe: ``billing-outbox cancel`` and the event page's button.
A meter event adjustment per event (Stripe takes them within 24 hours of receiving the event),
made with no transaction open; then the events Stripe cancelled are recorded ``cancelled``,
each with Stripe's answer."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Engine

from ..outbox import operations
from ..outbox.adjustments import CancelAnswer, KeptAdjustment
from ..outbox.states import Outcome
from ..stripe_gateway import StripeGateway

log = logging.getLogger(__name__)


@dataclass
class CancelOutcome:
    """Which events Stripe cancelled (with its answer for each, as the event keeps it), and
    which it refused (with its answer)."""

    cancelled: list[int] = field(default_factory=list)
    refused: list[tuple[int, str]] = field(default_factory=list)
    audit_id: int | None = None
    adjustments: dict[int, KeptAdjustment] = field(default_factory=dict)


def cancel_events(engine: Engine, stripe: StripeGateway, ids: Sequence[int], *, actor: str,
                  reason: str, note: str, now: datetime) -> CancelOutcome:
    """Cancel the events at Stripe and record what Stripe did and answered.

    Raises ``OperationError`` (nothing changed, nothing asked of Stripe) when any event cannot
    be cancelled: not sent, or accepted more than 24 hours ago. Stripe refusing one event does
    not undo the others it cancelled: those are recorded with Stripe's answer (the
    adjustment's status and id, or the call's request id), the refusals returned.
    """
    targets = operations.cancel_targets(engine, ids, reason=reason, note=note, now=now)
    out = CancelOutcome()
    taken: dict[int, CancelAnswer] = {}
    for t in targets:
        answer = stripe.cancel_meter_event(t.meter, t.identifier)
        result = answer.call
        if result.outcome is Outcome.DELIVERED:
            taken[t.id] = answer
            continue
        detail = f"HTTP {result.http_status}" if result.http_status else result.error_class
        request = f" (request {result.request_id})" if result.request_id else ""
        out.refused.append((t.id, f"Stripe did not cancel it: {detail}: "
                                  f"{result.message or ''}{request}".strip()))
        log.warning("cancel of event %d refused by Stripe: %s", t.id, out.refused[-1][1])
    if taken:
        recorded = operations.record_cancelled(engine, taken, actor=actor, reason=reason,
                                               note=note, now=now)
        out.audit_id = recorded.audit_id
        out.cancelled = recorded.event_ids
        out.adjustments = recorded.adjustments
    return out
