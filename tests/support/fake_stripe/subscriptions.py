"""Subscriptions with metered items, their billing periods, trials, pauses and cancellations,
and the invoices Stripe makes of them (a first invoice at creation, a draft at each period's
end finalized after a grace period, a final one at a cancellation), as Stripe serves them (API
2026-10-28; every field named as in stripe-python 16.1.0's generated classes, which are named
below for each field: ``stripe._subscription.Subscription``, ``_subscription_item``,
``_price.Price``, ``_invoice.Invoice``, ``_invoice_line_item.InvoiceLineItem``).

Subscriptions and periods
-------------------------
* A metered item's price is recurring, ``usage_type = "metered"``, and names its meter
  (``Price.recurring.meter``: the ``mtr_…`` id of the meter of an event name); a licensed item
  (``usage_type = "licensed"``, no meter, ``quantity`` 1) is charged in advance and a reader
  must skip it. The billing period is the item's (``current_period_start`` /
  ``current_period_end``, Unix seconds; the subscription has none since 2025-03-31): calendar
  months in UTC from the billing cycle anchor (a 31st anchor bills to the 30th, the 28th…,
  as Stripe's billing cycle anchor does), or a fixed number of seconds.
* ``Subscription`` fields served: ``status``, ``start_date`` (the first period's start),
  ``billing_cycle_anchor`` (the start, the trial's end for a trial, the resumption's moment
  after a resume), ``trial_start`` / ``trial_end`` (null without a trial), ``canceled_at`` and
  ``ended_at`` (the cancellation's moment), ``status_details`` (``{"paused": {"type":
  "subscription", "transitioned_at", "subscription": {"type": "pause_requested"}}}`` while
  paused, else null), ``pause_collection`` (null: the fake pauses the subscription, not its
  collection), ``items``.
* ``GET /v1/subscriptions``: ``status`` (unset: every status but ``canceled``; ``all``; ``ended``;
  else that status), ``customer``, ``limit`` (1–100, default 10, a bad one is a 400),
  ``starting_after`` (an unknown id is a 400 ``resource_missing``), newest first as Stripe
  lists them (by ``created``, then the latest made first), each with its ``items`` embedded
  with their prices; ``GET /v1/subscriptions/{id}``; ``GET /v1/subscription_items``
  (``subscription`` required). A page from ``starting_after`` costs the page, not the list.
* A customer may have several subscriptions, several of them with an item on the same meter:
  each such item's invoice line counts every unit of the customer on that meter in its period
  (Stripe attributes meter events to the customer, not to a subscription), so the same events
  are on each of those invoices.

Invoices
--------
* At an item's ``current_period_end`` Stripe drafts one invoice per subscription for the ended
  period (``billing_reason`` ``subscription_cycle``, ``created`` = the period's end,
  ``period_start``/``period_end`` the ended period) and the items' period moves to the next
  one (several periods passed: one invoice each). The draft's ``automatically_finalizes_at``
  is the end plus the grace period (Stripe allows 1 to 72 hours; ``grace_seconds``, 3600
  unless set on the fake or the subscription; not checked against Stripe's range here, so that
  a fake on the real clock can use seconds).
* One line per item (``InvoiceLineItem``): ``parent.subscription_item_details.subscription_item``,
  ``period``, ``quantity_decimal`` (Stripe's exact quantity, a decimal string of at most 12
  decimal places: ``"1234"``, ``"12.5"``; the SDK hydrates it into a ``Decimal``),
  ``quantity`` (that quantity truncated to an integer, as Stripe documents it), ``amount`` =
  ``quantity_decimal`` × the price's ``unit_amount`` (1 here, minor units), rounded to the
  minor unit half up (Stripe documents no rounding mode: the fake's choice; whole quantities,
  the only kind a meter event carries, need none, so ``amount`` = ``quantity`` × unit amount).
  A metered line covers the ended period. While the invoice is a draft its quantity is the
  units Stripe has aggregated so far for the customer on the item's meter with a timestamp
  in ``[period start, period end)``: usage sent during the grace period counts. At
  finalization it is frozen at the units received at or before the finalization moment less
  the aggregation lag (below); events accepted later (Stripe takes events up to 35 days old,
  and its meter event summaries count them) are on no invoice. The units are those the
  summaries count: valid, not cancelled, not lost events, and :meth:`FakeStripe.add_usage`
  (received when it was added), aggregated by the meter's formula; ``summary_delay`` does not
  apply. A licensed item's line is for the next period (in advance), quantity 1.
* ``Invoice`` fields served beside those: ``billing_reason`` (``subscription_create``,
  ``subscription_cycle``), ``currency`` (``usd``), ``number``, ``status``,
  ``automatically_finalizes_at``, ``last_finalization_error`` (null unless a finalization
  failed), ``status_transitions`` (``finalized_at``, ``paid_at``, ``voided_at``,
  ``marked_uncollectible_at``), ``total``, ``amount_due``/``amount_paid``/``amount_remaining``,
  ``parent.subscription_details.subscription``, ``lines`` (the first 10).
* Aggregation lag (:meth:`set_aggregation_lag`, 0 unless set, back to 0 at reset): Stripe
  aggregates meter events asynchronously, so an event accepted moments before a finalization
  can miss the line. With a lag, a line counts only the units received at or before (the
  moment − lag): when it is frozen at finalization, and while it is a draft (so that a draft
  never shows units its finalized self drops). The meter event summaries are unaffected.
* Finalization at ``automatically_finalizes_at`` (or early, :meth:`finalize_invoice`, as a
  person does in the dashboard): ``status`` ``open``, ``status_transitions.finalized_at`` that
  moment, ``automatically_finalizes_at`` null, a ``number``. :meth:`pay_invoice`,
  :meth:`void_invoice` (from ``open`` or ``uncollectible``) and :meth:`mark_uncollectible`
  (from ``open``) move it on (``paid_at``, ``voided_at``, ``marked_uncollectible_at``), as
  Stripe's status transitions allow. :meth:`fail_finalization` makes Stripe's finalization
  attempt fail: the draft stays a draft, ``last_finalization_error`` is set and
  ``automatically_finalizes_at`` moves one hour later (Stripe retries); the failed attempt is
  taken to be now (Stripe attempts at ``automatically_finalizes_at``: a test wanting that
  moment sets the clock just before it). :meth:`delete_draft` deletes a draft (Stripe's
  ``DELETE /v1/invoices/{id}``): it is in no list and retrieving it is a 404.
* ``GET /v1/invoices``: ``customer``, ``subscription``, ``status`` (draft, open, paid,
  uncollectible, void), ``created`` or ``created[gte|gt|lte|lt]``, ``limit``,
  ``starting_after``; newest first (by ``created``, ties by id, the later first);
  ``GET /v1/invoices/{id}`` (its first 10 lines embedded, ``has_more``, ``total_count``; 404
  ``resource_missing`` for an unknown or deleted id); ``GET /v1/invoices/{id}/lines``.

Lifecycle
---------
* First invoice: Stripe always makes one when a subscription is created (``billing_reason``
  ``subscription_create``) and finalizes it at once; with metered items only it is $0 and so
  ``paid`` at once (``status_transitions.finalized_at`` and ``paid_at`` = the creation time).
  Its metered lines cover the first period (the trial, with a trial) with ``quantity`` 0,
  ``quantity_decimal`` ``"0"``, ``amount`` 0, frozen whatever usage arrives; a licensed line
  covers the same period, quantity 1 (amount 0 in a trial, else its unit amount, taken as
  paid). Its ``period_start`` = ``period_end`` = the subscription's start (the fake's choice).
  The fake makes it only with ``first_invoice=True`` or a trial, so that the tests written
  before it see the invoices they did; tests of what lands on which invoice set it. The
  period's own draft at its end still bills the first period's usage.
* Trials (``trial_seconds``): ``status`` ``trialing``, ``trial_start`` = the start,
  ``trial_end`` = the start + ``trial_seconds``, ``billing_cycle_anchor`` = ``trial_end``;
  the items' first period is the trial ``[start, trial_end)``. Usage in a trial is not
  billed: the first invoice's lines cover the trial period (the fake's choice: Stripe
  documents the $0 first invoice, not its lines' period) at 0, and at the trial's end no
  invoice carries the trial's metered usage. Then the subscription is ``active`` and its next
  period is ``[trial_end, trial_end + the period's length)`` (calendar months from
  ``trial_end``); a subscription with a licensed item gets a ``subscription_cycle`` draft at
  ``trial_end`` with the licensed lines alone (the next period, in advance); one without gets
  none. ``v1.customer.subscription.updated`` at ``trial_end``.
* Pause (:meth:`pause_subscription`, Stripe's pause endpoint, not ``pause_collection``):
  ``paused`` from now; Stripe's paused subscription neither advances to a new period nor
  generates invoices, so the period running when it paused is cut and never invoiced (the
  fake's reading: its usage is on no invoice), its items keep that period's bounds, and drafts
  made before the pause still finalize. Resume (:meth:`resume_subscription`, Stripe's default
  ``billing_cycle_anchor=now``): ``active``, a new period ``[now, now + its length)``, the
  anchor reset to now; the fake makes no invoice at the resumption (Stripe would make one
  for licensed items charged in advance).
* Cancel (:meth:`cancel_subscription`): ``canceled``, ``canceled_at`` = ``ended_at`` = now, no
  more periods, the periods that ended before now invoiced first. Without ``invoice_now``
  (Stripe's default) no final invoice: the running period's usage is on no invoice. With
  ``invoice_now`` a final invoice for ``[period start, now)`` (``billing_reason``
  ``subscription_cycle``, metered lines only: the fake adds no proration of licensed items)
  is made and finalized at once (``open``), its lines counted at that moment (less the lag);
  a paused subscription gets none (it invoices nothing), a trialing one gets its lines at 0.
* Events (thin v2 events, ``related_object`` the invoice, ``/v1/invoices/{id}``, or the
  subscription, ``/v1/subscriptions/{id}``; ``created`` the moment it happened, not when the
  fake noticed), listed at ``GET /v2/core/events`` and pushed to the event destination as
  the error reports are: ``v1.invoice.created`` (a draft, or an invoice finalized at once, is
  made), ``v1.invoice.finalized``, ``v1.invoice.paid``, ``v1.invoice.voided``,
  ``v1.invoice.marked_uncollectible``, ``v1.invoice.updated`` at every status change
  (finalized, paid, voided, marked uncollectible; one for an invoice made paid at once),
  ``v1.invoice.finalization_failed``, ``v1.invoice.deleted``,
  ``v1.customer.subscription.updated`` (trial end, pause, resume),
  ``v1.customer.subscription.paused``, ``v1.customer.subscription.resumed``,
  ``v1.customer.subscription.deleted`` (cancel). Stripe pushes a destination only the types
  it is enabled for: the fake's destination is enabled for every one of these but
  ``v1.invoice.updated`` (which would double every invoice event a destination set before it
  existed receives) unless :meth:`set_pushed_types` says otherwise; all are listed.

Time is the fake's clock. Periods roll, trials end and drafts finalize lazily: :meth:`tick`
does what is due up to now (in time order), and every request the fake serves calls it first
(O(1) when nothing is due), so an event accepted after a finalization moment is never counted
on it. Each subscriptions/invoices GET sleeps ``set_list_latency`` seconds before answering.

Test-facing API: :meth:`create_subscription` (``customer``, ``meters`` (event names),
``period_start``, ``period_seconds`` (None: calendar months, interval ``month``; else fixed
seconds, interval ``day`` for 86400, else ``month``: only descriptive), ``grace_seconds``,
``licensed`` (a licensed item too), ``status``, ``trial_seconds``, ``first_invoice``),
:meth:`create_subscriptions` (many customers at once), :meth:`pause_subscription`,
:meth:`resume_subscription`, :meth:`cancel_subscription` (``invoice_now``), :meth:`tick`,
:meth:`finalize_invoice`, :meth:`pay_invoice`, :meth:`void_invoice`,
:meth:`mark_uncollectible`, :meth:`fail_finalization`, :meth:`delete_draft`,
:meth:`set_aggregation_lag`, :meth:`set_pushed_types`, :meth:`invoices`, :meth:`invoice`,
:meth:`line_units`, :meth:`subscriptions`, :meth:`set_list_latency`; the counters
``subscription_list_calls``, ``invoice_list_calls``, ``invoice_retrieve_calls`` and
``invoice_line_calls`` (a subscription's retrieval and its items' list count in none). From
another process: ``POST /_fake/subscriptions`` (``customer`` or ``customers``, ``meters``,
``period_start``, ``period_seconds``, ``grace_seconds``, ``licensed``, ``status``,
``trial_seconds``, ``first_invoice``; answers ``{"id"}`` or ``{"ids"}``), ``POST /_fake/tick``,
``/_fake/finalize_invoice``, ``/_fake/pay_invoice``, ``/_fake/void_invoice``,
``/_fake/mark_uncollectible``, ``/_fake/fail_finalization`` (``{"id"}``; answer
``{"invoice"}``), ``/_fake/delete_draft`` (``{"id"}``; answers ``{"deleted"}``),
``/_fake/pause_subscription``, ``/_fake/resume_subscription`` (``{"id"}``; answer
``{"subscription"}``), ``/_fake/cancel_subscription`` (``{"id", "invoice_now"}``; answers
``{"ok", "invoice"}``, the final invoice or null), ``/_fake/aggregation_lag`` and
``/_fake/list_latency`` (``{"seconds"}``), ``/_fake/pushed_types`` (``{"types"}``, a list or
null), ``GET /_fake/invoices`` and ``GET /_fake/subscriptions``.

Where Stripe documents nothing, the fake chooses (beside the choices above): no invoice when a
subscription is created unless ``first_invoice`` or a trial; a subscription stops rolling when
``canceled``, ``incomplete_expired`` or ``paused`` (one created ``paused`` is paused from its
creation); an event received at the very moment of a finalization, after it was processed, is
not on the invoice; no ``v1.customer.subscription.created`` event.
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
from decimal import ROUND_HALF_UP, Decimal
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
#: How much later Stripe tries again to finalize a draft whose finalization failed.
FINALIZATION_RETRY_SECONDS = 3600
#: How many lines an invoice embeds (the rest from ``GET /v1/invoices/{id}/lines``).
EMBEDDED_LINES = 10
INVOICE_CREATED = "v1.invoice.created"
INVOICE_FINALIZED = "v1.invoice.finalized"
INVOICE_UPDATED = "v1.invoice.updated"
INVOICE_PAID = "v1.invoice.paid"
INVOICE_VOIDED = "v1.invoice.voided"
INVOICE_MARKED_UNCOLLECTIBLE = "v1.invoice.marked_uncollectible"
INVOICE_FINALIZATION_FAILED = "v1.invoice.finalization_failed"
INVOICE_DELETED = "v1.invoice.deleted"
SUBSCRIPTION_UPDATED = "v1.customer.subscription.updated"
SUBSCRIPTION_PAUSED = "v1.customer.subscription.paused"
SUBSCRIPTION_RESUMED = "v1.customer.subscription.resumed"
SUBSCRIPTION_DELETED = "v1.customer.subscription.deleted"
#: Every event type of this module.
LIFECYCLE_EVENT_TYPES = (INVOICE_CREATED, INVOICE_FINALIZED, INVOICE_UPDATED, INVOICE_PAID,
                         INVOICE_VOIDED, INVOICE_MARKED_UNCOLLECTIBLE,
                         INVOICE_FINALIZATION_FAILED, INVOICE_DELETED, SUBSCRIPTION_UPDATED,
                         SUBSCRIPTION_PAUSED, SUBSCRIPTION_RESUMED, SUBSCRIPTION_DELETED)
#: The types of this module the event destination is enabled for unless set otherwise.
PUSHED_BY_DEFAULT = frozenset(LIFECYCLE_EVENT_TYPES) - {INVOICE_UPDATED}
#: Statuses in which a subscription has no more periods.
_ENDED = frozenset({"canceled", "incomplete_expired"})
_INT_RE = re.compile(r"-?[0-9]+")
_ZERO = Decimal(0)
_ONE = Decimal(1)
#: Stripe's decimal quantities have at most 12 decimal places.
_QUANTUM = Decimal(1).scaleb(-12)
_FINALIZATION_ERROR = {"type": "invalid_request_error", "code": None, "param": None,
                       "doc_url": None,
                       "message": "The invoice could not be finalized (the fake's failure); "
                                  "Stripe will retry."}

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


def decimal_string(quantity: Decimal) -> str:
    """Stripe's decimal string of ``quantity``: no exponent, no trailing zeros, at most 12
    decimal places (``"1234"``, ``"12.5"``, ``"0"``)."""
    if not quantity.is_finite():
        return str(quantity)
    exponent = quantity.as_tuple().exponent
    if isinstance(exponent, int) and exponent < -12:
        quantity = quantity.quantize(_QUANTUM, ROUND_HALF_UP)
    if quantity == 0:
        return "0"
    return format(quantity.normalize(), "f")


def _amount(quantity: Decimal, unit_amount: int) -> int:
    """The line's amount in minor units: the exact quantity × the unit amount, half up."""
    return int((quantity * unit_amount).to_integral_value(ROUND_HALF_UP))


