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
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ..outbox.invoices import InvoiceInfo, LinePeriod, MeteredItem


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


def metered_items(subscription: dict[str, Any],
                  items: list[dict[str, Any]]) -> list[MeteredItem]:
    """The metered items of one subscription (its ``items`` as listed, every page)."""
    customer = subscription.get("customer")
    if isinstance(customer, dict):  # expanded
        customer = customer.get("id")
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
            period_end=_required_time(item.get("current_period_end"), "current_period_end")))
    return found


def lines_from(lines: list[dict[str, Any]]) -> tuple[LinePeriod, ...]:
    """The lines of subscription items, with the period each bills."""
    found = []
    for line in lines:
        item = _nested(line, "parent", "subscription_item_details", "subscription_item")
        if not item:
            continue
        quantity = line.get("quantity")
        found.append(LinePeriod(
            subscription_item_id=str(item),
            start=_required_time(_nested(line, "period", "start"), "period.start"),
            end=_required_time(_nested(line, "period", "end"), "period.end"),
            quantity=None if quantity is None else int(quantity)))
    return tuple(found)


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
        lines=lines_from(lines))


def _text(value: Any) -> str | None:
    return None if value is None else str(value)
