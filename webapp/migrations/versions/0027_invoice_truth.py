"""Invoice truth: the finalized invoice line is the judge of what was billed

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-07 20:00:00

A meter event Stripe accepted is counted, not billed: what bills is the metered line of a
finalized invoice. The outbox compares each finalized line with its own figure for the line's
customer, meter and period, and finds the usage that lands on no invoice.

- ``stripe_subscriptions``: the subscriptions with metered items, with what decides whether
  their usage is invoiced (trial, pause, end).
- ``stripe_invoices``: ``billing_reason`` and ``currency``.
- ``stripe_invoice_periods`` (one metered line): Stripe's exact quantity and the line's
  amount, the invoice's finalization, and the judge's figures and verdict; indexes for the
  Invoices page.
- ``invoice_line_events`` replaces ``late_found``: the events a line's judge found late or
  uncertain. ``late_found`` was filled by the send time alone, which calls late an event
  Stripe took before the finalization whose answer came after: it is dropped, and every
  finalized line is judged again from the attempts at the first pass after the upgrade.
- ``late_lines``: what a person did about a short line's missing units (written off).
- ``unbilled_usage``: events Stripe took that no invoice will carry, with why.
- ``ix_outbox_sent_customer``: a customer's sent events on a meter by time, written once per
  event by the send that makes it ``sent`` (none by an enqueue).
"""
import sqlalchemy as sa
from alembic import op

from webapp.models.base import UTCDateTime

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

FINALIZED = "finalized_at IS NOT NULL"
SENT = "status = 'sent'"
#: The line's new columns: (name, type), all nullable.
_LINE_COLUMNS = (
    ("subscription_id", sa.String(length=255)),
    ("quantity_decimal", sa.String(length=40)),
    ("amount", sa.BigInteger()),
    ("finalized_at", UTCDateTime()),
    ("verdict", sa.String(length=20)),
    ("formula", sa.String(length=10)),
    ("ours", sa.BigInteger()),
    ("ours_events", sa.BigInteger()),
    ("late", sa.BigInteger()),
    ("late_events", sa.BigInteger()),
    ("uncertain", sa.BigInteger()),
    ("uncertain_events", sa.BigInteger()),
    ("difference", sa.String(length=40)),
    ("judged_at", UTCDateTime()),
)


