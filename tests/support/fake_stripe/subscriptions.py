"""Subscriptions with metered items, their billing periods, and the invoices Stripe drafts at a
period's end and finalizes after a grace period, as Stripe serves them (API 2025-03-31 and
later; the field names are those of the SDK's generated classes: ``stripe._subscription``,
``_subscription_item``, ``_price``, ``_invoice``, ``_invoice_line_item``).

* A metered item's price is recurring, ``usage_type = "metered"``, and names its meter
  (``price.recurring.meter``: the ``mtr_…`` id of the meter of an event name); a licensed item
  (``usage_type = "licensed"``, no meter, ``quantity`` 1) is charged in advance and a reader
  must skip it. The billing period is the item's (``current_period_start`` /
  ``current_period_end``, Unix seconds; the subscription has none since 2025-03-31): calendar
  months in UTC from the subscription's start (a 31st anchor bills to the 30th, the 28th…,
  as Stripe's billing cycle anchor does), or a fixed number of seconds.
* ``GET /v1/subscriptions``: ``status`` (unset: every status but ``canceled``; ``all``; ``ended``;
  else that status), ``customer``, ``limit`` (1–100, default 10, a bad one is a 400),
  ``starting_after`` (an unknown id is a 400 ``resource_missing``), newest first as Stripe
  lists them (by ``created``, then the latest made first), each with its ``items`` embedded
  with their prices; ``GET /v1/subscriptions/{id}``; ``GET /v1/subscription_items``
  (``subscription`` required). A page from ``starting_after`` costs the page, not the list.
* At an item's ``current_period_end`` Stripe drafts one invoice per subscription for the ended
  period (``created`` = the period's end, ``period_start``/``period_end`` the ended period) and
  the items' period moves to the next one (several periods passed: one invoice each). The
  draft's ``automatically_finalizes_at`` is the end plus the grace period (Stripe allows 1 to
  72 hours; ``grace_seconds``, 3600 unless set on the fake or the subscription; not checked
  against Stripe's range here, so that a fake on the real clock can use seconds).
* One line per metered item (``parent.subscription_item_details.subscription_item``, ``period``
  = the ended period, ``quantity``, ``amount`` = quantity × ``unit_amount``, 1 here). While the
  invoice is a draft its quantity is the units Stripe has accepted so far for the customer on
  the item's meter with a timestamp in ``[period start, period end)``: usage sent during the
  grace period counts. At finalization it is frozen at the units received at or before the
  finalization time; events accepted later (Stripe takes events up to 35 days old, and its
  meter event summaries count them) are on no invoice. The units are those the summaries
  count: valid, not cancelled, not lost events, and :meth:`FakeStripe.add_usage` (received
  when it was added), aggregated by the meter's formula; ``summary_delay`` does not apply. A
  licensed item's line is for the next period (in advance), quantity 1.
* Finalization at ``automatically_finalizes_at`` (or early, :meth:`finalize_invoice`, as a
  person does in the dashboard): ``status`` ``open``, ``status_transitions.finalized_at`` that
  moment, ``automatically_finalizes_at`` null, a ``number``. :meth:`pay_invoice` and
  :meth:`void_invoice` move an open invoice on (``paid_at`` / ``voided_at``).
* ``GET /v1/invoices``: ``customer``, ``subscription``, ``status`` (draft, open, paid,
  uncollectible, void), ``created`` or ``created[gte|gt|lte|lt]``, ``limit``,
  ``starting_after``; newest first (by ``created``, ties by id, the later first);
  ``GET /v1/invoices/{id}`` (its first 10 lines embedded, ``has_more``, ``total_count``; 404
  ``resource_missing`` for an unknown id); ``GET /v1/invoices/{id}/lines``.
* Events: ``v1.invoice.created`` when a draft is made, ``v1.invoice.finalized`` when it is
  finalized, thin v2 events (``related_object`` the invoice, ``created`` the moment it
  happened, not when the fake noticed), listed at ``GET /v2/core/events`` and pushed to the
  event destination as the error reports are.

Time is the fake's clock. Periods roll and drafts finalize lazily: :meth:`tick` does what is
due up to now (in time order), and every request the fake serves calls it first (O(1) when
nothing is due), so an event accepted after a finalization moment is never counted on it.
Each subscriptions/invoices GET sleeps ``set_list_latency`` seconds before answering.

Test-facing API: :meth:`create_subscription` (``customer``, ``meters`` (event names),
``period_start``, ``period_seconds`` (None: calendar months, interval ``month``; else fixed
seconds, interval ``day`` for 86400, else ``month``: only descriptive), ``grace_seconds``,
``licensed`` (a licensed item too), ``status``), :meth:`create_subscriptions` (many customers
at once), :meth:`cancel_subscription`, :meth:`tick`, :meth:`finalize_invoice`,
:meth:`pay_invoice`, :meth:`void_invoice`, :meth:`invoices`, :meth:`invoice`,
:meth:`line_units`, :meth:`subscriptions`, :meth:`set_list_latency`; the counters
``subscription_list_calls``, ``invoice_list_calls``, ``invoice_retrieve_calls`` and
``invoice_line_calls`` (a subscription's retrieval and its items' list count in none). From
another process: ``POST /_fake/subscriptions`` (``customer`` or ``customers``, ``meters``,
``period_start``, ``period_seconds``, ``grace_seconds``, ``licensed``, ``status``; answers
``{"id"}`` or ``{"ids"}``), ``POST /_fake/tick``,
``/_fake/finalize_invoice``, ``/_fake/pay_invoice``, ``/_fake/void_invoice``,
``/_fake/cancel_subscription`` (``{"id"}``), ``/_fake/list_latency`` (``{"seconds"}``),
``GET /_fake/invoices`` and ``GET /_fake/subscriptions``.

Where Stripe documents nothing, the fake chooses: no invoice when a subscription is created
(Stripe's ``subscription_create`` invoice, which would carry the first licensed charge) nor
when it is cancelled (``invoice_now`` defaults to false); a subscription stops rolling only
when ``canceled`` or ``incomplete_expired``; an event received at the very moment of a
finalization, after it was processed, is not on the invoice; quantities are rounded to whole
units; no events for payment or voiding.
"""

