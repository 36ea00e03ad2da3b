"""Meters, their event summaries and meter event adjustments, as Stripe serves them:
``GET /v1/billing/meters`` (every meter, paginated, no filter by event name),
``GET /v1/billing/meters/{id}/event_summaries`` (one customer, per day or hour, paginated;
eventually consistent when ``summary_delay`` is set), and
``POST /v1/billing/meter_event_adjustments`` (``type=cancel``, within 24 hours; answered with a
``billing.meter_event_adjustment`` whose ``status`` is ``pending`` unless a test says
otherwise, and no ``id``, as the v1 object documents none). A test can make the summaries lose
a customer's day (:meth:`BillingMixin.forget`)."""

from __future__ import annotations

import secrets
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any
from urllib.parse import parse_qs, parse_qsl

from .http import Response, invalid, ok
from .meter_events import AcceptedEvent, FakeMeter

CANCEL_WINDOW_SECONDS = 24 * 3600
DAY, HOUR = 86400, 3600


@dataclass(frozen=True)
class Usage:
    """Units another system sent for a customer (or a hand-made correction): summaries count
    them, the outbox never sent them."""

    customer: str
    event_name: str
    timestamp: int
    value: float
    #: When it was added (the fake's clock): an invoice finalized before then leaves it out.
    received_at: float | None = None