_rfc3339_cached = functools.lru_cache(maxsize=1024)(_rfc3339)


@dataclass(slots=True)
class FakePrice:
    """A recurring price (``_price.Price``), shared by the items that use it: metered on
    ``event_name``'s meter, or licensed (``event_name`` None)."""

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
    #: The billing cycle anchor: periods are counted from it (see :func:`period_bounds`).
    anchor: int
    period_seconds: int | None
    grace_seconds: int
    items: list[FakeItem]
    #: ``start_date``: the first period's start (the anchor moves at a trial's end or a resume).
    start_date: int
    #: The current period's index from the anchor (see :func:`period_bounds`).
    period: int = 0
    canceled_at: int | None = None
    trial_start: int | None = None
    trial_end: int | None = None
    #: True while the current period is the trial ``[trial_start, trial_end)``.
    in_trial: bool = False
    #: When it was paused (None unless ``paused``).
    paused_at: int | None = None

    @property
    def bounds(self) -> tuple[int, int]:
        if self.in_trial and self.trial_start is not None and self.trial_end is not None:
            return self.trial_start, self.trial_end
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
    #: A metered line's exact quantity once frozen (finalized, or made at 0); None: counted
    #: live.
    frozen: Decimal | None = None
    #: A trial's line: amount 0 whatever its quantity.
    trial: bool = False


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
    billing_reason: str = "subscription_cycle"
    number: str | None = None
    finalized_at: int | None = None
    paid_at: int | None = None
    voided_at: int | None = None
    marked_uncollectible_at: int | None = None
    #: ``last_finalization_error`` once a finalization failed.
    finalization_error: dict[str, Any] | None = None

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


