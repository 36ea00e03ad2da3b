"""The Overview's alerts about billing: usage that may miss its invoice, usage that did (late),
usage that no invoice will carry, customers billed twice for one meter — from the figures the
maintenance services keep (``webapp.outbox.billing_watch``), never summed per view."""

from __future__ import annotations

from datetime import datetime

from ..outbox.billing_watch import INVOICE_RISK, LATE, OVERLAPS, UNBILLED, Watch
from .alerts import EVENTS, Alert, human


def invoice_at_risk(watch: dict[str, Watch], *, now: datetime,
                    within: float) -> Watch | None:
    """The invoice risk kept, while a draft with usage unsent finalizes within ``within``
    seconds (None otherwise)."""
    risk = watch.get(INVOICE_RISK)
    if risk is None or not risk.events or risk.soonest_at is None:
        return None
    return risk if (risk.soonest_at - now).total_seconds() <= within else None


def billing_alerts(watch: dict[str, Watch], *, now: datetime, within: float) -> list[Alert]:
    """Usage that may miss its invoice, and usage that did (late, not handled yet)."""
    out = []
    risk = invoice_at_risk(watch, now=now, within=within)
    if risk is not None:
        when = ("is finalizing now" if risk.soonest_at is not None and risk.soonest_at <= now
                else f"finalizes in {human((risk.soonest_at - now).total_seconds())}"
                if risk.soonest_at is not None else "finalizes soon")
        out.append(Alert("critical", f"{risk.units:,} unit{'s' if risk.units != 1 else ''} "
                         "may miss their invoice",
                         f"{risk.events:,} event(s) of {risk.customers:,} customer(s) are not "
                         f"at Stripe, and their draft invoice {when}. Usage that arrives "
                         "after that is on no invoice.", "periods.index",
                         fix="See what they wait for", fix_link="periods.index",
                         kind="invoice_risk", count=risk.events))
    late = watch.get(LATE)
    if late is not None and late.events:
        out.append(Alert("warning", f"Late usage: {late.units:,} unit"
                         f"{'s' if late.units != 1 else ''} on no invoice",
                         f"{late.events:,} event(s) of {late.customers:,} customer(s) reached "
                         "Stripe after their invoice was final, or have not reached it. "
                         "Bill them on the next invoice or write them off.",
                         "periods.late_usage", fix="Review late usage",
                         fix_link="periods.late_usage", kind="late_usage", count=late.events))
    unbilled = watch.get(UNBILLED)
    if unbilled is not None and unbilled.events:
        out.append(Alert("warning", f"{unbilled.units:,} unit"
                         f"{'s' if unbilled.units != 1 else ''} will be on no invoice",
                         f"{unbilled.events:,} event(s) of {unbilled.customers:,} customer(s) "
                         "that Stripe took while their subscription was in a trial, paused or "
                         "ended, or with no metered item on the meter: Stripe counts them and "
                         "bills them nowhere.", EVENTS, {"unbilled": "any"},
                         fix="See the invoices", fix_link="invoices.index",
                         kind="unbilled_usage", count=unbilled.events))
    doubled = watch.get(OVERLAPS)
    if doubled is not None and doubled.customers:
        out.append(Alert("warning", f"{doubled.customers:,} customer"
                         f"{'s are' if doubled.customers != 1 else ' is'} billed twice for the "
                         "same usage",
                         "Each has two metered items on one meter: Stripe bills every event on "
                         "each line. Remove one item in Stripe.", "invoices.index",
                         fix="See which", fix_link="invoices.index", kind="billed_twice",
                         count=doubled.customers))
    return out
