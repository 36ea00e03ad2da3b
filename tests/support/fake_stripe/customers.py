"""Customers as Stripe lists them: ``GET /v1/customers`` (``limit`` 1–100, default 10,
``starting_after``, ``has_more``), oldest first here (Stripe lists newest first; the order is
not part of what the product relies on), each with its ``name`` and ``metadata``.

Tests add them with :meth:`CustomersMixin.create_customer` (or ``POST /_fake/stripe_customers``
from another process). Stripe does not list deleted customers; one made with ``deleted=True``
is listed as the stub Stripe answers for a deleted customer (``{"id", "object", "deleted":
true}``), the hostile case a reader must skip.

``GET /v1/customers/{id}`` answers as Stripe does: the customer; the stub for a deleted one;
a 404 ``resource_missing`` for an id Stripe does not have. Which customers exist: those created
here, and those made known with :meth:`FakeStripe.add_customer`; while neither was ever done,
every customer exists (tests that do not care). The checks after a meter event's 200 use the
same answer: an event of a deleted or unknown customer is reported
``meter_event_customer_not_found``. :meth:`CustomersMixin.delete_customer` deletes one later."""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import parse_qs

from .http import Response, error, invalid, ok


class CustomersMixin:
    """The customers of :class:`FakeStripe` (which holds the lock)."""

    _lock: threading.Lock
    page_cap: int
    _stripe_customers: dict[str, dict[str, Any]]
    _customers: set[str] | None
    customer_list_calls: int
    #: ``GET /v1/customers/{id}`` calls, by id.
    customer_lookups: dict[str, int]

    def _customer_state_locked(self, customer_id: str) -> str:
        """``active``, ``deleted`` or ``missing`` (lock held)."""
        found = self._stripe_customers.get(customer_id)
        if found is not None:
            return "deleted" if found.get("deleted") else "active"
        if customer_id in (self._customers or ()):
            return "active"
        # No customer made known at all: every customer exists (tests that do not care).
        return "active" if self._customers is None and not self._stripe_customers else "missing"

    def delete_customer(self, customer_id: str) -> None:
        """Delete a customer (from now on Stripe answers the deleted stub, and the checks
        after a meter event's 200 refuse its events)."""
        with self._lock:
            if self._customers is not None:
                self._customers.discard(customer_id)
            self._stripe_customers[customer_id] = {"id": customer_id, "object": "customer",
                                                   "deleted": True}

    def _serve_customer(self, customer_id: str) -> Response:
        with self._lock:
            self.customer_lookups[customer_id] = self.customer_lookups.get(customer_id, 0) + 1
            state = self._customer_state_locked(customer_id)
            found = self._stripe_customers.get(customer_id)
        if state == "missing":
            return error(404, "invalid_request_error", f"No such customer: '{customer_id}'",
                         code="resource_missing", param="id")
        if found is not None:
            return ok(found)
        return ok({"id": customer_id, "object": "customer", "name": None, "email": None,
                   "metadata": {}, "livemode": False, "created": 1})

    def create_customer(self, customer_id: str | None = None, *, name: str | None = None,
                        metadata: dict[str, str] | None = None,
                        deleted: bool = False) -> str:
        """Create (or replace) a customer; its id (``cus_fake…`` unless given)."""
        with self._lock:
            cid = customer_id or f"cus_fake{len(self._stripe_customers) + 1:06d}"
            self._stripe_customers.pop(cid, None)  # a replaced one moves to the end
            self._stripe_customers[cid] = (
                {"id": cid, "object": "customer", "deleted": True} if deleted else
                {"id": cid, "object": "customer", "name": name, "email": None,
                 "metadata": dict(metadata or {}), "livemode": False,
                 "created": len(self._stripe_customers) + 1})
            return cid

    def _serve_customer_list(self, query: str) -> Response:
        q = parse_qs(query)
        raw_limit = (q.get("limit") or ["10"])[0]
        if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= 100:
            return invalid("This value must be between 1 and 100.", param="limit")
        limit = min(int(raw_limit), self.page_cap)
        after = q["starting_after"][0] if q.get("starting_after") else None
        with self._lock:
            self.customer_list_calls += 1
            customers = list(self._stripe_customers.values())
        if after is not None:
            ids = [c["id"] for c in customers]
            if after not in ids:
                return invalid(f"No such customer: '{after}'", param="starting_after",
                               code="resource_missing")
            customers = customers[ids.index(after) + 1:]
        return ok({"object": "list", "url": "/v1/customers",
                   "has_more": len(customers) > limit, "data": customers[:limit]})
