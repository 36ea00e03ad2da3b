"""What the outbox keeps of Stripe's billing (migrations 0022 and 0027): the subscriptions with
metered items and those items with their current period, the invoices Stripe drafted and
finalized for them with their metered lines, what the invoice-line judge found of each
finalized line and of the events around it, the usage that lands on no invoice, and what a
person did about usage that came too late for its invoice. Read from Stripe by the billing
refresher (``webapp.worker.invoices``); nothing here is read from Stripe per page view."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Index, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base, UTCDateTime


class StripeSubscriptionItem(Base):
    """A subscription item whose price is metered on a meter (``price.recurring.meter``,
    ``usage_type = metered``), as Stripe last listed it. Its period is the item's own
    (``current_period_start`` / ``current_period_end``, API 2025-03-31 and later)."""

    __tablename__ = "stripe_subscription_items"

    id: Mapped[str] = mapped_column(String(255), primary_key=True)
    subscription_id: Mapped[str] = mapped_column(String(255))
    stripe_customer_id: Mapped[str] = mapped_column(String(255))
    #: The subscription's status (``active``, ``past_due``, ``canceled``, …).
    subscription_status: Mapped[str] = mapped_column(String(30))
    meter_id: Mapped[str] = mapped_column(String(255))
    #: The meter's event name, from ``stripe_meters`` when the item was stored (None while
    #: the meter is not known there).
    meter: Mapped[str | None] = mapped_column(String(100))
    price_id: Mapped[str | None] = mapped_column(String(255))
    current_period_start: Mapped[datetime] = mapped_column(UTCDateTime())
    current_period_end: Mapped[datetime] = mapped_column(UTCDateTime())
    seen_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        Index("ix_subscription_items_customer", "stripe_customer_id", "meter"),
        # The periods that end soon.
        Index("ix_subscription_items_period_end", "current_period_end"),
    )


class StripeSubscription(Base):
    """A subscription with a metered item, as Stripe last listed it (migration 0027): what
    decides whether usage of its customer lands on an invoice — a trial bills nothing
    (``trial_start`` / ``trial_end``), a paused subscription invoices nothing (``paused_at``,
    ours: since when it was seen paused, until ``resumed_at``), one cancelled without a final
    invoice bills nothing of its last period (``ended_at``)."""

    __tablename__ = "stripe_subscriptions"

    id: Mapped[str] = mapped_column(String(255), primary_key=True)
    stripe_customer_id: Mapped[str] = mapped_column(String(255))
    status: Mapped[str] = mapped_column(String(30))
    created: Mapped[datetime | None] = mapped_column(UTCDateTime())
    start_date: Mapped[datetime | None] = mapped_column(UTCDateTime())
    trial_start: Mapped[datetime | None] = mapped_column(UTCDateTime())
    trial_end: Mapped[datetime | None] = mapped_column(UTCDateTime())
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    canceled_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    #: ``pause_collection.behavior`` (invoices are still made), not a pause of the
    #: subscription.
    pause_collection: Mapped[str | None] = mapped_column(String(30))
    #: Since when the subscription has been ``paused`` (Stripe's ``...subscription.paused``
    #: event, else its trial's end, else when it was first seen paused); and when it was seen
    #: to resume (its items' new period's start).
    paused_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    resumed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    seen_at: Mapped[datetime] = mapped_column(UTCDateTime())
    #: When a field the judge reads last changed: the customer's usage is judged again.
    changed_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        Index("ix_subscriptions_customer", "stripe_customer_id"),
        Index("ix_subscriptions_changed", "changed_at"),
    )


class StripeInvoice(Base):
    """An invoice of a subscription with metered items: while ``draft``, usage of the periods
    its lines bill still counts, until ``finalizes_at`` (Stripe's
    ``automatically_finalizes_at``); ``finalized_at`` is ``status_transitions.finalized_at``.
    A draft Stripe no longer lists (deleted in its dashboard) is kept as ``deleted``."""

    __tablename__ = "stripe_invoices"

    id: Mapped[str] = mapped_column(String(255), primary_key=True)
    stripe_customer_id: Mapped[str] = mapped_column(String(255))
    subscription_id: Mapped[str | None] = mapped_column(String(255))
    status: Mapped[str] = mapped_column(String(20))
    created: Mapped[datetime] = mapped_column(UTCDateTime())
    finalizes_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finalized_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    seen_at: Mapped[datetime] = mapped_column(UTCDateTime())
    #: Why Stripe made it (``subscription_create``: a new subscription's first invoice,
    #: finalized at once; ``subscription_cycle``: a period's end; …), and its currency.
    billing_reason: Mapped[str | None] = mapped_column(String(40))
    currency: Mapped[str | None] = mapped_column(String(3))

    __table_args__ = (
        # The drafts, soonest to finalize first (few at most times, one per subscription at
        # a period's end).
        Index("ix_invoices_draft", "finalizes_at",
              postgresql_where=text("status = 'draft'"), sqlite_where=text("status = 'draft'")),
        Index("ix_invoices_finalized", "finalized_at",
              postgresql_where=text("finalized_at IS NOT NULL"),
              sqlite_where=text("finalized_at IS NOT NULL")),
    )


class StripeInvoicePeriod(Base):
    """One metered line of an invoice: the item and the period it bills, and the quantity
    Stripe put on it when last read (fixed once the invoice is final). Once the invoice is
    final the judge (``webapp.outbox.judge``, migration 0027) compares the line with the
    project's own figure for its customer, meter and period and keeps the verdict here: a
    page reads it, never sums the events per view."""

    __tablename__ = "stripe_invoice_periods"

    invoice_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    subscription_item_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    stripe_customer_id: Mapped[str] = mapped_column(String(255))
    #: The item's meter (event name) when the line was stored: the period stays known after
    #: the item is gone from its subscription.
    meter: Mapped[str | None] = mapped_column(String(100))
    period_start: Mapped[datetime] = mapped_column(UTCDateTime())
    period_end: Mapped[datetime] = mapped_column(UTCDateTime())
    quantity: Mapped[int | None] = mapped_column(BigInteger)
    subscription_id: Mapped[str | None] = mapped_column(String(255))
    #: Stripe's quantity exactly (``quantity_decimal``, a decimal string; ``quantity``
    #: truncates), and the line's amount in the currency's minor unit.
    quantity_decimal: Mapped[str | None] = mapped_column(String(40))
    amount: Mapped[int | None] = mapped_column(BigInteger)
    #: The invoice's finalization (None while a draft): the moment the line was fixed.
    finalized_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    #: The judge's verdict (None: not judged since the line or its events last changed):
    #: ``matches``, ``late``, ``short``, ``over``, ``free``, ``void``, ``uncollectible``,
    #: ``not_compared`` (``webapp.outbox.judge``).
    verdict: Mapped[str | None] = mapped_column(String(20))
    #: The meter's formula when judged: ``sum`` compares units, ``count`` events.
    formula: Mapped[str | None] = mapped_column(String(10))
    #: What the project counts on the line: units (``sum``) or events (``count``) Stripe took
    #: before the finalization, and the events they are.
    ours: Mapped[int | None] = mapped_column(BigInteger)
    ours_events: Mapped[int | None] = mapped_column(BigInteger)
    #: Reached Stripe after the finalization, or still unsent (including uncertain events the
    #: line settled as not on it).
    late: Mapped[int | None] = mapped_column(BigInteger)
    late_events: Mapped[int | None] = mapped_column(BigInteger)
    #: May have reached Stripe on either side of the finalization, not settled by the line.
    uncertain: Mapped[int | None] = mapped_column(BigInteger)
    uncertain_events: Mapped[int | None] = mapped_column(BigInteger)
    #: Stripe's quantity less what it should hold (``ours`` and the uncertain units the line
    #: settled as on it), a decimal string: below zero, the line is short by that many units,
    #: late usage as one amount (Stripe has the events); above, it is over.
    difference: Mapped[str | None] = mapped_column(String(40))
    judged_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (
        Index("ix_invoice_periods_customer", "stripe_customer_id", "period_end"),
        # The Invoices page and ``billing-outbox invoices``: finalized lines, newest first,
        # by verdict.
        Index("ix_invoice_periods_finalized", "finalized_at", "verdict",
              postgresql_where=text("finalized_at IS NOT NULL"),
              sqlite_where=text("finalized_at IS NOT NULL")),
        Index("ix_invoice_periods_verdict", "verdict", "finalized_at",
              postgresql_where=text("finalized_at IS NOT NULL"),
              sqlite_where=text("finalized_at IS NOT NULL")),
    )


class LateUsage(Base):
    """What a person did about an event that came too late for its invoice: billed it on the
    next invoice (``billed_next``, under the new event ``new_event_id``) or wrote it off
    (``written_off``, with a reason). One row per late event: it is handled once."""

    __tablename__ = "late_usage"

    event_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    action: Mapped[str] = mapped_column(String(20))
    invoice_id: Mapped[str] = mapped_column(String(255))
    new_event_id: Mapped[int | None] = mapped_column(BigInteger, index=True)
    reason: Mapped[str | None] = mapped_column(String(40))
    note: Mapped[str] = mapped_column(Text)
    actor: Mapped[str] = mapped_column(String(255))
    at: Mapped[datetime] = mapped_column(UTCDateTime())


class LateLine(Base):
    """What a person did about a short line's missing units (late usage as one amount: Stripe
    has those events, so they are never sent again): written off with a reason. One row per
    line (migration 0027)."""

    __tablename__ = "late_lines"

    invoice_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    subscription_item_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    action: Mapped[str] = mapped_column(String(20))
    #: The units handled (the line's shortfall when it was handled), a decimal string.
    units: Mapped[str] = mapped_column(String(40))
    reason: Mapped[str | None] = mapped_column(String(40))
    note: Mapped[str] = mapped_column(Text)
    actor: Mapped[str] = mapped_column(String(255))
    at: Mapped[datetime] = mapped_column(UTCDateTime())


class LineEvent(Base):
    """An event the invoice-line judge found not plainly on its line (migration 0027, which
    replaced ``late_found``): ``late`` (no call that may have reached Stripe began before the
    invoice finalized) or ``uncertain`` (its calls straddle the finalization), and, for an
    uncertain one, how the line settled it (``billed``: the line holds it; ``late``: the line
    holds exactly the rest). Kept for sent events and uncertain unsent ones; an unsent event
    with no call before the finalization is late without a row (``webapp.outbox.late``)."""

    __tablename__ = "invoice_line_events"

    event_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    #: An event of a customer billed twice on one meter (two items) is on each line.
    invoice_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    subscription_item_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    place: Mapped[str] = mapped_column(String(20))
    settled: Mapped[str | None] = mapped_column(String(20))
    period_start: Mapped[datetime] = mapped_column(UTCDateTime())
    period_end: Mapped[datetime] = mapped_column(UTCDateTime())
    finalized_at: Mapped[datetime] = mapped_column(UTCDateTime())
    found_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        Index("ix_line_events_line", "invoice_id", "subscription_item_id"),
    )


class UnbilledUsage(Base):
    """An event Stripe took whose customer and meter had no invoice to land it on at the
    event's time (migration 0027): ``no_item`` (no metered item on the meter), ``paused``
    (the subscription was paused), ``ended`` (cancelled without a final invoice), ``trial``
    (usage in a trial is not billed). Found by ``webapp.outbox.unbilled``."""

    __tablename__ = "unbilled_usage"

    event_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    stripe_customer_id: Mapped[str] = mapped_column(String(255))
    meter: Mapped[str] = mapped_column(String(100))
    reason: Mapped[str] = mapped_column(String(20))
    subscription_id: Mapped[str | None] = mapped_column(String(255))
    found_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        Index("ix_unbilled_customer", "stripe_customer_id", "meter"),
    )


class BillingWatch(Base):
    """A figure the status line and the Overview show about billing periods, worked out by
    the maintenance services (not per page view): ``invoice_risk`` (usage unsent in the
    periods of drafts finalizing soon) and ``late`` (late usage not handled yet)."""

    __tablename__ = "billing_watch"

    name: Mapped[str] = mapped_column(String(30), primary_key=True)
    computed_at: Mapped[datetime] = mapped_column(UTCDateTime())
    customers: Mapped[int] = mapped_column(BigInteger)
    events: Mapped[int] = mapped_column(BigInteger)
    units: Mapped[int] = mapped_column(BigInteger)
    #: invoice_risk: when the soonest of those drafts finalizes.
    soonest_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
