"""Stripe's figure per meter: what reconciliation compared, every customer of a day added up

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06 12:40:00

The Tenants & usage page shows, under each meter's total, Stripe's figure for the period over
every customer. It was summed from ``reconciled_days``/``reconciled_months`` at every view:
at 100,000 customers that is hundreds of thousands of rows a page. ``reconciled_meter_days``
keeps, per meter and UTC day, the compared customer-days added up (ours, Stripe's, how many,
the latest comparison), written in the transaction that keeps the days; filled here from the
days already kept.
"""
import sqlalchemy as sa
from alembic import op

from webapp.models.base import UTCDateTime

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reconciled_meter_days",
        sa.Column("meter", sa.String(length=100), nullable=False),
        sa.Column("day", sa.String(length=10), nullable=False),
        sa.Column("ours", sa.BigInteger(), nullable=False),
        sa.Column("stripe", sa.Float(), nullable=False),
        sa.Column("customer_days", sa.Integer(), nullable=False),
        sa.Column("compared_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("meter", "day", name=op.f("pk_reconciled_meter_days")),
    )
    op.execute("INSERT INTO reconciled_meter_days (meter, day, ours, stripe, customer_days, "
               "compared_at) SELECT meter, day, sum(ours), sum(stripe), count(*), "
               "max(compared_at) FROM reconciled_days GROUP BY meter, day")


def downgrade() -> None:
    op.drop_table("reconciled_meter_days")
