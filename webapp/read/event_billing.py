"""Where one event's usage ended, in plain words for its page: on its period's finalized invoice
line, late (and what a person did: billed on a later invoice, written off), uncertain until
its line settles it, on no invoice (and why), the copy of a late event billed on a later
invoice — or not known yet (its period's invoice is not final). Read from what the judge and
the late-usage actions kept (``webapp.outbox.judge``, ``webapp.outbox.unbilled``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, select

from ..outbox.evidence import JUDGING
from ..outbox.sql import (
    INVOICE_PERIODS,
    INVOICES,
    LATE_USAGE,
    LINE_EVENTS,
    UNBILLED,
    as_utc,
)
from ..outbox.unbilled import NO_ITEM, PAUSED, TRIAL
from ..status import SENT

#: Why usage lands on no invoice, as a sentence.
UNBILLED_WORDS = {
    TRIAL: "it was used during a trial, and Stripe does not bill usage in a trial",
    PAUSED: "its subscription was paused, and a paused subscription invoices nothing",
    "ended": "its subscription ended without a final invoice for its last period",
    NO_ITEM: "its customer has no metered item on this meter, so no invoice carries it",
}


@dataclass(frozen=True)
class EventBilling:
    """Where the event's usage ended. ``place``: ``invoiced``, ``late``, ``uncertain``,
    ``late_billed``, ``written_off``, ``unbilled``, ``copy``, or ``pending`` (no finalized
    line yet); ``sentence`` says it."""

    place: str
    sentence: str
    invoice_id: str | None = None
    finalized_at: datetime | None = None
    #: The other event of a late one billed on a later invoice (the copy, or the original).
    other_event: int | None = None


def event_billing(conn: Connection, event: dict[str, Any]) -> EventBilling | None:
    """Where ``event`` (a row as a dict) ended; None for an event Stripe has not taken."""
    event_id = int(event["id"])
    copy_of = conn.execute(select(LATE_USAGE.c.event_id).where(
        LATE_USAGE.c.new_event_id == event_id)).scalar()
    if copy_of is not None:
        return EventBilling("copy", f"This event bills late event #{copy_of} on a later "
                            "invoice: its units are counted once, on the original.",
                            other_event=int(copy_of))
    handled = conn.execute(select(LATE_USAGE).where(LATE_USAGE.c.event_id == event_id)).first()
    if handled is not None:
        if handled.action == "billed_next":
            return EventBilling("late_billed", "It reached Stripe after its invoice "
                                f"{handled.invoice_id} was final; billed on a later invoice "
                                f"as event #{handled.new_event_id}.", handled.invoice_id,
                                other_event=handled.new_event_id)
        return EventBilling("written_off", "It reached Stripe after its invoice "
                            f"{handled.invoice_id} was final and was written off "
                            f"({handled.reason}): it will not be billed.", handled.invoice_id)
    if event["status"] != SENT:
        return None
    reason = conn.execute(select(UNBILLED.c.reason).where(
        UNBILLED.c.event_id == event_id)).scalar()
    if reason is not None:
        return EventBilling("unbilled", "Stripe took it, but it is on no invoice: "
                            f"{UNBILLED_WORDS.get(str(reason), str(reason))}.")
    judged = conn.execute(select(LINE_EVENTS).where(LINE_EVENTS.c.event_id == event_id)
                          .order_by(LINE_EVENTS.c.finalized_at)).first()
    if judged is not None:
        at = as_utc(judged.finalized_at)
        if judged.place == "late" or judged.settled == "late":
            return EventBilling("late", f"It reached Stripe after invoice {judged.invoice_id} "
                                "was final: it is on no invoice until someone bills it "
                                "later or writes it off (Late usage).", judged.invoice_id, at)
        if judged.settled is None:
            return EventBilling("uncertain", "One of its calls began before invoice "
                                f"{judged.invoice_id} was final and the answer came after: "
                                "the invoice's line decides whether it is on it.",
                                judged.invoice_id, at)
    line = _line_of(conn, event)
    if line is None:
        return EventBilling("pending", "Stripe took it; it is billed when its period's "
                            "invoice is finalized.")
    return EventBilling("invoiced", f"Billed on invoice {line.invoice_id}, finalized "
                        "with this event on its line.", str(line.invoice_id),
                        as_utc(line.finalized_at))


def _line_of(conn: Connection, event: dict[str, Any]) -> Any:
    """The first finalized line that judges the event's customer, meter and time."""
    lp = INVOICE_PERIODS
    return conn.execute(select(lp.c.invoice_id, lp.c.finalized_at)
                        .join(INVOICES, INVOICES.c.id == lp.c.invoice_id)
                        .where(lp.c.stripe_customer_id == event["stripe_customer_id"],
                               lp.c.meter == event["meter"],
                               lp.c.period_start <= event["occurred_at"],
                               lp.c.period_end > event["occurred_at"],
                               and_(lp.c.finalized_at.is_not(None),
                                    lp.c.verdict.in_(list(JUDGING))))
                        .order_by(lp.c.finalized_at).limit(1)).first()
