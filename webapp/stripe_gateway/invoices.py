"""Stripe's subscriptions and invoices (as dicts, API 2025-03-31 and later) reduced to what the
outbox keeps: the metered items with their periods, and invoices with their lines' periods.
The field names are those of the SDK's generated classes (``stripe._subscription_item``,
``stripe._price``, ``stripe._invoice``, ``stripe._invoice_line_item``); no SDK here.

- An item is metered when its price is recurring with ``usage_type = "metered"`` and names a
  meter (``price.recurring.meter``); a licensed item (charged in advance) is left out.
- The period is the item's (``current_period_start`` / ``current_period_end``): it moved there
  from the subscription in API 2025-03-31.
- An invoice's subscription is ``parent.subscription_details.subscription``; a line's item is
  ``parent.subscription_item_details.subscription_item`` and its period ``period.start`` /
  ``period.end``. A line of no subscription item (an invoice item) is left out.
- ``automatically_finalizes_at`` is set only while the invoice is a draft;
  ``status_transitions.finalized_at`` once it was finalized.
- A line's exact quantity is ``quantity_decimal`` (``InvoiceLineItem.quantity_decimal``, a
  decimal string in the JSON; ``quantity`` truncates it and is to be deprecated) and its
  ``amount`` is in the currency's minor unit; an invoice's ``billing_reason``
  (``subscription_create`` for a new subscription's first invoice) and ``currency``.
- A subscription's ``trial_start`` / ``trial_end``, ``start_date``, ``created``,
  ``ended_at``, ``canceled_at``, ``pause_collection.behavior`` and
  ``status_details.paused.transitioned_at`` (``Subscription``) decide whether its usage is
  invoiced.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from ..outbox.invoices import InvoiceInfo, LinePeriod, MeteredItem
from ..outbox.subscriptions import SubscriptionFacts


def _time(value: Any) -> datetime | None:
    """Unix seconds as UTC (None stays None)."""
    if value is None:
        return None
    return datetime.fromtimestamp(int(value), UTC)


def _required_time(value: Any, what: str) -> datetime:
    found = _time(value)
    if found is None:
        raise ValueError(f"{what} is missing")
    return found


def _nested(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def subscription_facts(subscription: dict[str, Any]) -> SubscriptionFacts:
    """What of a subscription decides whether its usage is invoiced."""
    pause = subscription.get("pause_collection")
    return SubscriptionFacts(
        created=_time(subscription.get("created")),
        start_date=_time(subscription.get("start_date")),
        trial_start=_time(subscription.get("trial_start")),
        trial_end=_time(subscription.get("trial_end")),
        ended_at=_time(subscription.get("ended_at")),
        canceled_at=_time(subscription.get("canceled_at")),
        pause_collection=_text(pause.get("behavior")) if isinstance(pause, dict) else None,
        paused_at=_time(_nested(subscription, "status_details", "paused", "transitioned_at")))


def metered_items(subscription: dict[str, Any],
                  items: list[dict[str, Any]]) -> list[MeteredItem]:
    """The metered items of one subscription (its ``items`` as listed, every page)."""
    customer = subscription.get("customer")
    if isinstance(customer, dict):  # expanded
        customer = customer.get("id")
    facts = subscription_facts(subscription)
    found = []
    for item in items:
        recurring = _nested(item, "price", "recurring") or {}
        meter = recurring.get("meter")
        if recurring.get("usage_type") != "metered" or not meter:
            continue
        found.append(MeteredItem(
            id=str(item["id"]), subscription_id=str(subscription["id"]),
            stripe_customer_id=str(customer), subscription_status=str(
                subscription.get("status") or "unknown"),
            meter_id=str(meter), price_id=_text(_nested(item, "price", "id")),
            period_start=_required_time(item.get("current_period_start"),
                                        "current_period_start"),
            period_end=_required_time(item.get("current_period_end"), "current_period_end"),
            subscription=facts))
    return found


def lines_from(lines: list[dict[str, Any]]) -> tuple[LinePeriod, ...]:
    """The lines of subscription items, with the period each bills."""
    found = []
    for line in lines:
        item = _nested(line, "parent", "subscription_item_details", "subscription_item")
        if not item:
            continue
        quantity, amount = line.get("quantity"), line.get("amount")
        found.append(LinePeriod(
            subscription_item_id=str(item),
            start=_required_time(_nested(line, "period", "start"), "period.start"),
            end=_required_time(_nested(line, "period", "end"), "period.end"),
            quantity=None if quantity is None else int(quantity),
            quantity_decimal=_decimal(line.get("quantity_decimal"), quantity),
            amount=None if amount is None else int(amount)))
    return tuple(found)


def _decimal(value: Any, quantity: Any) -> str | None:
    """Stripe's exact quantity as a decimal string (``quantity`` when there is none): a
    number that is not one raises, as any answer that cannot be read does."""
    if value is None:
        value = quantity
    if value is None:
        return None
    try:
        found = Decimal(str(value))
    except ArithmeticError as exc:      # decimal.InvalidOperation
        raise ValueError(f"quantity_decimal {value!r} is not a number") from exc
    if not found.is_finite():
        raise ValueError(f"quantity_decimal {value!r} is not a number")
    return format(found.normalize(), "f") if found == found.to_integral() else str(found)


def invoice_from(invoice: dict[str, Any], lines: list[dict[str, Any]]) -> InvoiceInfo | None:
    """An invoice of a subscription (None for one of no subscription)."""
    subscription = _nested(invoice, "parent", "subscription_details", "subscription")
    if isinstance(subscription, dict):  # expanded
        subscription = subscription.get("id")
    if not subscription:
        return None
    customer = invoice.get("customer")
    if isinstance(customer, dict):
        customer = customer.get("id")
    return InvoiceInfo(
        id=str(invoice["id"]), stripe_customer_id=str(customer),
        subscription_id=str(subscription), status=str(invoice.get("status") or "unknown"),
        created=_required_time(invoice.get("created"), "created"),
        finalizes_at=_time(invoice.get("automatically_finalizes_at")),
        finalized_at=_time(_nested(invoice, "status_transitions", "finalized_at")),
        lines=lines_from(lines), billing_reason=_text(invoice.get("billing_reason")),
        currency=_text(invoice.get("currency")))


def _text(value: Any) -> str | None:
    return None if value is None else str(value)