from __future__ import annotations

import calendar
import functools
import heapq
import math
import re
import secrets
import threading
import time
from bisect import bisect_left, insort
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs

from .billing import Usage
from .http import Response, error, invalid, ok
from .meter_events import FakeMeter
from .reports import _rfc3339

SUBSCRIPTION_STATUSES = ("active", "past_due", "unpaid", "canceled", "incomplete",
                         "incomplete_expired", "trialing", "paused")
INVOICE_STATUSES = ("draft", "open", "paid", "uncollectible", "void")
DEFAULT_GRACE_SECONDS = 3600
#: How many lines an invoice embeds (the rest from ``GET /v1/invoices/{id}/lines``).
EMBEDDED_LINES = 10
INVOICE_CREATED = "v1.invoice.created"
INVOICE_FINALIZED = "v1.invoice.finalized"
#: Statuses in which a subscription has no more periods.
_ENDED = frozenset({"canceled", "incomplete_expired"})
_INT_RE = re.compile(r"-?[0-9]+")

Key = tuple[int, int, str]


def _add_months(ts: int, months: int) -> int:
    """``ts`` plus whole calendar months in UTC, the day clamped to the month's last."""
    when = datetime.fromtimestamp(ts, UTC)
    index = when.month - 1 + months
    year, month = when.year + index // 12, index % 12 + 1
    day = min(when.day, calendar.monthrange(year, month)[1])
    return int(when.replace(year=year, month=month, day=day).timestamp())


@functools.lru_cache(maxsize=4096)
def period_bounds(anchor: int, seconds: int | None, index: int) -> tuple[int, int]:
    """The ``index``-th billing period (0: the first) from ``anchor``: calendar months when
    ``seconds`` is None, else fixed ``seconds``."""
    if seconds is not None:
        return anchor + index * seconds, anchor + (index + 1) * seconds
    return _add_months(anchor, index), _add_months(anchor, index + 1)


_rfc3339_cached = functools.lru_cache(maxsize=1024)(_rfc3339)


@dataclass(slots=True)
class FakePrice:
    """A recurring price, shared by the items that use it: metered on ``event_name``'s meter,
    or licensed (``event_name`` None)."""

    id: str
    product: str
    created: int
    event_name: str | None
    meter: str | None
    interval: str
    unit_amount: int = 1

    def json(self) -> dict[str, Any]:
        return {"id": self.id, "object": "price", "active": True, "currency": "usd",
                "type": "recurring", "billing_scheme": "per_unit",
                "unit_amount": self.unit_amount, "unit_amount_decimal": str(self.unit_amount),
                "product": self.product, "created": self.created, "livemode": False,
                "metadata": {}, "nickname": None, "lookup_key": None,
                "recurring": {"interval": self.interval, "interval_count": 1,
                              "meter": self.meter,
                              "usage_type": "licensed" if self.event_name is None
                              else "metered",
                              "trial_period_days": None}}


@dataclass(slots=True)
class FakeItem:
    id: str
    created: int
    price: FakePrice


