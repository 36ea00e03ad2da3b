"""Billing periods: Stripe's metered subscription items and invoices, the claim's invoice-first part, late usage

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06 19:30:00

Stripe bills a metered period on the invoice it drafts at the period's end and fixes the line
when the draft finalizes; usage sent later is counted by the meter but is on no invoice.

- ``stripe_subscription_items``: the metered items of every subscription, with the item's
  current period; ``stripe_invoices``: the invoices of those subscriptions (draft until
  ``finalizes_at``, then ``finalized_at``); ``stripe_invoice_periods``: their metered lines'
  periods. Read from Stripe by the billing refresher.
- ``stripe_usage_outbox.invoice_finalizes_at``: while an event's period is on a draft invoice,
  when that invoice finalizes; ``ix_outbox_invoice_first`` holds those events only, so the
  claim takes them first at the cost of an empty index scan when there are none. A nullable
  column without a default: adding it rewrites nothing on PostgreSQL.
- ``late_found``: sent events found to have reached Stripe after their invoice was final
  (found by scanning what was sent since the last scan); ``late_usage``: what a person did
  about an event that came too late for its invoice (billed on the next invoice under a new
  event, or written off), one row per event;
  ``billing_watch``: the figures the status line shows about them, worked out off the page.
"""
import sqlalchemy as sa
from alembic import op

from webapp.models.base import UTCDateTime

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

INVOICE_FIRST = "status IN ('pending', 'retrying') AND invoice_finalizes_at IS NOT NULL"


def upgrade() -> None:
    op.create_table(
        "stripe_subscription_items",
        sa.Column("id", sa.String(length=255), nullable=False),
        sa.Column("subscription_id", sa.String(length=255), nullable=False),
        sa.Column("stripe_customer_id", sa.String(length=255), nullable=False),
        sa.Column("subscription_status", sa.String(length=30), nullable=False),
        sa.Column("meter_id", sa.String(length=255), nullable=False),
        sa.Column("meter", sa.String(length=100), nullable=True),
        sa.Column("price_id", sa.String(length=255), nullable=True),
        sa.Column("current_period_start", UTCDateTime(), nullable=False),
        sa.Column("current_period_end", UTCDateTime(), nullable=False),
        sa.Column("seen_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stripe_subscription_items")),
    )
    op.create_index("ix_subscription_items_customer", "stripe_subscription_items",
                    ["stripe_customer_id", "meter"])
    op.create_index("ix_subscription_items_period_end", "stripe_subscription_items",
                    ["current_period_end"])
    op.create_table(
        "stripe_invoices",
        sa.Column("id", sa.String(length=255), nullable=False),
        sa.Column("stripe_customer_id", sa.String(length=255), nullable=False),
        sa.Column("subscription_id", sa.String(length=255), nullable=True),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("created", UTCDateTime(), nullable=False),
        sa.Column("finalizes_at", UTCDateTime(), nullable=True),
        sa.Column("finalized_at", UTCDateTime(), nullable=True),
        sa.Column("seen_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stripe_invoices")),
    )
    op.create_index("ix_invoices_draft", "stripe_invoices", ["finalizes_at"],
                    postgresql_where=sa.text("status = 'draft'"),
                    sqlite_where=sa.text("status = 'draft'"))
    op.create_index("ix_invoices_finalized", "stripe_invoices", ["finalized_at"],
                    postgresql_where=sa.text("finalized_at IS NOT NULL"),
                    sqlite_where=sa.text("finalized_at IS NOT NULL"))
    op.create_table(
        "stripe_invoice_periods",
        sa.Column("invoice_id", sa.String(length=255), nullable=False),
        sa.Column("subscription_item_id", sa.String(length=255), nullable=False),
        sa.Column("stripe_customer_id", sa.String(length=255), nullable=False),
        sa.Column("meter", sa.String(length=100), nullable=True),
        sa.Column("period_start", UTCDateTime(), nullable=False),
        sa.Column("period_end", UTCDateTime(), nullable=False),
        sa.Column("quantity", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("invoice_id", "subscription_item_id",
                                name=op.f("pk_stripe_invoice_periods")),
    )
    op.create_index("ix_invoice_periods_customer", "stripe_invoice_periods",
                    ["stripe_customer_id", "period_end"])
    op.create_table(
        "late_usage",
        sa.Column("event_id", sa.BigInteger(), nullable=False),
        sa.Column("action", sa.String(length=20), nullable=False),
        sa.Column("invoice_id", sa.String(length=255), nullable=False),
        sa.Column("new_event_id", sa.BigInteger(), nullable=True),
        sa.Column("reason", sa.String(length=40), nullable=True),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("actor", sa.String(length=255), nullable=False),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_late_usage")),
    )
    op.create_index(op.f("ix_late_usage_new_event_id"), "late_usage", ["new_event_id"])
    op.create_table(
        "late_found",
        sa.Column("event_id", sa.BigInteger(), nullable=False),
        sa.Column("invoice_id", sa.String(length=255), nullable=False),
        sa.Column("period_start", UTCDateTime(), nullable=False),
        sa.Column("period_end", UTCDateTime(), nullable=False),
        sa.Column("finalized_at", UTCDateTime(), nullable=False),
        sa.Column("found_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_late_found")),
    )
    op.create_table(
        "billing_watch",
        sa.Column("name", sa.String(length=30), nullable=False),
        sa.Column("computed_at", UTCDateTime(), nullable=False),
        sa.Column("customers", sa.BigInteger(), nullable=False),
        sa.Column("events", sa.BigInteger(), nullable=False),
        sa.Column("units", sa.BigInteger(), nullable=False),
        sa.Column("soonest_at", UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_billing_watch")),
    )
    op.add_column("stripe_usage_outbox",
                  sa.Column("invoice_finalizes_at", UTCDateTime(), nullable=True))
    op.create_index("ix_outbox_invoice_first", "stripe_usage_outbox",
                    ["invoice_finalizes_at", "next_attempt_at", "id"],
                    postgresql_where=sa.text(INVOICE_FIRST), sqlite_where=sa.text(INVOICE_FIRST))


def downgrade() -> None:
    op.drop_index("ix_outbox_invoice_first", table_name="stripe_usage_outbox")
    with op.batch_alter_table("stripe_usage_outbox") as batch:
        batch.drop_column("invoice_finalizes_at")
    op.drop_table("billing_watch")
    op.drop_table("late_found")
    op.drop_table("late_usage")
    op.drop_table("stripe_invoice_periods")
    op.drop_table("stripe_invoices")
    op.drop_table("stripe_subscription_items")