def _remove(keys: list[Key], key: Key) -> None:
    """Take ``key`` out of the sorted ``keys`` (if there)."""
    i = bisect_left(keys, key)
    if i < len(keys) and keys[i] == key:
        del keys[i]


def _newest_first(keys: list[Key], before: Key | None = None) -> Iterator[str]:
    """The ids of ``keys`` (sorted oldest first) from the newest, starting below ``before``."""
    i = len(keys) if before is None else bisect_left(keys, before)
    while i > 0:
        i -= 1
        yield keys[i][2]


def _event(type_: str, object_id: str, object_type: str, url: str, at: int
           ) -> dict[str, Any]:
    return {"id": "evt_" + secrets.token_hex(12), "object": "v2.core.event",
            "type": type_, "created": _rfc3339_cached(at), "livemode": False,
            "context": None,
            "related_object": {"id": object_id, "type": object_type, "url": url},
            "data": {}}


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
    _aggregation_lag: float
    _pushed_types: frozenset[str] | None
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
        self._aggregation_lag = 0.0
        self._pushed_types = PUSHED_BY_DEFAULT
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

    def _emit_locked(self, events: list[dict[str, Any]]
                     ) -> tuple[list[dict[str, Any]], tuple[str, str] | None]:
        """Keep ``events`` (lock held); those to push (the destination's enabled types) and
        where. Push them with :meth:`_push_later` once the lock is released."""
        destination = self._record_events_locked(events)
        types = self._pushed_types
        return [e for e in events if types is None or e["type"] in types], destination

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

    def set_aggregation_lag(self, seconds: float) -> None:
        """Invoice lines count only the units received at least ``seconds`` before the moment
        they are counted (frozen at finalization, or read as a draft): Stripe aggregates
        meter events asynchronously. 0 (the default, and after :meth:`FakeStripe.reset`):
        every unit received by then. The summaries are unaffected."""
        if seconds < 0:
            raise ValueError("lag must be >= 0")
        with self._lock:
            self._aggregation_lag = float(seconds)

    def set_pushed_types(self, types: Iterable[str] | None) -> None:
        """The invoice and subscription event types pushed to the event destination (Stripe
        pushes a destination only the types it is enabled for): None, every one; the default
        (and after :meth:`FakeStripe.reset`) is every one but ``v1.invoice.updated``. Every
        event is listed at ``GET /v2/core/events`` whatever this says."""
        with self._lock:
            self._pushed_types = None if types is None else frozenset(str(t) for t in types)

    def create_subscription(self, customer: str, meters: Iterable[str] = ("api_requests",), *,
                            period_start: int, period_seconds: int | None = None,
                            grace_seconds: int | None = None, licensed: bool = False,
                            status: str = "active", trial_seconds: int | None = None,
                            first_invoice: bool = False) -> str:
        """A subscription of ``customer`` with one metered item per event name of ``meters``
        (their meters must exist), and a licensed item too with ``licensed``; its first period
        starts at ``period_start``. With ``trial_seconds`` it is ``trialing`` and its first
        period is the trial ``[period_start, period_start + trial_seconds)``; with a trial, or
        ``first_invoice``, its first invoice (``subscription_create``) is made at once (see the
        module's docstring). Its id (``sub_fake…``)."""
        return self.create_subscriptions([customer], meters, period_start=period_start,
                                         period_seconds=period_seconds,
                                         grace_seconds=grace_seconds, licensed=licensed,
                                         status=status, trial_seconds=trial_seconds,
                                         first_invoice=first_invoice)[0]

    def create_subscriptions(self, customers: Iterable[str],
                             meters: Iterable[str] = ("api_requests",), *, period_start: int,
                             period_seconds: int | None = None,
                             grace_seconds: int | None = None, licensed: bool = False,
                             status: str = "active", trial_seconds: int | None = None,
                             first_invoice: bool = False) -> list[str]:
        """One subscription per customer, as :meth:`create_subscription` makes it (sharing
        their prices, as Stripe's subscriptions of one plan do). Their ids, in order."""
        names = tuple(meters)
        if period_seconds is not None and int(period_seconds) <= 0:
            raise ValueError("period_seconds must be > 0")
        if grace_seconds is not None and int(grace_seconds) < 0:
            raise ValueError("grace_seconds must be >= 0")
        if status not in SUBSCRIPTION_STATUSES:
            raise ValueError(f"status must be one of {', '.join(SUBSCRIPTION_STATUSES)}")
        if trial_seconds is not None:
            if int(trial_seconds) <= 0:
                raise ValueError("trial_seconds must be > 0")
            if status not in ("active", "trialing"):
                raise ValueError("a trial's status is trialing (leave status as active)")
            status = "trialing"
        if not names and not licensed:
            raise ValueError("a subscription needs an item: meters, or licensed=True")
        seconds = None if period_seconds is None else int(period_seconds)
        interval = "day" if seconds == 86400 else "month"
        now = int(self._clock())
        start = int(period_start)
        trial_end = None if trial_seconds is None else start + int(trial_seconds)
        events: list[dict[str, Any]] = []
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
                    status=status, created=now,
                    anchor=start if trial_end is None else trial_end,
                    period_seconds=seconds, grace_seconds=grace,
                    items=[FakeItem(self._new_id("si"), now, p) for p in prices],
                    start_date=start,
                    canceled_at=now if status in _ENDED else None,
                    trial_start=None if trial_end is None else start, trial_end=trial_end,
                    in_trial=trial_end is not None,
                    paused_at=now if status == "paused" else None)
                self._subs[sub.id] = sub
                _insert(self._sub_keys, sub.key)
                self._subs_of_customer[sub.customer].append(sub.id)
                if status not in _ENDED:
                    if first_invoice or trial_end is not None:
                        events.extend(self._first_invoice_locked(sub, now))
                    if status != "paused":
                        self._schedule_locked(sub.bounds[1], "period", sub.id)
                ids.append(sub.id)
            pushed, destination = self._emit_locked(events)
        self._push_later(pushed, destination)
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

    # -- the subscription's lifecycle ---------------------------------------------------------
    def pause_subscription(self, subscription_id: str) -> dict[str, Any]:
        """Pause now (Stripe's pause endpoint): ``paused``; no period rolls and no invoice is
        made until it is resumed, and the running period is never invoiced. The subscription,
        as served. ValueError when it is already paused or has ended."""
        self.tick()
        now = int(self._clock())
        with self._lock:
            sub = self._subs[subscription_id]
            if sub.status in _ENDED or sub.status == "paused":
                raise ValueError(f"subscription {subscription_id} is {sub.status}")
            sub.status, sub.paused_at = "paused", now
            pushed, destination = self._emit_locked([
                self._subscription_event(SUBSCRIPTION_PAUSED, sub.id, now),
                self._subscription_event(SUBSCRIPTION_UPDATED, sub.id, now)])
            answer = self._subscription_json(sub)
        self._push_later(pushed, destination)
        return answer

    def resume_subscription(self, subscription_id: str) -> dict[str, Any]:
        """Resume a paused subscription now (``billing_cycle_anchor=now``, Stripe's default):
        ``active``, a new period ``[now, now + its length)``. The subscription, as served.
        ValueError when it is not paused."""
        self.tick()
        now = int(self._clock())
        with self._lock:
            sub = self._subs[subscription_id]
            if sub.status != "paused":
                raise ValueError(f"subscription {subscription_id} is {sub.status}, not paused")
            sub.status, sub.paused_at, sub.in_trial = "active", None, False
            sub.anchor, sub.period = now, 0
            self._schedule_locked(sub.bounds[1], "period", sub.id)
            pushed, destination = self._emit_locked([
                self._subscription_event(SUBSCRIPTION_RESUMED, sub.id, now),
                self._subscription_event(SUBSCRIPTION_UPDATED, sub.id, now)])
            answer = self._subscription_json(sub)
        self._push_later(pushed, destination)
        return answer

    def cancel_subscription(self, subscription_id: str, invoice_now: bool = False
                            ) -> dict[str, Any] | None:
        """Cancel now (``canceled``, no more periods; the periods that ended before now were
        invoiced first). With ``invoice_now``, a final invoice for ``[period start, now)`` is
        made and finalized at once (``open``): returned, as served; else None (the running
        period's usage is on no invoice)."""
        self.tick()
        now = int(self._clock())
        answer = None
        with self._lock:
            sub = self._subs[subscription_id]
            events: list[dict[str, Any]] = []
            if sub.status not in _ENDED:
                if invoice_now and sub.status != "paused":
                    invoice, made = self._final_invoice_locked(sub, now)
                    if invoice is not None:
                        events.extend(made)
                        answer = invoice
                sub.status, sub.canceled_at = "canceled", now
                events.append(self._subscription_event(SUBSCRIPTION_DELETED, sub.id, now))
            pushed, destination = self._emit_locked(events)
            result = None if answer is None else self._invoice_json_locked(answer)
        self._push_later(pushed, destination)
        return result

    # -- time -------------------------------------------------------------------------------
    def tick(self) -> dict[str, int]:
        """Do what is due up to now, in time order: draft the invoices of the periods that
        ended (the items' period moves on), end the trials that are over, and finalize the
        drafts whose grace period is over. How many drafted and finalized."""
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
                    if (sub is None or sub.status in _ENDED or sub.status == "paused"
                            or sub.bounds[1] != due):
                        continue
                    if sub.in_trial:
                        made, trial_events = self._end_trial_locked(sub)
                        events.extend(trial_events)
                        drafted += made
                    else:
                        events.extend(self._draft_locked(sub))
                        drafted += 1
                else:
                    invoice = self._invoices.get(object_id)
                    if (invoice is None or invoice.status != "draft"
                            or invoice.finalizes_at != due):
                        continue
                    events.extend(self._finalize_locked(invoice, int(due)))
                    finalized += 1
            self._next_due = self._due[0][0] if self._due else math.inf
            pushed, destination = self._emit_locked(events)
        self._push_later(pushed, destination)
        return {"drafted": drafted, "finalized": finalized}

    def _new_invoice_locked(self, sub: FakeSubscription, lines: list[FakeLine], *,
                            created: int, period_start: int, period_end: int,
                            finalizes_at: int | None, billing_reason: str) -> FakeInvoice:
        """A draft of ``sub``, kept and listed (its finalization not scheduled)."""
        self._ids["_invoice"] += 1
        invoice = FakeInvoice(id=self._new_id("in"), seq=self._ids["_invoice"],
                              customer=sub.customer, subscription=sub.id, created=created,
                              period_start=period_start, period_end=period_end,
                              collection_method="charge_automatically", lines=lines,
                              finalizes_at=finalizes_at, billing_reason=billing_reason)
        self._invoices[invoice.id] = invoice
        _insert(self._invoice_keys, invoice.key)
        self._invoices_of_customer[invoice.customer].append(invoice.id)
        self._invoices_of_sub[sub.id].append(invoice.id)
        return invoice

    def _line(self, item: FakeItem, start: int, end: int, *, frozen: Decimal | None = None,
              trial: bool = False) -> FakeLine:
        return FakeLine(id=self._new_id("il"), item=item.id, price=item.price, start=start,
                        end=end, frozen=frozen, trial=trial)

    def _draft_locked(self, sub: FakeSubscription) -> list[dict[str, Any]]:
        """The invoice of ``sub``'s current period, which has just ended; the period moves
        on. The ``v1.invoice.created`` event (not yet recorded)."""
        start, end = sub.bounds
        following = period_bounds(sub.anchor, sub.period_seconds, sub.period + 1)[1]
        lines = [self._line(item, start, end) if item.price.event_name is not None
                 else self._line(item, end, following) for item in sub.items]
        invoice = self._new_invoice_locked(
            sub, lines, created=end, period_start=start, period_end=end,
            finalizes_at=end + sub.grace_seconds, billing_reason="subscription_cycle")
        self._schedule_locked(end + sub.grace_seconds, "finalize", invoice.id)
        sub.period += 1
        self._schedule_locked(following, "period", sub.id)
        return [self._invoice_event(INVOICE_CREATED, invoice.id, end)]

    def _end_trial_locked(self, sub: FakeSubscription) -> tuple[int, list[dict[str, Any]]]:
        """``sub``'s trial has just ended: ``active``, its first paid period starts (from the
        anchor, the trial's end). No invoice carries the trial's metered usage; a draft with
        the licensed items' lines (the next period, in advance) when it has any. How many
        invoices were made (0 or 1), and the events (not yet recorded)."""
        trial_start, trial_end = sub.bounds
        sub.in_trial = False
        if sub.status == "trialing":
            sub.status = "active"
        start, end = sub.bounds
        events = [self._subscription_event(SUBSCRIPTION_UPDATED, sub.id, trial_end)]
        licensed = [item for item in sub.items if item.price.event_name is None]
        made = 0
        if licensed:
            invoice = self._new_invoice_locked(
                sub, [self._line(item, start, end) for item in licensed], created=trial_end,
                period_start=trial_start, period_end=trial_end,
                finalizes_at=trial_end + sub.grace_seconds, billing_reason="subscription_cycle")
            self._schedule_locked(trial_end + sub.grace_seconds, "finalize", invoice.id)
            events.append(self._invoice_event(INVOICE_CREATED, invoice.id, trial_end))
            made = 1
        self._schedule_locked(end, "period", sub.id)
        return made, events

    def _first_invoice_locked(self, sub: FakeSubscription, now: int) -> list[dict[str, Any]]:
        """Stripe's first invoice of ``sub`` (``subscription_create``), made and finalized
        now: its metered lines for the first period (the trial) frozen at 0, its licensed
        ones for that period (free in a trial). Paid at once ($0, or taken as paid; ``open``
        for an ``incomplete`` subscription with something to pay). The events."""
        start, end = sub.bounds
        lines = [self._line(item, start, end, trial=sub.in_trial,
                            frozen=_ZERO if item.price.event_name is not None else None)
                 for item in sub.items]
        invoice = self._new_invoice_locked(
            sub, lines, created=now, period_start=sub.start_date, period_end=sub.start_date,
            finalizes_at=None, billing_reason="subscription_create")
        invoice.status, invoice.finalized_at = "open", now
        invoice.number = f"FAKE-{invoice.seq:06d}"
        events = [self._invoice_event(INVOICE_CREATED, invoice.id, now),
                  self._invoice_event(INVOICE_FINALIZED, invoice.id, now)]
        total = sum(self._line_amount_locked(invoice, line) for line in lines)
        if total == 0 or sub.status != "incomplete":
            invoice.status, invoice.paid_at = "paid", now
            events.append(self._invoice_event(INVOICE_PAID, invoice.id, now))
        events.append(self._invoice_event(INVOICE_UPDATED, invoice.id, now))
        return events

    def _final_invoice_locked(self, sub: FakeSubscription, now: int
                              ) -> tuple[FakeInvoice | None, list[dict[str, Any]]]:
        """The final invoice of ``sub`` cancelled now with ``invoice_now``: its metered lines
        for ``[period start, now)``, finalized at once. None without a metered item."""
        start = sub.bounds[0]
        end = max(start, now)
        lines = [self._line(item, start, end, trial=sub.in_trial,
                            frozen=_ZERO if sub.in_trial else None)
                 for item in sub.items if item.price.event_name is not None]
        if not lines:
            return None, []
        invoice = self._new_invoice_locked(
            sub, lines, created=now, period_start=start, period_end=end, finalizes_at=None,
            billing_reason="subscription_cycle")
        return invoice, [self._invoice_event(INVOICE_CREATED, invoice.id, now),
                         *self._finalize_locked(invoice, now)]

    def _finalize_locked(self, invoice: FakeInvoice, at: int) -> list[dict[str, Any]]:
        """Finalize the draft at ``at``: its metered quantities frozen at what was received by
        then (less the aggregation lag). The ``v1.invoice.finalized`` and
        ``v1.invoice.updated`` events (not yet recorded)."""
        invoice.status, invoice.finalized_at, invoice.finalizes_at = "open", at, None
        invoice.number = f"FAKE-{invoice.seq:06d}"
        for line in invoice.lines:
            if line.price.event_name is not None and line.frozen is None:
                line.frozen = self._units_locked(line.price.event_name, invoice.customer,
                                                 line.start, line.end,
                                                 received_by=at - self._aggregation_lag)
        return [self._invoice_event(INVOICE_FINALIZED, invoice.id, at),
                self._invoice_event(INVOICE_UPDATED, invoice.id, at)]

    @staticmethod
    def _invoice_event(type_: str, invoice_id: str, at: int) -> dict[str, Any]:
        return _event(type_, invoice_id, "invoice", f"/v1/invoices/{invoice_id}", at)

    @staticmethod
    def _subscription_event(type_: str, subscription_id: str, at: int) -> dict[str, Any]:
        return _event(type_, subscription_id, "subscription",
                      f"/v1/subscriptions/{subscription_id}", at)

    def _units_locked(self, event_name: str, customer: str, start: int, end: int, *,
                      received_by: float | None = None) -> Decimal:
        """What the summaries count for the customer on the meter over ``[start, end)``
        (received at or before ``received_by``, when given), aggregated by the meter's
        formula, exactly."""
        meter = self._meters.get(event_name)
        points: list[tuple[int, Decimal]] = []
        for e in self._by_pair.get((event_name, customer), ()):
            if not start <= e.timestamp < end:
                continue
            if isinstance(e, Usage):
                if (received_by is None or e.received_at is None
                        or e.received_at <= received_by):
                    points.append((e.timestamp, Decimal(repr(e.value))))
            elif (e.valid and not e.cancelled and not e.lost
                  and (received_by is None or e.received_at <= received_by)):
                points.append((e.timestamp, Decimal(e.value)))
        if not points:
            return _ZERO
        formula = meter.formula if meter is not None else "sum"
        if formula == "count":
            return Decimal(len(points))
        if formula == "last":
            return max(points)[1]
        return sum((v for _, v in points), _ZERO)

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
            pushed, destination = self._emit_locked(self._finalize_locked(invoice, now))
            answer = self._invoice_json_locked(invoice)
        self._push_later(pushed, destination)
        return answer

    def pay_invoice(self, invoice_id: str) -> dict[str, Any]:
        """An open (or uncollectible) invoice is paid now (``paid``,
        ``status_transitions.paid_at``)."""
        return self._settle(invoice_id, "paid")

    def void_invoice(self, invoice_id: str) -> dict[str, Any]:
        """An open (or uncollectible) invoice is voided now (``void``,
        ``status_transitions.voided_at``)."""
        return self._settle(invoice_id, "void")

    def mark_uncollectible(self, invoice_id: str) -> dict[str, Any]:
        """An open invoice is marked uncollectible now (``uncollectible``,
        ``status_transitions.marked_uncollectible_at``)."""
        return self._settle(invoice_id, "uncollectible")

    def _settle(self, invoice_id: str, status: str) -> dict[str, Any]:
        self.tick()
        now = int(self._clock())
        allowed = ("open",) if status == "uncollectible" else ("open", "uncollectible")
        with self._lock:
            invoice = self._invoices[invoice_id]
            if invoice.status not in allowed:
                raise ValueError(f"invoice {invoice_id} is {invoice.status}, not "
                                 f"{' or '.join(allowed)}")
            invoice.status = status
            if status == "paid":
                invoice.paid_at, type_ = now, INVOICE_PAID
            elif status == "void":
                invoice.voided_at, type_ = now, INVOICE_VOIDED
            else:
                invoice.marked_uncollectible_at, type_ = now, INVOICE_MARKED_UNCOLLECTIBLE
            pushed, destination = self._emit_locked([
                self._invoice_event(type_, invoice.id, now),
                self._invoice_event(INVOICE_UPDATED, invoice.id, now)])
            answer = self._invoice_json_locked(invoice)
        self._push_later(pushed, destination)
        return answer

    def fail_finalization(self, invoice_id: str) -> dict[str, Any]:
        """Stripe's attempt to finalize a draft failed now: it stays a draft,
        ``last_finalization_error`` is set and ``automatically_finalizes_at`` moves one hour
        later (Stripe retries); ``v1.invoice.finalization_failed``. The invoice, as served.
        ValueError when it is not a draft."""
        self.tick()
        now = int(self._clock())
        with self._lock:
            invoice = self._invoices[invoice_id]
            if invoice.status != "draft":
                raise ValueError(f"invoice {invoice_id} is {invoice.status}, not draft")
            base = now if invoice.finalizes_at is None else invoice.finalizes_at
            invoice.finalizes_at = base + FINALIZATION_RETRY_SECONDS
            invoice.finalization_error = dict(_FINALIZATION_ERROR)
            self._schedule_locked(invoice.finalizes_at, "finalize", invoice.id)
            pushed, destination = self._emit_locked([
                self._invoice_event(INVOICE_FINALIZATION_FAILED, invoice.id, now)])
            answer = self._invoice_json_locked(invoice)
        self._push_later(pushed, destination)
        return answer

    def delete_draft(self, invoice_id: str) -> dict[str, Any]:
        """Delete a draft now (Stripe's ``DELETE /v1/invoices/{id}``): it is in no list and
        retrieving it is a 404; ``v1.invoice.deleted``. Stripe's answer (``{"id", "object",
        "deleted": true}``). ValueError when it is not a draft."""
        self.tick()
        now = int(self._clock())
        with self._lock:
            invoice = self._invoices[invoice_id]
            if invoice.status != "draft":
                raise ValueError(f"invoice {invoice_id} is {invoice.status}, not draft")
            del self._invoices[invoice_id]
            _remove(self._invoice_keys, invoice.key)
            self._invoices_of_customer[invoice.customer].remove(invoice_id)
            self._invoices_of_sub[invoice.subscription].remove(invoice_id)
            pushed, destination = self._emit_locked([
                self._invoice_event(INVOICE_DELETED, invoice_id, now)])
        self._push_later(pushed, destination)
        return {"id": invoice_id, "object": "invoice", "deleted": True}

    # -- observation ------------------------------------------------------------------------
    def subscriptions(self) -> list[dict[str, Any]]:
        """Every subscription as served (any status), newest first."""
        self.tick()
        with self._lock:
            return [self._subscription_json(self._subs[i]) for i in _newest_first(self._sub_keys)]

    def invoices(self, customer: str | None = None) -> list[dict[str, Any]]:
        """Every invoice (of ``customer``) as served, newest first (deleted drafts left
        out)."""
        self.tick()
        with self._lock:
            keys = (self._invoice_keys if customer is None else
                    sorted(self._invoices[i].key for i in self._invoices_of_customer.get(
                        customer, ())))
            return [self._invoice_json_locked(self._invoices[i]) for i in _newest_first(keys)]

    def invoice(self, invoice_id: str) -> dict[str, Any]:
        """One invoice as served (KeyError for an unknown or deleted id)."""
        self.tick()
        with self._lock:
            return self._invoice_json_locked(self._invoices[invoice_id])

    def line_units(self, invoice_id: str) -> dict[str, int]:
        """Event name -> the ``quantity`` (whole units, truncated) of the invoice's metered
        lines of its meter (every line, not only the embedded ones)."""
        self.tick()
        with self._lock:
            invoice = self._invoices[invoice_id]
            units: dict[str, int] = {}
            for line in invoice.lines:
                name = line.price.event_name
                if name is not None:
                    units[name] = units.get(name, 0) + int(self._quantity_locked(invoice, line))
            return units

    # -- answers ----------------------------------------------------------------------------
    def _subscription_json(self, sub: FakeSubscription) -> dict[str, Any]:
        items = [self._item_json(sub, item) for item in sub.items]
        cap = len(items) if self._embedded_items is None else self._embedded_items
        paused = None if sub.paused_at is None else {"paused": {
            "type": "subscription", "transitioned_at": sub.paused_at,
            "subscription": {"type": "pause_requested"}}}
        return {"id": sub.id, "object": "subscription", "customer": sub.customer,
                "status": sub.status, "created": sub.created, "livemode": False,
                "metadata": {}, "collection_method": "charge_automatically",
                "currency": "usd", "start_date": sub.start_date,
                "billing_cycle_anchor": sub.anchor, "cancel_at": None,
                "cancel_at_period_end": False, "canceled_at": sub.canceled_at,
                "ended_at": sub.canceled_at, "trial_start": sub.trial_start,
                "trial_end": sub.trial_end, "status_details": paused,
                "pause_collection": None,
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

    def _quantity_locked(self, invoice: FakeInvoice, line: FakeLine) -> Decimal:
        """The line's exact quantity: frozen, or counted now (less the aggregation lag)."""
        if line.price.event_name is None:
            return _ONE
        if line.frozen is not None:
            return line.frozen
        lag = self._aggregation_lag
        return self._units_locked(line.price.event_name, invoice.customer, line.start,
                                  line.end, received_by=self._clock() - lag if lag else None)

    def _line_amount_locked(self, invoice: FakeInvoice, line: FakeLine) -> int:
        if line.trial:
            return 0
        return _amount(self._quantity_locked(invoice, line), line.price.unit_amount)

    def _line_json_locked(self, invoice: FakeInvoice, line: FakeLine) -> dict[str, Any]:
        quantity = self._quantity_locked(invoice, line)
        amount = 0 if line.trial else _amount(quantity, line.price.unit_amount)
        return {
            "id": line.id, "object": "line_item", "invoice": invoice.id, "livemode": False,
            "metadata": {}, "currency": "usd", "description": None, "discountable": True,
            "discounts": [], "amount": amount, "subtotal": amount, "quantity": int(quantity),
            "quantity_decimal": decimal_string(quantity),
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
            "billing_reason": invoice.billing_reason, "number": invoice.number,
            "last_finalization_error": invoice.finalization_error,
            "status_transitions": {"finalized_at": invoice.finalized_at,
                                   "paid_at": invoice.paid_at,
                                   "voided_at": invoice.voided_at,
                                   "marked_uncollectible_at":
                                       invoice.marked_uncollectible_at},
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
