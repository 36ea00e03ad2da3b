"""Stripe's figure beside ours: what reconciliation compared, kept per day and month

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-03 19:30:00

Reconciliation kept only its mismatches, so a usage row could not say what Stripe holds, nor
whether anything was compared at all. ``reconciled_days`` keeps, per Stripe customer, meter
and whole UTC day compared, ours and Stripe's figure (the latest comparison replaces the one
before); ``reconciled_months`` adds each month's compared days up, written with them, so a
month of every customer reads one row per customer and meter.
"""
import sqlalchemy as sa
from alembic import op

from webapp.models.base import UTCDateTime

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reconciled_days",
        sa.Column("stripe_customer_id", sa.String(length=255), nullable=False),
        sa.Column("meter", sa.String(length=100), nullable=False),
        sa.Column("day", sa.String(length=10), nullable=False),
        sa.Column("formula", sa.String(length=20), nullable=False),
        sa.Column("ours", sa.BigInteger(), nullable=False),
        sa.Column("stripe", sa.Float(), nullable=False),
        sa.Column("compared_at", UTCDateTime(), nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("stripe_customer_id", "meter", "day",
                                name=op.f("pk_reconciled_days")),
    )
    op.create_index("ix_reconciled_days_day", "reconciled_days", ["day"])
    op.create_table(
        "reconciled_months",
        sa.Column("stripe_customer_id", sa.String(length=255), nullable=False),
        sa.Column("meter", sa.String(length=100), nullable=False),
        sa.Column("month", sa.String(length=7), nullable=False),
        sa.Column("ours", sa.BigInteger(), nullable=False),
        sa.Column("stripe", sa.Float(), nullable=False),
        sa.Column("days", sa.Integer(), nullable=False),
        sa.Column("compared_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("stripe_customer_id", "meter", "month",
                                name=op.f("pk_reconciled_months")),
    )


def downgrade() -> None:
    op.drop_table("reconciled_months")
    op.drop_index("ix_reconciled_days_day", table_name="reconciled_days")
    op.drop_table("reconciled_days")