def upgrade() -> None:
    op.create_table(
        "stripe_subscriptions",
        sa.Column("id", sa.String(length=255), nullable=False),
        sa.Column("stripe_customer_id", sa.String(length=255), nullable=False),
        sa.Column("status", sa.String(length=30), nullable=False),
        sa.Column("created", UTCDateTime(), nullable=True),
        sa.Column("start_date", UTCDateTime(), nullable=True),
        sa.Column("trial_start", UTCDateTime(), nullable=True),
        sa.Column("trial_end", UTCDateTime(), nullable=True),
        sa.Column("ended_at", UTCDateTime(), nullable=True),
        sa.Column("canceled_at", UTCDateTime(), nullable=True),
        sa.Column("pause_collection", sa.String(length=30), nullable=True),
        sa.Column("paused_at", UTCDateTime(), nullable=True),
        sa.Column("resumed_at", UTCDateTime(), nullable=True),
        sa.Column("seen_at", UTCDateTime(), nullable=False),
        sa.Column("changed_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stripe_subscriptions")),
    )
    op.create_index("ix_subscriptions_customer", "stripe_subscriptions",
                    ["stripe_customer_id"])
    op.create_index("ix_subscriptions_changed", "stripe_subscriptions", ["changed_at"])
    with op.batch_alter_table("stripe_invoices") as batch:
        batch.add_column(sa.Column("billing_reason", sa.String(length=40), nullable=True))
        batch.add_column(sa.Column("currency", sa.String(length=3), nullable=True))
    with op.batch_alter_table("stripe_invoice_periods") as batch:
        for name, type_ in _LINE_COLUMNS:
            batch.add_column(sa.Column(name, type_, nullable=True))
    # Lines kept before the upgrade: their invoice's finalization, so they are judged.
    op.execute("UPDATE stripe_invoice_periods SET finalized_at = (SELECT i.finalized_at "
               "FROM stripe_invoices AS i WHERE i.id = stripe_invoice_periods.invoice_id)")
    op.create_index("ix_invoice_periods_finalized", "stripe_invoice_periods",
                    ["finalized_at", "verdict"],
                    postgresql_where=sa.text(FINALIZED), sqlite_where=sa.text(FINALIZED))
    op.create_index("ix_invoice_periods_verdict", "stripe_invoice_periods",
                    ["verdict", "finalized_at"],
                    postgresql_where=sa.text(FINALIZED), sqlite_where=sa.text(FINALIZED))
    op.drop_table("late_found")
    op.create_table(
        "invoice_line_events",
        sa.Column("event_id", sa.BigInteger(), nullable=False),
        sa.Column("invoice_id", sa.String(length=255), nullable=False),
        sa.Column("subscription_item_id", sa.String(length=255), nullable=False),
        sa.Column("place", sa.String(length=20), nullable=False),
        sa.Column("settled", sa.String(length=20), nullable=True),
        sa.Column("period_start", UTCDateTime(), nullable=False),
        sa.Column("period_end", UTCDateTime(), nullable=False),
        sa.Column("finalized_at", UTCDateTime(), nullable=False),
        sa.Column("found_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("event_id", "invoice_id", "subscription_item_id",
                                name=op.f("pk_invoice_line_events")),
    )
    op.create_index("ix_line_events_line", "invoice_line_events",
                    ["invoice_id", "subscription_item_id"])
    op.create_table(
        "late_lines",
        sa.Column("invoice_id", sa.String(length=255), nullable=False),
        sa.Column("subscription_item_id", sa.String(length=255), nullable=False),
        sa.Column("action", sa.String(length=20), nullable=False),
        sa.Column("units", sa.String(length=40), nullable=False),
        sa.Column("reason", sa.String(length=40), nullable=True),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("actor", sa.String(length=255), nullable=False),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("invoice_id", "subscription_item_id",
                                name=op.f("pk_late_lines")),
    )
    op.create_table(
        "unbilled_usage",
        sa.Column("event_id", sa.BigInteger(), nullable=False),
        sa.Column("stripe_customer_id", sa.String(length=255), nullable=False),
        sa.Column("meter", sa.String(length=100), nullable=False),
        sa.Column("reason", sa.String(length=20), nullable=False),
        sa.Column("subscription_id", sa.String(length=255), nullable=True),
        sa.Column("found_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_unbilled_usage")),
    )
    op.create_index("ix_unbilled_customer", "unbilled_usage", ["stripe_customer_id", "meter"])
    op.create_index("ix_outbox_sent_customer", "stripe_usage_outbox",
                    ["stripe_customer_id", "meter", "occurred_at"],
                    postgresql_where=sa.text(SENT), sqlite_where=sa.text(SENT))
    # The scan mark of the rule this replaces: the judge starts from every finalized line.
    op.execute("DELETE FROM stripe_sync_state WHERE name = 'billing-late'")


def downgrade() -> None:
    op.drop_index("ix_outbox_sent_customer", table_name="stripe_usage_outbox")
    op.drop_table("unbilled_usage")
    op.drop_table("late_lines")
    op.drop_table("invoice_line_events")
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
    op.drop_index("ix_invoice_periods_verdict", table_name="stripe_invoice_periods")
    op.drop_index("ix_invoice_periods_finalized", table_name="stripe_invoice_periods")
    with op.batch_alter_table("stripe_invoice_periods") as batch:
        for name, _ in reversed(_LINE_COLUMNS):
            batch.drop_column(name)
    with op.batch_alter_table("stripe_invoices") as batch:
        batch.drop_column("currency")
        batch.drop_column("billing_reason")
    op.drop_index("ix_subscriptions_changed", table_name="stripe_subscriptions")
    op.drop_index("ix_subscriptions_customer", table_name="stripe_subscriptions")
    op.drop_table("stripe_subscriptions")