def _one(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[0] if values else None


class BillingMixin:
    """Meters, summaries and adjustments of :class:`FakeStripe` (which holds the state)."""

    _lock: threading.Lock
    _clock: Callable[[], float]
    _meters: dict[str, FakeMeter]
    _accepted: dict[str, AcceptedEvent]
    _also_accepted: list[AcceptedEvent]
    _usage: list[Usage]
    _by_pair: defaultdict[tuple[str, str], list[Any]]
    page_cap: int
    summary_delay: float
    summary_calls: int
    _meter_seq: int
    _adjustment_answer: tuple[str, bool | str]
    _adjustments: list[dict[str, Any]]

    # -- configuration ----------------------------------------------------------------------
    def add_meter(self, event_name: str, *, customer_key: str = "stripe_customer_id",
                  value_key: str = "value", formula: str = "sum",
                  status: str = "active", meter_id: str | None = None,
                  display_name: str | None = None,
                  event_time_window: str | None = None) -> str:
        """Create (or replace) the meter of ``event_name``; its id (``meter_id`` when given:
        any text, however long, as a poisoned listing would carry). ``event_time_window``
        (``day`` or ``hour``) makes it pre-aggregated. Stripe cannot change a meter but for
        its display name: an event name's meter changes its window by being replaced, as
        here (a new id)."""
        with self._lock:
            self._meter_seq += 1
            meter = FakeMeter(id=meter_id or f"mtr_fake{self._meter_seq:06d}",
                              event_name=event_name, status=status,
                              customer_key=customer_key, value_key=value_key, formula=formula,
                              display_name=(event_name.replace("_", " ") if display_name is None
                                            else display_name),
                              created=self._meter_seq, event_time_window=event_time_window)
            self._meters[event_name] = meter
            return meter.id

    def set_meter_status(self, event_name: str, status: str) -> None:
        """``active`` or ``inactive`` (deactivated in the dashboard)."""
        with self._lock:
            self._meters[event_name].status = status

    def remove_meter(self, event_name: str) -> None:
        """The meter no longer exists (it is not listed at all)."""
        with self._lock:
            self._meters.pop(event_name, None)

    def meter_id(self, event_name: str) -> str:
        with self._lock:
            return self._meters[event_name].id

    def add_usage(self, customer: str, event_name: str, timestamp: int, value: float) -> None:
        """Units that reach the summaries without the outbox (another system, a hand-made
        adjustment; negative to take units away)."""
        now = self._clock()
        with self._lock:
            usage = Usage(customer, event_name, int(timestamp), float(value), now)
            self._usage.append(usage)
            self._by_pair[(event_name, customer)].append(usage)

    def forget(self, customer: str, event_name: str, day: date | str, *, keep: int = 0) -> int:
        """Stripe loses what it accepted for ``customer`` on ``event_name``'s meter on the UTC
        ``day`` (a date, or ``YYYY-MM-DD``): its summaries then count none of those events
        but the first ``keep`` received (part of the day). Their identifiers stay taken, so
        the same identifier sent again is still answered "already exists"; events accepted
        later count as usual. Stripe documents no such loss: this is the fault that
        reconciliation exists to find. Returns how many events were forgotten."""
        when = day if isinstance(day, date) else date.fromisoformat(day)
        start = int(datetime(when.year, when.month, when.day, tzinfo=UTC).timestamp())
        with self._lock:
            those = sorted((e for e in self._by_pair.get((event_name, customer), ())
                            if isinstance(e, AcceptedEvent) and start <= e.timestamp < start + DAY
                            and not e.lost), key=lambda e: e.received_at)
            for e in those[keep:]:
                e.lost = True
            return len(those[keep:])

    def answer_adjustments(self, *, status: str = "pending", ids: bool | str = False) -> None:
        """How adjustments are answered from now until :meth:`reset`: with ``status``
        (``pending``, as Stripe answers a fresh adjustment, or ``complete``; any text, as a
        poisoned answer would carry it) and, with ``ids``, an ``id``, which the v1 object
        documents none of: ``True`` gives each adjustment its own ``mea_…``, a text is every
        answer's id as it is."""
        with self._lock:
            self._adjustment_answer = (status, ids)

    def adjustments(self) -> list[dict[str, Any]]:
        """Every adjustment made, oldest first: ``identifier``, ``event_name``, and the
        ``status``, ``id`` (None without one) and ``request_id`` it was answered with (the
        ``Request-Id`` as the fake made it, before any :meth:`poison`)."""
        with self._lock:
            return [dict(a) for a in self._adjustments]

    # -- GET /v1/billing/meters -------------------------------------------------------------
    def _serve_meter_list(self, query: str) -> Response:
        q = parse_qs(query)
        limit = min(int(_one(q, "limit") or 10), 100, self.page_cap)
        after = _one(q, "starting_after")
        with self._lock:
            meters = sorted(self._meters.values(), key=lambda m: m.created)
        if after is not None:
            ids = [m.id for m in meters]
            if after not in ids:
                return invalid(f"No such meter: '{after}'", param="starting_after",
                               code="resource_missing")
            meters = meters[ids.index(after) + 1:]
        page = meters[:limit]
        return ok({"object": "list", "url": "/v1/billing/meters",
                   "has_more": len(meters) > limit, "data": [self._meter_json(m) for m in page]})

    @staticmethod
    def _meter_json(m: FakeMeter) -> dict[str, Any]:
        return {"id": m.id, "object": "billing.meter", "event_name": m.event_name,
                "display_name": m.display_name, "status": m.status,
                "customer_mapping": {"event_payload_key": m.customer_key,
                                     "type": "by_id"},
                "value_settings": {"event_payload_key": m.value_key},
                "default_aggregation": {"formula": m.formula},
                "event_time_window": m.event_time_window, "livemode": False,
                "created": m.created,
                "updated": m.created, "status_transitions": {"deactivated_at": None}}

    # -- GET /v1/billing/meters/{id}/event_summaries --------------------------------------
    def _serve_summaries(self, meter_id: str, query: str) -> Response:
        q = parse_qs(query)
        with self._lock:
            self.summary_calls += 1
            meter = next((m for m in self._meters.values() if m.id == meter_id), None)
        if meter is None:
            return invalid(f"No such meter: '{meter_id}'", code="resource_missing")
        customer = _one(q, "customer")
        if not customer:
            return invalid("Missing required param: customer.", param="customer",
                           code="parameter_missing")
        try:
            start, end = int(_one(q, "start_time") or ""), int(_one(q, "end_time") or "")
        except ValueError:
            return invalid("start_time and end_time are required integers.",
                           param="start_time", code="parameter_missing")
        grouping = _one(q, "value_grouping_window")
        step = {"day": DAY, "hour": HOUR, None: end - start}.get(grouping)
        if step is None or step <= 0:
            return invalid("Invalid value_grouping_window.", param="value_grouping_window")
        if start % 60 or end % 60 or start % step or (end % step and grouping):
            return invalid(f"start_time and end_time must align with the {grouping or 'minute'} "
                           "boundaries.", param="start_time")
        values = self._aggregate(meter, customer, start, end, step)
        items = [{"id": f"mes_{meter.id}_{customer}_{s}", "object":
                  "billing.meter_event_summary", "aggregated_value": v, "start_time": s,
                  "end_time": min(s + step, end), "meter": meter.id, "livemode": False}
                 for s, v in sorted(values.items())]
        limit = min(int(_one(q, "limit") or 10), 100, self.page_cap)
        after = _one(q, "starting_after")
        if after is not None:
            ids = [i["id"] for i in items]
            items = items[ids.index(after) + 1:] if after in ids else []
        url = f"/v1/billing/meters/{meter.id}/event_summaries"
        return ok({"object": "list", "url": url, "has_more": len(items) > limit,
                   "data": items[:limit]})

    def _aggregate(self, meter: FakeMeter, customer: str, start: int, end: int,
                   step: int) -> dict[int, float]:
        """The meter's aggregation of the customer's valid, uncancelled events (and added
        usage) per bucket; buckets with nothing are left out."""
        cutoff = self._clock() - self.summary_delay
        points: list[tuple[int, float]] = []
        with self._lock:
            entries = list(self._by_pair.get((meter.event_name, customer), ()))
        for e in entries:
            if not start <= e.timestamp < end:
                continue
            if isinstance(e, Usage):
                points.append((e.timestamp, e.value))
            elif e.valid and not e.cancelled and not e.lost and e.received_at <= cutoff:
                points.append((e.timestamp, float(e.value)))
        buckets: dict[int, list[tuple[int, float]]] = defaultdict(list)
        for ts, value in points:
            buckets[start + (ts - start) // step * step].append((ts, value))
        if meter.formula == "count":
            return {b: float(len(p)) for b, p in buckets.items()}
        if meter.formula == "last":
            return {b: max(p)[1] for b, p in buckets.items()}
        return {b: float(sum(v for _, v in p)) for b, p in buckets.items()}

    # -- POST /v1/billing/meter_event_adjustments -------------------------------------------
    def _serve_adjustment(self, raw: bytes, req_id: str) -> Response:
        params = dict(parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True))
        event_name = params.get("event_name")
        identifier = params.get("cancel[identifier]")
        if params.get("type", "cancel") != "cancel":
            return invalid("Only type=cancel is supported.", param="type")
        if not event_name or not identifier:
            return invalid("Missing required param: cancel[identifier].",
                           param="cancel[identifier]", code="parameter_missing")
        now = self._clock()
        with self._lock:
            ev = self._accepted.get(identifier)
            if ev is None or ev.event_name != event_name:
                return invalid(f"No meter event with identifier '{identifier}' was found for "
                               f"event_name '{event_name}'.", param="cancel[identifier]",
                               code="resource_missing")
            if now - ev.received_at > CANCEL_WINDOW_SECONDS:
                return invalid("A meter event can only be cancelled within 24 hours of "
                               "being received.", param="cancel[identifier]")
            ev.cancelled = True
            status, ids = self._adjustment_answer
            adjustment_id = (ids if isinstance(ids, str)
                             else f"mea_{secrets.token_hex(12)}" if ids else None)
            self._adjustments.append({"identifier": identifier, "event_name": event_name,
                                      "status": status, "id": adjustment_id,
                                      "request_id": req_id})
        body: dict[str, Any] = {"object": "billing.meter_event_adjustment",
                                "event_name": event_name, "type": "cancel", "status": status,
                                "livemode": False, "cancel": {"identifier": identifier}}
        if adjustment_id is not None:
            body = {"id": adjustment_id, **body}
        return ok(body)
