"""Usage history: the counts of pruned events, so usage for any period outlives its rows

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 18:00:00

``billing-outbox prune`` deletes terminal rows (sent, resolved, cancelled) past
``OUTBOX_RETENTION_DAYS``. In the transaction that deletes them it adds what they counted to
``usage_pruned_rollup``: events and units per UTC day of occurrence, tenant, meter and status.
Usage for any period then reads the live rows plus this table (sent events also stay in the
sent rollup they were folded into), and gives the same totals before and after a prune.
A ``pruned`` row in ``rollup_state`` keeps the running totals and when the last prune ran.

``usage_sent_monthly`` holds the sent-usage rollup again per UTC month of occurrence, written
with the daily one: a year of usage for 100,000 tenants reads twelve rows per tenant and meter,
not 365. It starts as the sum of the daily rollup. ``usage_sent_day`` is the same per day for
every tenant together (the Overview's chart); both tables' tenant indexes serve one tenant's
page among 100,000.
"""
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

from webapp.models.base import UTCDateTime

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "usage_pruned_rollup",
        sa.Column("day", sa.String(length=10), nullable=False),
        sa.Column("tenant_id", sa.String(length=100), nullable=False),
        sa.Column("meter", sa.String(length=100), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("events", sa.BigInteger(), nullable=False),
        sa.Column("quantity", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("day", "tenant_id", "meter", "status",
                                name=op.f("pk_usage_pruned_rollup")),
    )
    op.create_table(
        "usage_sent_monthly",
        sa.Column("month", sa.String(length=7), nullable=False),
        sa.Column("tenant_id", sa.String(length=100), nullable=False),
        sa.Column("meter", sa.String(length=100), nullable=False),
        sa.Column("events", sa.BigInteger(), nullable=False),
        sa.Column("quantity", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("month", "tenant_id", "meter",
                                name=op.f("pk_usage_sent_monthly")),
    )
    op.execute(sa.text(
        "INSERT INTO usage_sent_monthly (month, tenant_id, meter, events, quantity) "
        "SELECT substr(day, 1, 7), tenant_id, meter, sum(events), sum(quantity) "
        "FROM usage_sent_rollup GROUP BY substr(day, 1, 7), tenant_id, meter"))
    op.create_table(
        "usage_sent_day",
        sa.Column("day", sa.String(length=10), nullable=False),
        sa.Column("events", sa.BigInteger(), nullable=False),
        sa.Column("quantity", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("day", name=op.f("pk_usage_sent_day")),
    )
    op.execute(sa.text(
        "INSERT INTO usage_sent_day (day, events, quantity) "
        "SELECT day, sum(events), sum(quantity) FROM usage_sent_rollup GROUP BY day"))
    op.create_index("ix_usage_sent_monthly_tenant", "usage_sent_monthly", ["tenant_id", "month"])
    op.create_index("ix_usage_sent_rollup_tenant", "usage_sent_rollup", ["tenant_id", "day"])
    state = sa.table("rollup_state", sa.column("name", sa.String),
                     sa.column("watermark", UTCDateTime()), sa.column("id_mark", sa.BigInteger),
                     sa.column("events", sa.BigInteger), sa.column("quantity", sa.BigInteger))
    op.bulk_insert(state, [{"name": "pruned", "watermark": datetime(1970, 1, 1, tzinfo=UTC),
                            "id_mark": 0, "events": 0, "quantity": 0}])


def downgrade() -> None:
    op.execute(sa.text("DELETE FROM rollup_state WHERE name = 'pruned'"))
    op.drop_table("usage_pruned_rollup")
    op.drop_index("ix_usage_sent_rollup_tenant", table_name="usage_sent_rollup")
    op.drop_table("usage_sent_day")
    op.drop_table("usage_sent_monthly")
