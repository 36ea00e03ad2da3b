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
same answer, judged as the customer was when the event was received: an event of an unknown
customer, or of a deleted one received after its deletion, is reported
``meter_event_customer_not_found``; one received before the deletion was valid.

:meth:`CustomersMixin.delete_customer` deletes one later (``at=``: at another time; a time
already past refuses the events received since, as Stripe would have). Stripe's deleted stub
carries no time: like Stripe, the fake records a v1 event ``customer.deleted`` (its
``created`` is the deletion time), listed at ``GET /v1/events`` (``type`` or ``types``,
``created`` or ``created[gte|gt|lte|lt]``, ``limit`` 1–100, default 10, ``starting_after``,
``ending_before``, ``has_more``; newest first, as Stripe lists). A customer created already
deleted (``deleted=True``) has no such event: its deletion is older than what Stripe keeps."""

from __future__ import annotations

import fnmatch
import re
import secrets
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs

from .http import Response, error, invalid, ok

#: The ``api_version`` the fake's v1 events are rendered in (the SDK's own).
EVENTS_API_VERSION = "2026-10-28.endive"
#: What a stored customer holds that Stripe does not serve: its deletion time and event.
_DELETED_AT, _EVENT = "_deleted_at", "_event"
_CREATED_RE = re.compile(r"^created(?:\[(gte|gt|lte|lt)\])?$")


def _served(customer: dict[str, Any]) -> dict[str, Any]:
    """A stored customer as Stripe serves it (without what the fake keeps beside it)."""
    return {k: v for k, v in customer.items() if not k.startswith("_")}


class CustomersMixin:
    """The customers of :class:`FakeStripe` (which holds the lock)."""

    _lock: threading.Lock
    _clock: Callable[[], float]
    page_cap: int
    _stripe_customers: dict[str, dict[str, Any]]
    _customers: set[str] | None
    customer_list_calls: int
    #: ``GET /v1/customers/{id}`` calls, by id.
    customer_lookups: dict[str, int]
    #: ``GET /v1/events`` calls (since the fake was made).
    v1_event_list_calls: int = 0
    #: Set to 500 (or 502, 503, 504): ``GET /v1/events`` answers that, as an outage of that
    #: read alone would (the other routes answer as usual).
    v1_events_failing: int | None = None
    _refuse_received_since_locked: Callable[[str, float], int]

    def _customer_state_locked(self, customer_id: str, at: float | None = None) -> str:
        """``active``, ``deleted`` or ``missing`` (lock held), at the fake's time ``at``
        (now when None): a customer deleted later than ``at`` was still active then."""
        found = self._stripe_customers.get(customer_id)
        if found is not None:
            if not found.get("deleted"):
                return "active"
            deleted_at = found.get(_DELETED_AT)
            when = self._clock() if at is None else at
            return "active" if deleted_at is not None and when < deleted_at else "deleted"
        if customer_id in (self._customers or ()):
            return "active"
        # No customer made known at all: every customer exists (tests that do not care).
        return "active" if self._customers is None and not self._stripe_customers else "missing"

    def delete_customer(self, customer_id: str, *, at: float | datetime | None = None) -> str:
        """Delete a customer at ``at`` (Unix seconds or a datetime; now when None): Stripe
        answers the deleted stub from then on, the checks after a meter event's 200 refuse
        its events received from then on (those received since ``at``, when it is past,
        are refused now and reported with the next flush), and a v1 event
        ``customer.deleted`` created then is listed. The event's id."""
        when = (self._clock() if at is None
                else at.timestamp() if isinstance(at, datetime) else float(at))
        event = {"id": "evt_" + secrets.token_hex(12), "object": "event",
                 "type": "customer.deleted", "created": int(when),
                 "api_version": EVENTS_API_VERSION, "livemode": False, "pending_webhooks": 0,
                 "request": {"id": None, "idempotency_key": None},
                 "data": {"object": {"id": customer_id, "object": "customer",
                                     "deleted": True}}}
        with self._lock:
            if self._customers is not None:
                self._customers.discard(customer_id)
            self._stripe_customers[customer_id] = {"id": customer_id, "object": "customer",
                                                   "deleted": True, _DELETED_AT: when,
                                                   _EVENT: event}
            self._refuse_received_since_locked(customer_id, when)
        return str(event["id"])

    def deleted_customer_events(self) -> list[dict[str, Any]]:
        """The v1 ``customer.deleted`` events recorded so far, newest first."""
        with self._lock:
            return _newest_first([dict(c[_EVENT]) for c in self._stripe_customers.values()
                                  if c.get(_EVENT) is not None])

    def _serve_customer(self, customer_id: str) -> Response:
        with self._lock:
            self.customer_lookups[customer_id] = self.customer_lookups.get(customer_id, 0) + 1
            state = self._customer_state_locked(customer_id)
            found = self._stripe_customers.get(customer_id)
        if state == "missing":
            return error(404, "invalid_request_error", f"No such customer: '{customer_id}'",
                         code="resource_missing", param="id")
        if found is not None and (state == "deleted" or not found.get("deleted")):
            return ok(_served(found))   # the customer, or the stub once it is deleted
        return ok({"id": customer_id, "object": "customer", "name": None, "email": None,
                   "metadata": {}, "livemode": False, "created": 1})

    def _serve_v1_event_list(self, query: str) -> Response:
        """``GET /v1/events``: the v1 events the fake records (customers deleted), newest
        first, filtered by ``type`` (``*`` a wildcard) or ``types``, and ``created``."""
        with self._lock:
            self.v1_event_list_calls += 1
            failing = self.v1_events_failing
        if failing is not None:
            return error(failing, "api_error",
                         "An unknown error occurred while processing the request.")
        q = parse_qs(query)
        raw_limit = (q.get("limit") or ["10"])[0]
        if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= 100:
            return invalid("This value must be between 1 and 100.", param="limit")
        limit = min(int(raw_limit), self.page_cap)
        types = [v for k, vs in sorted(q.items()) if k == "types" or k.startswith("types[")
                 for v in vs]
        type_ = (q.get("type") or [None])[0]
        if type_ is not None and types:
            return invalid("You may pass either `type` or `types`, but not both.",
                           param="types")
        bounds: list[tuple[str, int]] = []
        for key, values in q.items():
            m = _CREATED_RE.match(key)
            if m is None:
                continue
            if not values[0].lstrip("-").isdigit():
                return invalid(f"Invalid integer: {values[0]}", param=key)
            bounds.append((m.group(1) or "eq", int(values[0])))
        with self._lock:
            events = [dict(c[_EVENT]) for c in self._stripe_customers.values()
                      if c.get(_EVENT) is not None]
        events = [e for e in _newest_first(events)
                  if (type_ is None or fnmatch.fnmatchcase(e["type"], type_))
                  and (not types or e["type"] in types)
                  and all(_within(e["created"], op, v) for op, v in bounds)]
        ids = [e["id"] for e in events]
        after = (q.get("starting_after") or [None])[0]
        before = (q.get("ending_before") or [None])[0]
        for cursor, param in ((after, "starting_after"), (before, "ending_before")):
            if cursor is not None and cursor not in ids:
                return invalid(f"No such event: '{cursor}'", param=param,
                               code="resource_missing")
        if after is not None:
            events = events[ids.index(after) + 1:]
            more = len(events) > limit
            events = events[:limit]
        elif before is not None:
            events = events[:ids.index(before)]
            more = len(events) > limit
            events = events[-limit:]
        else:
            more = len(events) > limit
            events = events[:limit]
        return ok({"object": "list", "url": "/v1/events", "has_more": more, "data": events})

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
            customers = [_served(c) for c in self._stripe_customers.values()]
        if after is not None:
            ids = [c["id"] for c in customers]
            if after not in ids:
                return invalid(f"No such customer: '{after}'", param="starting_after",
                               code="resource_missing")
            customers = customers[ids.index(after) + 1:]
        return ok({"object": "list", "url": "/v1/customers",
                   "has_more": len(customers) > limit, "data": customers[:limit]})


def _newest_first(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events newest first (those created in one second: the later recorded first)."""
    return [e for _, e in sorted(enumerate(events), key=lambda p: (p[1]["created"], p[0]),
                                 reverse=True)]


def _within(created: int, op: str, value: int) -> bool:
    return {"eq": created == value, "gte": created >= value, "gt": created > value,
            "lte": created <= value, "lt": created < value}[op]
