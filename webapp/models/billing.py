"""What the outbox keeps of Stripe's billing (migration 0022): the metered subscription items
with their current period, the invoices Stripe drafted and finalized for them with the
periods their metered lines bill, and what a person did about usage that came too late for
its invoice. Read from Stripe by the billing refresher
(``webapp.worker.invoices``); nothing here is read from Stripe per page view."""

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
    Stripe put on it when last read (fixed once the invoice is final)."""

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

    __table_args__ = (
        Index("ix_invoice_periods_customer", "stripe_customer_id", "period_end"),
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


class LateFound(Base):
    """A sent event found to have reached Stripe after its period's invoice was final: on no
    invoice. Found by scanning what was sent since the last scan (and since the invoices
    learned to be final), so listing late usage never walks every sent event."""

    __tablename__ = "late_found"

    event_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    invoice_id: Mapped[str] = mapped_column(String(255))
    period_start: Mapped[datetime] = mapped_column(UTCDateTime())
    period_end: Mapped[datetime] = mapped_column(UTCDateTime())
    finalized_at: Mapped[datetime] = mapped_column(UTCDateTime())
    found_at: Mapped[datetime] = mapped_column(UTCDateTime())


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
