"""Reading Stripe's billing periods and invoices, and keeping the claim's invoice-first mark.

:class:`BillingRefresher` (a maintenance service, ``stripe-billing``) runs at start, every
``STRIPE_BILLING_REFRESH_SECONDS`` and when Stripe says an invoice was drafted or finalized
(polled, :meth:`BillingRefresher.on_invoice_events`; pushed, :func:`receive_invoice`). One
refresh is one list pass over every subscription (pages of 100) and one over the invoices
created since the last pass began (back to the oldest draft kept; 35 days on the first run,
as far back as Stripe accepts usage), within the process's ceiling on calls per second, by one
process at a time (a lease). :class:`InvoiceFirst` (``invoice-first``) marks the waiting
events of draft invoices' periods every few seconds, so events enqueued or requeued during a
grace period are claimed first too.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine

from ..config import Settings
from ..db import reading
from ..models import utcnow
from ..outbox import billing_watch, invoices, stripe_runs
from ..outbox.sql import INVOICES, SUBSCRIPTIONS
from ..stripe_gateway import StripeGateway
from ..stripe_gateway.data import ThinEvent
from .meters import MeterRefresher
from .throttle import process_limiter

log = logging.getLogger(__name__)

#: Stripe's thin events about a new or newly final invoice: the invoices are listed again.
LISTED_TYPES = ("v1.invoice.created", "v1.invoice.finalized")
#: Events about an invoice that changed after it was listed: that invoice is read again
#: (``.deleted``: a draft is gone, and nothing is read).
INVOICE_DELETED = "v1.invoice.deleted"
CHANGED_TYPES = ("v1.invoice.updated", "v1.invoice.finalization_failed", "v1.invoice.voided",
                 "v1.invoice.marked_uncollectible", INVOICE_DELETED)
#: Events about a subscription: that subscription is read again.
SUBSCRIPTION_TYPES = ("v1.customer.subscription.updated", "v1.customer.subscription.deleted",
                      "v1.customer.subscription.paused", "v1.customer.subscription.resumed")
#: Every event type the billing refresher reads (polled, and pushed to ``POST
#: /stripe/webhook``: an event destination must enable them, ``docs/stripe.md``).
INVOICE_EVENT_TYPES = LISTED_TYPES + CHANGED_TYPES + SUBSCRIPTION_TYPES
#: Invoices or subscriptions read one by one for the events of one poll, at most; past it,
#: one listing of them all costs less.
READ_ONE_BY_ONE = 50
#: How far back the scheduled refresh lists voided and uncollectible invoices again (an
#: invoice finalized up to 35 days after its period may be voided later; no event needed).
STATUS_BACK = timedelta(days=45)
#: How far back the first refresh reads invoices: Stripe accepts usage up to 35 days old.
FIRST_READ_BACK = timedelta(days=35)
#: How far before the last pass's start the next one lists again (Stripe's lists may show a
#: new invoice a little late; Stripe documents no bound, this is a margin).
OVERLAP = timedelta(minutes=10)
#: An invoice event this close before the last pass's start may not be in that pass.
EVENT_SLACK = timedelta(minutes=1)
#: How long one refresh may hold the lease.
LEASE_SECONDS = 900.0
#: How often the invoice-first mark is brought up to date.
MARK_SECONDS = 15.0


@dataclass
class RefreshSummary:
    """What a refresh did."""

    items: int = 0
    invoices: int = 0
    drafts: int = 0
    marked: int = 0
    unmarked: int = 0
    skipped: bool = False

    def as_dict(self) -> dict[str, int | bool]:
        return {"items": self.items, "invoices": self.invoices, "drafts": self.drafts,
                "marked": self.marked, "unmarked": self.unmarked, "skipped": self.skipped}


class BillingRefresher:
    """Reads Stripe's metered subscription items and their invoices. A maintenance service."""

    name = "stripe-billing"

    def __init__(self, engine: Engine, source: StripeGateway, *,
                 clock: Callable[[], datetime] = utcnow,
                 max_requests_per_second: float | None = None) -> None:
        self.engine = engine
        self.source = source
        self.clock = clock
        self.limiter = (None if max_requests_per_second is None
                        else process_limiter(max_requests_per_second))
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{id(self)}"
        self.meters = MeterRefresher(engine, source, clock=clock)

    def _pace(self) -> None:
        if self.limiter is not None:
            self.limiter.acquire()

    def run_once(self) -> RefreshSummary:
        """One refresh: every subscription, then the invoices since the last pass."""
        return self._refresh(subscriptions=True)

    def refresh_invoices(self) -> RefreshSummary:
        """The invoices pass alone (an invoice was drafted or finalized)."""
        return self._refresh(subscriptions=False)

    def on_invoice_events(self, events: Iterable[ThinEvent]) -> RefreshSummary | None:
        """Stripe's events about invoices and subscriptions: a subscription or invoice that
        changed since it was last read is read again (one by one, or all when many); a new or
        newly final invoice newer than the last pass has the invoices listed again."""
        events = list(events)
        now = self.clock()
        with reading(self.engine) as conn:
            mark = stripe_runs.run_status(conn, stripe_runs.INVOICES_MARK).ran_at
            subs = _stale(conn, SUBSCRIPTIONS, events, SUBSCRIPTION_TYPES)
            changed = _stale(conn, INVOICES, events, CHANGED_TYPES)
        invoices.mark_deleted(self.engine, sorted(
            {e.related_id for e in events if e.type == INVOICE_DELETED and e.related_id}))
        changed -= {e.related_id for e in events if e.type == INVOICE_DELETED}
        if len(subs) > READ_ONE_BY_ONE:
            return self.run_once()
        for sub_id in sorted(subs):
            self._pace()
            receive_subscription(self.engine, self.source, sub_id, now=now)
        listed = [e for e in events if e.type in LISTED_TYPES]
        if len(changed) > READ_ONE_BY_ONE or (listed and (mark is None or any(
                e.created >= mark - EVENT_SLACK for e in listed))):
            return self.refresh_invoices()
        for invoice_id in sorted(changed):
            self._pace()
            receive_invoice(self.engine, self.source, invoice_id, now=now)
        return None

    def _refresh(self, *, subscriptions: bool) -> RefreshSummary:
        now = self.clock()
        summary = RefreshSummary()
        if not stripe_runs.take_lease(self.engine, stripe_runs.BILLING, owner=self.owner,
                                      now=now, seconds=LEASE_SECONDS):
            summary.skipped = True
            return summary
        try:
            with reading(self.engine) as conn:
                mark = stripe_runs.run_status(conn, stripe_runs.INVOICES_MARK).ran_at
                oldest = invoices.oldest_draft_created(conn)
            since = now - FIRST_READ_BACK if mark is None else mark - OVERLAP
            if oldest is not None:
                since = min(since, oldest)
            # The two lists are read side by side (each page still waits its turn under the
            # process's ceiling): at 100,000 customers each is about a thousand pages.
            with ThreadPoolExecutor(max_workers=2, thread_name_prefix="stripe-billing") as pool:
                listing = pool.submit(self.source.list_invoices, created_gte=since,
                                      pace=self._pace)
                if subscriptions:
                    items = self.source.list_subscriptions(pace=self._pace)
                    with reading(self.engine) as conn:
                        unknown = invoices.unknown_meters(conn, items)
                    if unknown:     # an item's meter must have its event name when stored
                        self._pace()
                        self.meters.run_once()
                    summary.items = invoices.store_items(self.engine, items, now=now)
                listed = listing.result()
                if subscriptions:
                    stripe_runs.record_run(self.engine, stripe_runs.SUBSCRIPTIONS_MARK,
                                           ok=True, detail=None, now=now)
                    # Invoices voided or marked uncollectible since they were listed.
                    for status in (invoices.VOID, invoices.UNCOLLECTIBLE):
                        listed += self.source.list_invoices(created_gte=now - STATUS_BACK,
                                                            pace=self._pace, status=status)
            summary.invoices = invoices.store_invoices(self.engine, listed, now=now,
                                                       listed_since=since)
            stripe_runs.record_run(self.engine, stripe_runs.INVOICES_MARK, ok=True,
                                   detail=None, now=now)
            summary.marked, summary.unmarked = invoices.mark_invoice_first(self.engine)
            with reading(self.engine) as conn:
                summary.drafts = invoices.drafts_to_finalize(conn)
            billing_watch.keep_late(self.engine, now=self.clock(), revisit=subscriptions)
            billing_watch.keep_unbilled(self.engine, now=self.clock())
            billing_watch.keep_overlaps(self.engine, now=self.clock())
        except Exception as exc:
            stripe_runs.record_run(self.engine, stripe_runs.BILLING, ok=False,
                                   detail=str(exc), now=now)
            raise
        finally:
            stripe_runs.drop_lease(self.engine, stripe_runs.BILLING, owner=self.owner)
        what = (f"{summary.items} metered subscription items, " if subscriptions else "")
        stripe_runs.record_run(self.engine, stripe_runs.BILLING, ok=True, now=now,
                               detail=f"{what}{summary.invoices} invoices read, "
                               f"{summary.drafts} drafts; {summary.marked} events to send "
                               f"first")
        return summary


