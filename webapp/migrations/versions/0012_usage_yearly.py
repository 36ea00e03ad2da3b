"""Usage by year: the sent-usage rollup once more, per UTC year of occurrence

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01 20:00:00

``usage_sent_yearly`` holds the sent-usage rollup per UTC year of occurrence, tenant and
meter, written in the same transactions as the daily and monthly ones. Usage for a long
period reads a year's row less the few months outside the period, instead of twelve months'
rows: for 100,000 tenants, about 200,000 rows instead of 2.5 million. It starts as the sum of
the monthly rollup.
"""
import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "usage_sent_yearly",
        sa.Column("year", sa.String(length=4), nullable=False),
        sa.Column("tenant_id", sa.String(length=100), nullable=False),
        sa.Column("meter", sa.String(length=100), nullable=False),
        sa.Column("events", sa.BigInteger(), nullable=False),
        sa.Column("quantity", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("year", "tenant_id", "meter",
                                name=op.f("pk_usage_sent_yearly")),
    )
    op.execute(sa.text(
        "INSERT INTO usage_sent_yearly (year, tenant_id, meter, events, quantity) "
        "SELECT substr(month, 1, 4), tenant_id, meter, sum(events), sum(quantity) "
        "FROM usage_sent_monthly GROUP BY substr(month, 1, 4), tenant_id, meter"))


def downgrade() -> None:
    op.drop_table("usage_sent_yearly")
