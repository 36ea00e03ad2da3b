"""Prepared usage reports

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02 01:40:00

Usage over more than a month, for every tenant, is summed once when someone asks for it and
kept: ``usage_reports`` (one row per preparation: the period, the moment it is exact as of,
who asked, the period's totals) and ``usage_report_rows`` (its figures per tenant and meter,
with the tenant's name and customer then, and an index for each order the page sorts by,
largest first, tenants byte by byte). At 100,000 tenants
summing a year takes seconds; reading the kept rows takes milliseconds.
"""
import sqlalchemy as sa
from alembic import op

from webapp.models.base import UTCDateTime

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

STATUSES = ("sent", "pending", "retrying", "rejected", "dead", "cancelled", "resolved")
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
#: Tenants and meters compared byte by byte on PostgreSQL, as the usage table sorts them.
BYTEWISE = sa.String(length=100).with_variant(sa.String(length=100, collation="C"), "postgresql")
#: The figures a report's rows are read in order of, largest first.
SORTED = ("sent_units", "sent_events", "waiting_events", "dead_events")


def upgrade() -> None:
    op.create_table(
        "usage_reports",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("period_start", sa.String(length=10), nullable=False),
        sa.Column("period_end", sa.String(length=10), nullable=False),
        sa.Column("as_of", UTCDateTime(), nullable=False),
        sa.Column("rows", sa.Integer(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("prepared_by", sa.String(length=255), nullable=False),
        *[sa.Column(f"total_{s}_{w}", sa.BigInteger(), nullable=False)
          for s in STATUSES for w in ("events", "units")],
        sa.PrimaryKeyConstraint("id", name=op.f("pk_usage_reports")),
    )
    op.create_index("ix_usage_reports_period", "usage_reports",
                    ["period_start", "period_end", "as_of"])
    op.create_index("ix_usage_reports_as_of", "usage_reports", ["as_of"])
    op.create_table(
        "usage_report_rows",
        sa.Column("report_id", BIG_ID, nullable=False),
        sa.Column("tenant_id", BYTEWISE, nullable=False),
        sa.Column("meter", BYTEWISE, nullable=False),
        *[sa.Column(f"{s}_{w}", sa.BigInteger(), nullable=False)
          for s in STATUSES for w in ("events", "units")],
        sa.Column("waiting_events", sa.BigInteger(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("stripe_customer_id", sa.String(length=255), nullable=True),
        sa.ForeignKeyConstraint(["report_id"], ["usage_reports.id"], ondelete="CASCADE",
                                name=op.f("fk_usage_report_rows_report_id_usage_reports")),
        sa.PrimaryKeyConstraint("report_id", "tenant_id", "meter",
                                name=op.f("pk_usage_report_rows")),
    )
    for figure in SORTED:
        op.create_index(f"ix_usage_report_rows_{figure}", "usage_report_rows",
                        ["report_id", sa.text(f"{figure} DESC"), "tenant_id", "meter"])
    if op.get_bind().dialect.name == "postgresql":
        # A cache, rewritten every few minutes at many tenants: no write-ahead log (a crash
        # empties it, and the next request or the reporter prepares it again). The rows
        # first: a logged table cannot refer to an unlogged one.
        op.execute("ALTER TABLE usage_report_rows SET UNLOGGED")
        op.execute("ALTER TABLE usage_reports SET UNLOGGED")


def downgrade() -> None:
    for figure in SORTED:
        op.drop_index(f"ix_usage_report_rows_{figure}", table_name="usage_report_rows")
    op.drop_table("usage_report_rows")
    op.drop_index("ix_usage_reports_as_of", table_name="usage_reports")
    op.drop_index("ix_usage_reports_period", table_name="usage_reports")
    op.drop_table("usage_reports")