class InvoiceFirst:
    """Keeps the invoice-first mark of waiting events up to date, and the invoice risk the
    status line shows. A maintenance service."""

    name = "invoice-first"

    def __init__(self, engine: Engine, *, risk_seconds: float,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.engine = engine
        self.risk = timedelta(seconds=risk_seconds)
        self.clock = clock

    def run_once(self) -> tuple[int, int]:
        marked = invoices.mark_invoice_first(self.engine)
        billing_watch.keep_invoice_risk(self.engine, now=self.clock(), within=self.risk)
        return marked


def _stale(conn: Connection, table: Any, events: Sequence[ThinEvent],
           types: tuple[str, ...]) -> set[str]:
    """The objects these events of ``types`` are about that were not read since (an event's
    time is whole seconds, and our clock is not Stripe's: read within ``EVENT_SLACK`` of
    it is not "since")."""
    newest: dict[str, datetime] = {}
    for e in events:
        if e.type in types and e.related_id:
            newest[e.related_id] = max(e.created, newest.get(e.related_id, e.created))
    seen = invoices.last_read(conn, table, list(newest))
    return {i for i, at in newest.items() if i not in seen or seen[i] < at + EVENT_SLACK}


def receive_subscription(engine: Engine, gateway: StripeGateway, subscription_id: str, *,
                         now: datetime) -> bool:
    """A subscription Stripe says changed: read it (one call) and keep its metered items and
    what decides whether its usage is invoiced; then judge again. Whether it has a metered
    item."""
    found = gateway.retrieve_subscription(subscription_id)
    if not found:
        return False
    invoices.store_items(engine, found, now=now, complete=False)
    billing_watch.keep_late(engine, now=now)
    billing_watch.keep_unbilled(engine, now=now)
    billing_watch.keep_overlaps(engine, now=now)
    return True


def receive_invoice(engine: Engine, gateway: StripeGateway, invoice_id: str, *,
                    now: datetime) -> bool:
    """A pushed invoice event: read that invoice and keep it (one call); whether it bills a
    subscription."""
    found = gateway.retrieve_invoice(invoice_id)
    if found is None:
        return False
    invoices.store_invoices(engine, [found], now=now)
    invoices.mark_invoice_first(engine)
    billing_watch.keep_late(engine, now=now)
    billing_watch.keep_unbilled(engine, now=now)
    return True


def billing_refresher(engine: Engine, gateway: StripeGateway, settings: Settings, *,
                      clock: Callable[[], datetime] = utcnow) -> BillingRefresher:
    """The refresher every draining process and ``billing-outbox periods --refresh`` run."""
    return BillingRefresher(engine, gateway, clock=clock,
                            max_requests_per_second=settings.stripe_max_requests_per_second)
