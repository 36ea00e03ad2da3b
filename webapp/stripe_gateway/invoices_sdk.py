"""The gateway's reads of Stripe's billing through the SDK: every subscription's metered
items, the invoices created since a time, one invoice. Each list is read page after page
(``starting_after`` while ``has_more``), pages of 100, ``pace`` called before each call; what
the answers mean is :mod:`.invoices`.

The calls go through the SDK's client (``StripeClient.raw_request``: its key, API version,
retries and errors) and its answers are read as the JSON Stripe sent, not turned into
``StripeObject`` trees: a page of 100 subscriptions with their items and prices is about
2,500 objects, and building them cost more than the call itself (100,000 customers: most of
a refresh). The fields read are the generated classes' (``stripe._subscription`` …)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any
from urllib.parse import quote

import stripe

from ..outbox.invoices import InvoiceInfo, MeteredItem
from ..outbox.states import CallResult, Outcome
from .data import StripeCallFailed
from .errors import classify_error
from .invoices import invoice_from, metered_items

#: What an answer that cannot be read raises while it is taken apart.
_MALFORMED = (AttributeError, KeyError, TypeError, ValueError, OverflowError)


def _get(client: stripe.StripeClient, path: str, params: dict[str, Any]) -> dict[str, Any]:
    """``GET path`` with ``params`` through the SDK; the answer's JSON object."""
    answer = client.raw_request("get", path, **params).data
    if not isinstance(answer, dict):
        raise TypeError(f"GET {path} answered {type(answer).__name__}, not an object")
    return answer


def _pages(client: stripe.StripeClient, path: str, params: dict[str, Any],
           pace: Callable[[], object] | None) -> Iterator[dict[str, Any]]:
    """Every object of a v1 list, page after page."""
    while True:
        if pace is not None:
            pace()
        page = _get(client, path, params)
        found = list(page["data"])
        yield from found
        if not page.get("has_more") or not found:
            return
        params = dict(params, starting_after=str(found[-1]["id"]))


def _embedded_rest(client: stripe.StripeClient, listed: dict[str, Any] | None, path: str,
                   params: dict[str, Any], page_size: int,
                   pace: Callable[[], object] | None) -> list[dict[str, Any]]:
    """An embedded list (an invoice's lines, a subscription's items), the rest of it read
    from its own list (``path`` with ``params``) when it says there is more."""
    data = list((listed or {}).get("data") or [])
    if (listed or {}).get("has_more") and data:
        data += _pages(client, path, dict(params, limit=page_size,
                                          starting_after=str(data[-1]["id"])), pace)
    return data


def _failed(what: str, exc: Exception) -> StripeCallFailed:
    if isinstance(exc, stripe.StripeError):
        return StripeCallFailed(what, classify_error(exc))
    return StripeCallFailed(what, CallResult(Outcome.PERMANENT, error_class="MalformedAnswer",
                                             message=f"an answer could not be read: {exc}"))


class BillingReads:
    """Subscriptions and invoices, for :class:`~.client.SdkGateway`."""

    _client: stripe.StripeClient

    def list_subscriptions(self, *, page_size: int = 100,
                           pace: Callable[[], object] | None = None) -> list[MeteredItem]:
        """The metered items of every subscription, whatever its status (``GET
        /v1/subscriptions``, ``status=all``), each with its own period; the rest of a
        subscription's items from ``GET /v1/subscription_items`` when the embedded list says
        there are more."""
        client = self._client
        found: list[MeteredItem] = []
        try:
            for sub in _pages(client, "/v1/subscriptions", {"status": "all", "limit": page_size},
                              pace):
                found += metered_items(sub, _embedded_rest(
                    client, sub.get("items"), "/v1/subscription_items",
                    {"subscription": str(sub["id"])}, page_size, pace))
        except (stripe.StripeError, *_MALFORMED) as exc:
            raise _failed("listing subscriptions", exc) from exc
        return found

    def list_invoices(self, *, created_gte: datetime, page_size: int = 100,
                      pace: Callable[[], object] | None = None,
                      status: str | None = None) -> list[InvoiceInfo]:
        """Every invoice created at or after ``created_gte`` (``GET /v1/invoices``,
        ``created[gte]``; of that ``status`` only, when given), with the periods of its
        subscription items' lines (the rest from ``GET /v1/invoices/{id}/lines`` when the
        embedded ones say there are more). Invoices of no subscription are left out."""
        found: list[InvoiceInfo] = []
        params: dict[str, Any] = {"limit": page_size,
                                  "created": {"gte": int(created_gte.timestamp())}}
        if status is not None:
            params["status"] = status
        try:
            for inv in _pages(self._client, "/v1/invoices", params, pace):
                info = invoice_from(inv, self._lines(inv, page_size, pace))
                if info is not None:
                    found.append(info)
        except (stripe.StripeError, *_MALFORMED) as exc:
            raise _failed("listing invoices", exc) from exc
        return found

    def retrieve_subscription(self, subscription_id: str) -> list[MeteredItem]:
        """One subscription's metered items (``GET /v1/subscriptions/{id}``, the rest of its
        items from ``GET /v1/subscription_items`` when the embedded list says there are
        more); none when it has no metered item."""
        client = self._client
        try:
            sub = _get(client, f"/v1/subscriptions/{quote(subscription_id, safe='')}", {})
            return metered_items(sub, _embedded_rest(
                client, sub.get("items"), "/v1/subscription_items",
                {"subscription": str(sub["id"])}, 100, None))
        except (stripe.StripeError, *_MALFORMED) as exc:
            raise _failed(f"reading subscription {subscription_id}", exc) from exc

    def retrieve_invoice(self, invoice_id: str) -> InvoiceInfo | None:
        """One invoice (``GET /v1/invoices/{id}``) with every line; None when it bills no
        subscription."""
        try:
            inv = _get(self._client, f"/v1/invoices/{quote(invoice_id, safe='')}", {})
            return invoice_from(inv, self._lines(inv, 100, None))
        except (stripe.StripeError, *_MALFORMED) as exc:
            raise _failed(f"reading invoice {invoice_id}", exc) from exc

    def _lines(self, invoice: dict[str, Any], page_size: int,
               pace: Callable[[], object] | None) -> list[dict[str, Any]]:
        path = f"/v1/invoices/{quote(str(invoice['id']), safe='')}/lines"
        return _embedded_rest(self._client, invoice.get("lines"), path, {}, page_size, pace)
