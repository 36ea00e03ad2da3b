"""Drainer heartbeats: what each running drainer last said about itself

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 15:00:00

The circuit breaker lives in each drainer's memory; the dashboard's status line must say when
Stripe is being held off ("Holding since …, next probe at …") and when nothing has gone out
for a while. Each worker and the in-app drainer upsert one row every few seconds; a row not
refreshed for a minute is a process that is gone.
"""
import sqlalchemy as sa
from alembic import op

from webapp.models.base import UTCDateTime

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "drainer_heartbeats",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=False),
        sa.Column("seen_at", UTCDateTime(), nullable=False),
        sa.Column("can_send", sa.Boolean(), nullable=False),
        sa.Column("breaker", sa.String(length=20), nullable=False),
        sa.Column("holding_since", UTCDateTime(), nullable=True),
        sa.Column("next_probe_at", UTCDateTime(), nullable=True),
        sa.Column("last_failure", sa.String(length=200), nullable=True),
        sa.Column("last_sent_at", UTCDateTime(), nullable=True),
        sa.Column("sent_total", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_drainer_heartbeats")),
    )
    op.create_index(op.f("ix_drainer_heartbeats_seen_at"), "drainer_heartbeats", ["seen_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_drainer_heartbeats_seen_at"), table_name="drainer_heartbeats")
    op.drop_table("drainer_heartbeats")