@dataclass(slots=True)
class FakeSubscription:
    id: str
    seq: int
    customer: str
    status: str
    created: int
    anchor: int
    period_seconds: int | None
    grace_seconds: int
    items: list[FakeItem]
    #: The current period's index (see :func:`period_bounds`).
    period: int = 0
    canceled_at: int | None = None

    @property
    def bounds(self) -> tuple[int, int]:
        return period_bounds(self.anchor, self.period_seconds, self.period)

    @property
    def key(self) -> Key:
        return (self.created, self.seq, self.id)


@dataclass(slots=True)
class FakeLine:
    id: str
    item: str
    price: FakePrice
    start: int
    end: int
    #: A metered line's quantity once its invoice was finalized (None: counted live).
    frozen: int | None = None


@dataclass(slots=True)
class FakeInvoice:
    id: str
    seq: int
    customer: str
    subscription: str
    created: int
    period_start: int
    period_end: int
    collection_method: str
    lines: list[FakeLine]
    finalizes_at: int | None
    status: str = "draft"
    number: str | None = None
    finalized_at: int | None = None
    paid_at: int | None = None
    voided_at: int | None = None

    @property
    def key(self) -> Key:
        return (self.created, self.seq, self.id)


def _one(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[0] if values else None


def _insert(keys: list[Key], key: Key) -> None:
    """Keep ``keys`` sorted; appending is the usual case."""
    if not keys or key >= keys[-1]:
        keys.append(key)
    else:
        insort(keys, key)


def _newest_first(keys: list[Key], before: Key | None = None) -> Iterator[str]:
    """The ids of ``keys`` (sorted oldest first) from the newest, starting below ``before``."""
    i = len(keys) if before is None else bisect_left(keys, before)
    while i > 0:
        i -= 1
        yield keys[i][2]


class SubscriptionsMixin:
    """Subscriptions and invoices of :class:`FakeStripe` (which holds the lock)."""

    _lock: threading.Lock
    _clock: Callable[[], float]
    _meters: dict[str, FakeMeter]
    _by_pair: defaultdict[tuple[str, str], list[Any]]
    page_cap: int
    _initial_grace_seconds: int
    #: The grace period of subscriptions created from now on that name none (seconds).
    grace_seconds: int
    subscription_list_calls: int
    invoice_list_calls: int
    invoice_retrieve_calls: int
    invoice_line_calls: int
    _list_latency: float
    _subs: dict[str, FakeSubscription]
    _sub_keys: list[Key]
    _subs_of_customer: defaultdict[str, list[str]]
    _prices: dict[tuple[str | None, str | None, str], FakePrice]
    _invoices: dict[str, FakeInvoice]
    _invoice_keys: list[Key]
    _invoices_of_customer: defaultdict[str, list[str]]
    _invoices_of_sub: defaultdict[str, list[str]]
    #: (due time, sequence, ``period`` or ``finalize``, id): what :meth:`tick` does next.
    _due: list[tuple[float, int, str, str]]
    _next_due: float
    _ids: dict[str, int]
    _record_events_locked: Callable[[Iterable[dict[str, Any]]], tuple[str, str] | None]
    _push_later: Callable[[list[dict[str, Any]], tuple[str, str] | None], None]

    def _subscriptions_init(self) -> None:
        """The state as constructed (also what :meth:`FakeStripe.reset` returns to)."""
        self.grace_seconds = self._initial_grace_seconds
        self.subscription_list_calls = 0
        self.invoice_list_calls = 0
        self.invoice_retrieve_calls = 0
        self.invoice_line_calls = 0
        self._list_latency = 0.0
        self._embedded_items: int | None = None
        self._subs = {}
        self._sub_keys = []
        self._subs_of_customer = defaultdict(list)
        self._prices = {}
        self._invoices = {}
        self._invoice_keys = []
        self._invoices_of_customer = defaultdict(list)
        self._invoices_of_sub = defaultdict(list)
        self._due = []
        self._next_due = math.inf
        self._ids = defaultdict(int)

    def _new_id(self, prefix: str) -> str:
        self._ids[prefix] += 1
        return f"{prefix}_fake{self._ids[prefix]:08d}"

    def _schedule_locked(self, due: int, kind: str, object_id: str) -> None:
        self._ids["_due"] += 1
        heapq.heappush(self._due, (due, self._ids["_due"], kind, object_id))
        self._next_due = self._due[0][0]

    # -- configuration ----------------------------------------------------------------------
    def set_embedded_items(self, count: int | None) -> None:
        """Embed at most ``count`` items in a subscription (``has_more`` says the rest are at
        ``GET /v1/subscription_items``); None, every item (the default). Stripe documents no
        cap; a reader must follow ``has_more`` either way."""
        with self._lock:
            self._embedded_items = count

    def set_list_latency(self, seconds: float) -> None:
        """Every subscriptions/invoices GET sleeps this long before it is answered."""
        if seconds < 0:
            raise ValueError("latency must be >= 0")
        with self._lock:
            self._list_latency = float(seconds)

    def create_subscription(self, customer: str, meters: Iterable[str] = ("api_requests",), *,
                            period_start: int, period_seconds: int | None = None,
                            grace_seconds: int | None = None, licensed: bool = False,
                            status: str = "active") -> str:
        """A subscription of ``customer`` with one metered item per event name of ``meters``
        (their meters must exist), and a licensed item too with ``licensed``; its first period
        starts at ``period_start``. Its id (``sub_fake…``)."""
        return self.create_subscriptions([customer], meters, period_start=period_start,
                                         period_seconds=period_seconds,
                                         grace_seconds=grace_seconds, licensed=licensed,
                                         status=status)[0]

    def create_subscriptions(self, customers: Iterable[str],
                             meters: Iterable[str] = ("api_requests",), *, period_start: int,
                             period_seconds: int | None = None,
                             grace_seconds: int | None = None, licensed: bool = False,
                             status: str = "active") -> list[str]:
        """One subscription per customer, as :meth:`create_subscription` makes it (sharing
        their prices, as Stripe's subscriptions of one plan do). Their ids, in order."""
        names = tuple(meters)
        if period_seconds is not None and int(period_seconds) <= 0:
            raise ValueError("period_seconds must be > 0")
        if grace_seconds is not None and int(grace_seconds) < 0:
            raise ValueError("grace_seconds must be >= 0")
        if status not in SUBSCRIPTION_STATUSES:
            raise ValueError(f"status must be one of {', '.join(SUBSCRIPTION_STATUSES)}")
        if not names and not licensed:
            raise ValueError("a subscription needs an item: meters, or licensed=True")
        seconds = None if period_seconds is None else int(period_seconds)
        interval = "day" if seconds == 86400 else "month"
        now = int(self._clock())
        with self._lock:
            missing = [n for n in names if n not in self._meters]
            if missing:
                raise ValueError(f"no meter for event_name {missing[0]!r}")
            prices = [self._price_locked(n, self._meters[n].id, interval, now) for n in names]
            if licensed:
                prices.append(self._price_locked(None, None, interval, now))
            grace = self.grace_seconds if grace_seconds is None else int(grace_seconds)
            ids = []
            for customer in customers:
                self._ids["_sub"] += 1
                sub = FakeSubscription(
                    id=self._new_id("sub"), seq=self._ids["_sub"], customer=str(customer),
                    status=status, created=now, anchor=int(period_start),
                    period_seconds=seconds, grace_seconds=grace,
                    items=[FakeItem(self._new_id("si"), now, p) for p in prices],
                    canceled_at=now if status in _ENDED else None)
                self._subs[sub.id] = sub
                _insert(self._sub_keys, sub.key)
                self._subs_of_customer[sub.customer].append(sub.id)
                if status not in _ENDED:
                    self._schedule_locked(sub.bounds[1], "period", sub.id)
                ids.append(sub.id)
            return ids

    def _price_locked(self, event_name: str | None, meter: str | None, interval: str,
                      now: int) -> FakePrice:
        key = (event_name, meter, interval)
        price = self._prices.get(key)
        if price is None:
            price = FakePrice(id=self._new_id("price"), product=self._new_id("prod"),
                              created=now, event_name=event_name, meter=meter,
                              interval=interval)
            self._prices[key] = price
        return price

    def cancel_subscription(self, subscription_id: str) -> None:
        """Cancel now (``canceled``, no more periods; the periods that ended before now were
        invoiced first)."""
        self.tick()
        now = int(self._clock())
        with self._lock:
            sub = self._subs[subscription_id]
            if sub.status not in _ENDED:
                sub.status, sub.canceled_at = "canceled", now

    # -- time -------------------------------------------------------------------------------
    def tick(self) -> dict[str, int]:
        """Do what is due up to now, in time order: draft the invoices of the periods that
        ended (the items' period moves on) and finalize the drafts whose grace period is
        over. How many of each."""
        now = self._clock()
        if now < self._next_due:
            return {"drafted": 0, "finalized": 0}
        events: list[dict[str, Any]] = []
        drafted = finalized = 0
        with self._lock:
            while self._due and self._due[0][0] <= now:
                due, _, kind, object_id = heapq.heappop(self._due)
                if kind == "period":
                    sub = self._subs.get(object_id)
                    if sub is None or sub.status in _ENDED or sub.bounds[1] != due:
                        continue
                    events.append(self._draft_locked(sub))
                    drafted += 1
                else:
                    invoice = self._invoices.get(object_id)
                    if (invoice is None or invoice.status != "draft"
                            or invoice.finalizes_at != due):
                        continue
                    events.append(self._finalize_locked(invoice, int(due)))
                    finalized += 1
            self._next_due = self._due[0][0] if self._due else math.inf
            destination = self._record_events_locked(events)
        self._push_later(events, destination)
        return {"drafted": drafted, "finalized": finalized}

    def _draft_locked(self, sub: FakeSubscription) -> dict[str, Any]:
        """The invoice of ``sub``'s current period, which has just ended; the period moves
        on. The ``v1.invoice.created`` event (not yet recorded)."""
        start, end = sub.bounds
        following = period_bounds(sub.anchor, sub.period_seconds, sub.period + 1)[1]
        lines = [FakeLine(id=self._new_id("il"), item=item.id, price=item.price,
                          start=start if item.price.event_name is not None else end,
                          end=end if item.price.event_name is not None else following)
                 for item in sub.items]
        self._ids["_invoice"] += 1
        invoice = FakeInvoice(id=self._new_id("in"), seq=self._ids["_invoice"],
                              customer=sub.customer, subscription=sub.id, created=end,
                              period_start=start, period_end=end,
                              collection_method="charge_automatically", lines=lines,
                              finalizes_at=end + sub.grace_seconds)
        self._invoices[invoice.id] = invoice
        _insert(self._invoice_keys, invoice.key)
        self._invoices_of_customer[invoice.customer].append(invoice.id)
        self._invoices_of_sub[sub.id].append(invoice.id)
        self._schedule_locked(end + sub.grace_seconds, "finalize", invoice.id)
        sub.period += 1
        self._schedule_locked(following, "period", sub.id)
        return self._invoice_event(INVOICE_CREATED, invoice.id, end)

    def _finalize_locked(self, invoice: FakeInvoice, at: int) -> dict[str, Any]:
        """Finalize the draft at ``at``: its metered quantities frozen at what was received by
        then. The ``v1.invoice.finalized`` event (not yet recorded)."""
        invoice.status, invoice.finalized_at, invoice.finalizes_at = "open", at, None
        invoice.number = f"FAKE-{invoice.seq:06d}"
        for line in invoice.lines:
            if line.price.event_name is not None:
                line.frozen = self._units_locked(line.price.event_name, invoice.customer,
                                                 line.start, line.end, received_by=at)
        return self._invoice_event(INVOICE_FINALIZED, invoice.id, at)

    @staticmethod
    def _invoice_event(type_: str, invoice_id: str, at: int) -> dict[str, Any]:
        return {"id": "evt_" + secrets.token_hex(12), "object": "v2.core.event",
                "type": type_, "created": _rfc3339_cached(at), "livemode": False,
                "context": None,
                "related_object": {"id": invoice_id, "type": "invoice",
                                   "url": f"/v1/invoices/{invoice_id}"},
                "data": {}}

    def _units_locked(self, event_name: str, customer: str, start: int, end: int, *,
                      received_by: float | None = None) -> int:
        """What the summaries count for the customer on the meter over ``[start, end)``
        (received at or before ``received_by``, when given), aggregated by the meter's
        formula, in whole units."""
        meter = self._meters.get(event_name)
        points: list[tuple[int, float]] = []
        for e in self._by_pair.get((event_name, customer), ()):
            if not start <= e.timestamp < end:
                continue
            if isinstance(e, Usage):
                if (received_by is None or e.received_at is None
                        or e.received_at <= received_by):
                    points.append((e.timestamp, e.value))
            elif (e.valid and not e.cancelled and not e.lost
                  and (received_by is None or e.received_at <= received_by)):
                points.append((e.timestamp, float(e.value)))
        if not points:
            return 0
        formula = meter.formula if meter is not None else "sum"
        if formula == "count":
            return len(points)
        if formula == "last":
            return round(max(points)[1])
        return round(sum(v for _, v in points))

    # -- invoices, by hand ------------------------------------------------------------------
    def finalize_invoice(self, invoice_id: str) -> dict[str, Any]:
        """Finalize a draft now, before its ``automatically_finalizes_at`` (as a person does in
        the dashboard). The invoice, as served. ValueError when it is no longer a draft."""
        self.tick()
        now = int(self._clock())
        with self._lock:
            invoice = self._invoices[invoice_id]
            if invoice.status != "draft":
                raise ValueError(f"invoice {invoice_id} is already finalized")
            events = [self._finalize_locked(invoice, now)]
            destination = self._record_events_locked(events)
            answer = self._invoice_json_locked(invoice)
        self._push_later(events, destination)
        return answer

    def pay_invoice(self, invoice_id: str) -> dict[str, Any]:
        """An open invoice is paid now (``paid``, ``status_transitions.paid_at``)."""
        return self._settle(invoice_id, "paid")

    def void_invoice(self, invoice_id: str) -> dict[str, Any]:
        """An open invoice is voided now (``void``, ``status_transitions.voided_at``)."""
        return self._settle(invoice_id, "void")

    def _settle(self, invoice_id: str, status: str) -> dict[str, Any]:
        self.tick()
        now = int(self._clock())
        with self._lock:
            invoice = self._invoices[invoice_id]
            if invoice.status != "open":
                raise ValueError(f"invoice {invoice_id} is {invoice.status}, not open")
            invoice.status = status
            if status == "paid":
                invoice.paid_at = now
            else:
                invoice.voided_at = now
            return self._invoice_json_locked(invoice)

    # -- observation ------------------------------------------------------------------------
    def subscriptions(self) -> list[dict[str, Any]]:
        """Every subscription as served (any status), newest first."""
        self.tick()
        with self._lock:
            return [self._subscription_json(self._subs[i]) for i in _newest_first(self._sub_keys)]

    def invoices(self, customer: str | None = None) -> list[dict[str, Any]]:
        """Every invoice (of ``customer``) as served, newest first."""
        self.tick()
        with self._lock:
            keys = (self._invoice_keys if customer is None else
                    sorted(self._invoices[i].key for i in self._invoices_of_customer.get(
                        customer, ())))
            return [self._invoice_json_locked(self._invoices[i]) for i in _newest_first(keys)]

    def invoice(self, invoice_id: str) -> dict[str, Any]:
        """One invoice as served (KeyError for an unknown id)."""
        self.tick()
        with self._lock:
            return self._invoice_json_locked(self._invoices[invoice_id])

    def line_units(self, invoice_id: str) -> dict[str, int]:
        """Event name -> the quantity of the invoice's metered lines of its meter (every
        line, not only the embedded ones)."""
        self.tick()
        with self._lock:
            invoice = self._invoices[invoice_id]
            units: dict[str, int] = {}
            for line in invoice.lines:
                name = line.price.event_name
                if name is not None:
                    units[name] = units.get(name, 0) + self._quantity_locked(invoice, line)
            return units

    # -- answers ----------------------------------------------------------------------------
    def _subscription_json(self, sub: FakeSubscription) -> dict[str, Any]:
        items = [self._item_json(sub, item) for item in sub.items]
        cap = len(items) if self._embedded_items is None else self._embedded_items
        return {"id": sub.id, "object": "subscription", "customer": sub.customer,
                "status": sub.status, "created": sub.created, "livemode": False,
                "metadata": {}, "collection_method": "charge_automatically",
                "currency": "usd", "start_date": sub.anchor,
                "billing_cycle_anchor": sub.anchor, "cancel_at": None,
                "cancel_at_period_end": False, "canceled_at": sub.canceled_at,
                "ended_at": sub.canceled_at,
                "items": {"object": "list", "data": items[:cap],
                          "has_more": len(items) > cap,
                          "total_count": len(items),
                          "url": f"/v1/subscription_items?subscription={sub.id}"}}

    @staticmethod
    def _item_json(sub: FakeSubscription, item: FakeItem) -> dict[str, Any]:
        start, end = sub.bounds
        answer: dict[str, Any] = {
            "id": item.id, "object": "subscription_item", "subscription": sub.id,
            "created": item.created, "current_period_start": start,
            "current_period_end": end, "metadata": {}, "price": item.price.json(),
            "discounts": [], "tax_rates": []}
        if item.price.event_name is None:
            answer["quantity"] = 1
        return answer

    def _quantity_locked(self, invoice: FakeInvoice, line: FakeLine) -> int:
        if line.price.event_name is None:
            return 1
        if line.frozen is not None:
            return line.frozen
        return self._units_locked(line.price.event_name, invoice.customer, line.start,
                                  line.end)

    def _line_json_locked(self, invoice: FakeInvoice, line: FakeLine) -> dict[str, Any]:
        quantity = self._quantity_locked(invoice, line)
        amount = quantity * line.price.unit_amount
        return {
            "id": line.id, "object": "line_item", "invoice": invoice.id, "livemode": False,
            "metadata": {}, "currency": "usd", "description": None, "discountable": True,
            "discounts": [], "amount": amount, "subtotal": amount, "quantity": quantity,
            "period": {"start": line.start, "end": line.end},
            "parent": {"type": "subscription_item_details",
                       "subscription_item_details": {
                           "subscription_item": line.item,
                           "subscription": invoice.subscription, "invoice_item": None,
                           "proration": False, "proration_details": {"credited_items": None}},
                       "invoice_item_details": None},
            "pricing": {"type": "price_details",
                        "price_details": {"price": line.price.id,
                                          "product": line.price.product},
                        "unit_amount_decimal": str(line.price.unit_amount)}}

    def _invoice_json_locked(self, invoice: FakeInvoice) -> dict[str, Any]:
        lines = [self._line_json_locked(invoice, line) for line in invoice.lines]
        total = sum(line["amount"] for line in lines)
        paid = total if invoice.status == "paid" else 0
        return {
            "id": invoice.id, "object": "invoice", "customer": invoice.customer,
            "status": invoice.status, "created": invoice.created,
            "period_start": invoice.period_start, "period_end": invoice.period_end,
            "automatically_finalizes_at": invoice.finalizes_at, "auto_advance": True,
            "billing_reason": "subscription_cycle", "number": invoice.number,
            "status_transitions": {"finalized_at": invoice.finalized_at,
                                   "paid_at": invoice.paid_at,
                                   "voided_at": invoice.voided_at,
                                   "marked_uncollectible_at": None},
            "parent": {"type": "subscription_details",
                       "subscription_details": {"subscription": invoice.subscription,
                                                "metadata": {},
                                                "subscription_proration_date": None},
                       "quote_details": None},
            "currency": "usd", "collection_method": invoice.collection_method,
            "livemode": False, "metadata": {}, "total": total, "subtotal": total,
            "amount_due": total, "amount_paid": paid, "amount_remaining": total - paid,
            "lines": {"object": "list", "data": lines[:EMBEDDED_LINES],
                      "has_more": len(lines) > EMBEDDED_LINES, "total_count": len(lines),
                      "url": f"/v1/invoices/{invoice.id}/lines"}}

    # -- serving ----------------------------------------------------------------------------
    def _limit(self, q: dict[str, list[str]]) -> int | Response:
        raw = _one(q, "limit") or "10"
        if not raw.isdigit() or not 1 <= int(raw) <= 100:
            return invalid("This value must be between 1 and 100.", param="limit")
        return min(int(raw), self.page_cap)

    def _list_pause(self, counter: str | None) -> None:
        """Count a call on ``counter`` (if any), then sleep the list latency (without the
        lock)."""
        with self._lock:
            if counter is not None:
                setattr(self, counter, getattr(self, counter) + 1)
            latency = self._list_latency
        if latency:
            time.sleep(latency)

    @staticmethod
    def _page(ids: Iterable[str], match: Callable[[str], bool], limit: int
              ) -> tuple[list[str], bool]:
        """The first ``limit`` ids that match, and whether another one does."""
        found: list[str] = []
        for object_id in ids:
            if match(object_id):
                if len(found) == limit:
                    return found, True
                found.append(object_id)
        return found, False

    def _serve_subscription_list(self, query: str) -> Response:
        q = parse_qs(query)
        limit = self._limit(q)
        if isinstance(limit, Response):
            return limit
        status = _one(q, "status")
        if status is not None and status not in (*SUBSCRIPTION_STATUSES, "all", "ended"):
            return invalid(f"Invalid status: must be one of {', '.join(SUBSCRIPTION_STATUSES)}, "
                           "all or ended", param="status")
        customer, after = _one(q, "customer"), _one(q, "starting_after")
        self._list_pause("subscription_list_calls")
        with self._lock:
            before: Key | None = None
            if after is not None:
                if after not in self._subs:
                    return invalid(f"No such subscription: '{after}'", param="starting_after",
                                   code="resource_missing")
                before = self._subs[after].key
            keys = (self._sub_keys if customer is None else
                    sorted(self._subs[i].key for i in self._subs_of_customer.get(customer, ())))

            def match(sub_id: str) -> bool:
                found = self._subs[sub_id].status
                if status is None:
                    return found != "canceled"
                if status == "ended":
                    return found in _ENDED
                return status == "all" or found == status

            page, more = self._page(_newest_first(keys, before), match, limit)
            data = [self._subscription_json(self._subs[i]) for i in page]
        return ok({"object": "list", "url": "/v1/subscriptions", "has_more": more,
                   "data": data})

    def _serve_subscription(self, subscription_id: str) -> Response:
        self._list_pause(None)
        with self._lock:
            sub = self._subs.get(subscription_id)
            answer = None if sub is None else self._subscription_json(sub)
        if answer is None:
            return error(404, "invalid_request_error",
                         f"No such subscription: '{subscription_id}'",
                         code="resource_missing", param="id")
        return ok(answer)

    def _serve_subscription_items(self, query: str) -> Response:
        q = parse_qs(query)
        limit = self._limit(q)
        if isinstance(limit, Response):
            return limit
        sub_id, after = _one(q, "subscription"), _one(q, "starting_after")
        if not sub_id:
            return invalid("Missing required param: subscription.", param="subscription",
                           code="parameter_missing")
        self._list_pause(None)
        with self._lock:
            sub = self._subs.get(sub_id)
            if sub is None:
                return invalid(f"No such subscription: '{sub_id}'", param="subscription",
                               code="resource_missing")
            items = [self._item_json(sub, item) for item in sub.items]
        if after is not None:
            ids = [i["id"] for i in items]
            if after not in ids:
                return invalid(f"No such subscription item: '{after}'", param="starting_after",
                               code="resource_missing")
            items = items[ids.index(after) + 1:]
        return ok({"object": "list", "url": "/v1/subscription_items",
                   "has_more": len(items) > limit, "data": items[:limit]})

    def _serve_invoice_list(self, query: str) -> Response:
        q = parse_qs(query)
        limit = self._limit(q)
        if isinstance(limit, Response):
            return limit
        status = _one(q, "status")
        if status is not None and status not in INVOICE_STATUSES:
            return invalid(f"Invalid status: must be one of {', '.join(INVOICE_STATUSES)}",
                           param="status")
        low, high = -math.inf, math.inf
        for param in ("created", "created[gte]", "created[gt]", "created[lte]", "created[lt]"):
            raw = _one(q, param)
            if raw is None:
                continue
            if not _INT_RE.fullmatch(raw):
                return invalid(f"Invalid integer: {raw}", param=param,
                               code="parameter_invalid_integer")
            value = int(raw)
            if param in ("created", "created[gte]"):
                low = max(low, value)
            if param in ("created", "created[lte]"):
                high = min(high, value)
            if param == "created[gt]":
                low = max(low, value + 1)
            if param == "created[lt]":
                high = min(high, value - 1)
        customer, subscription = _one(q, "customer"), _one(q, "subscription")
        after = _one(q, "starting_after")
        self._list_pause("invoice_list_calls")
        with self._lock:
            before: Key | None = None
            if after is not None:
                if after not in self._invoices:
                    return invalid(f"No such invoice: '{after}'", param="starting_after",
                                   code="resource_missing")
                before = self._invoices[after].key
            if subscription is not None:
                keys = sorted(self._invoices[i].key
                              for i in self._invoices_of_sub.get(subscription, ()))
            elif customer is not None:
                keys = sorted(self._invoices[i].key
                              for i in self._invoices_of_customer.get(customer, ()))
            else:
                keys = self._invoice_keys
            if high != math.inf:
                # Skip what is newer than ``high`` without reading it.
                bound: Key = (int(high) + 1, -1, "")
                before = bound if before is None else min(before, bound)

            def newest() -> Iterator[str]:
                for invoice_id in _newest_first(keys, before):
                    if self._invoices[invoice_id].created < low:
                        return  # newest first: the rest are older still
                    yield invoice_id

            def match(invoice_id: str) -> bool:
                found = self._invoices[invoice_id]
                return ((customer is None or found.customer == customer)
                        and (status is None or found.status == status))

            page, more = self._page(newest(), match, limit)
            data = [self._invoice_json_locked(self._invoices[i]) for i in page]
        return ok({"object": "list", "url": "/v1/invoices", "has_more": more, "data": data})

    def _missing_invoice(self, invoice_id: str) -> Response:
        return error(404, "invalid_request_error", f"No such invoice: '{invoice_id}'",
                     code="resource_missing", param="id")

    def _serve_invoice(self, invoice_id: str) -> Response:
        self._list_pause("invoice_retrieve_calls")
        with self._lock:
            invoice = self._invoices.get(invoice_id)
            answer = None if invoice is None else self._invoice_json_locked(invoice)
        return self._missing_invoice(invoice_id) if answer is None else ok(answer)

    def _serve_invoice_lines(self, invoice_id: str, query: str) -> Response:
        q = parse_qs(query)
        limit = self._limit(q)
        if isinstance(limit, Response):
            return limit
        after = _one(q, "starting_after")
        self._list_pause("invoice_line_calls")
        with self._lock:
            invoice = self._invoices.get(invoice_id)
            if invoice is None:
                return self._missing_invoice(invoice_id)
            ids = [line.id for line in invoice.lines]
            start = 0
            if after is not None:
                if after not in ids:
                    return invalid(f"No such line item: '{after}'", param="starting_after",
                                   code="resource_missing")
                start = ids.index(after) + 1
            chosen = invoice.lines[start:start + limit]
            data = [self._line_json_locked(invoice, line) for line in chosen]
            more = start + limit < len(ids)
        return ok({"object": "list", "url": f"/v1/invoices/{invoice_id}/lines",
                   "has_more": more, "data": data})
