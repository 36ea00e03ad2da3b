"""Notifications: each alert kind's state, and each message to each channel

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-07 02:00:00

- ``notify_alerts``: one row per alert kind, as the notifier last saw it (``ok`` or
  ``firing``, since when, when it was last announced). A change of state is written with the
  row's ``version`` compared and raised, in the transaction that queues its messages, so a
  change is announced once however many processes watch it.
- ``notify_deliveries``: one row per message per channel (Slack, the webhook, email), with
  its own retries; ``ix_notify_deliveries_pending`` holds the unsent ones only.
"""
import sqlalchemy as sa
from alembic import op

from webapp.models.base import UTCDateTime

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "notify_alerts",
        sa.Column("kind", sa.String(length=40), nullable=False),
        sa.Column("state", sa.String(length=10), server_default="ok", nullable=False),
        sa.Column("version", sa.Integer(), server_default="0", nullable=False),
        sa.Column("severity", sa.String(length=10), nullable=True),
        sa.Column("title", sa.String(length=300), nullable=True),
        sa.Column("text", sa.Text(), nullable=True),
        sa.Column("count", sa.BigInteger(), nullable=True),
        sa.Column("path", sa.String(length=1000), nullable=True),
        sa.Column("started_at", UTCDateTime(), nullable=True),
        sa.Column("last_sent_at", UTCDateTime(), nullable=True),
        sa.Column("clear_since", UTCDateTime(), nullable=True),
        sa.Column("updated_at", UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("kind", name=op.f("pk_notify_alerts")),
    )
    op.create_table(
        "notify_deliveries",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  autoincrement=True, nullable=False),
        sa.Column("message_id", sa.String(length=40), nullable=False),
        sa.Column("kind", sa.String(length=40), nullable=False),
        sa.Column("event", sa.String(length=10), nullable=False),
        sa.Column("channel", sa.String(length=10), nullable=False),
        sa.Column("status", sa.String(length=10), server_default="pending", nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("next_attempt_at", UTCDateTime(), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("last_error", sa.String(length=500), nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("sent_at", UTCDateTime(), nullable=True),
        sa.Column("claimed_until", UTCDateTime(), nullable=True),
        sa.Column("claimed_by", sa.String(length=255), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_notify_deliveries")),
    )
    op.create_index("ix_notify_deliveries_pending", "notify_deliveries", ["channel", "id"],
                    postgresql_where=sa.text("status = 'pending'"),
                    sqlite_where=sa.text("status = 'pending'"))
    op.create_index("ix_notify_deliveries_created", "notify_deliveries", ["created_at"])


def downgrade() -> None:
    op.drop_table("notify_deliveries")
    op.drop_table("notify_alerts")
