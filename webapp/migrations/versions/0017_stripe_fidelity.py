"""Stripe fidelity before live mode: stream request keys, pre-aggregated meters, cancel answers

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-03 16:30:00

- ``stripe_stream_requests``: every meter event stream request that may have reached Stripe,
  by the ``Idempotency-Key`` it carried, with the events in it. Stripe's error reports may name
  that key instead of an event's identifier; a request carries up to 100 events, so the key is
  traced to them here. One row per request, written with its events' outcomes.
- ``stripe_meters.event_time_window``: ``day`` or ``hour`` for a pre-aggregated meter, which
  keeps one value per customer and window (the last one sent); its events are held.
- ``stripe_usage_outbox.cancel_adjustment_id`` / ``cancel_adjustment_status``: what Stripe
  answered to a cancel (a meter event adjustment). Nullable columns without a default: on
  PostgreSQL adding them rewrites nothing.
"""
import sqlalchemy as sa
from alembic import op

from webapp.models.base import UTCDateTime

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "stripe_stream_requests",
        sa.Column("idempotency_key", sa.String(length=255), nullable=False),
        sa.Column("stripe_request_id", sa.String(length=255), nullable=True),
        sa.Column("sent_at", UTCDateTime(), nullable=False),
        sa.Column("event_ids", sa.Text(), nullable=False),
        sa.Column("events", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("idempotency_key", name=op.f("pk_stripe_stream_requests")),
    )
    op.create_index(op.f("ix_stripe_stream_requests_sent_at"), "stripe_stream_requests",
                    ["sent_at"])
    # Plain ADD COLUMN on both databases (SQLite takes a nullable column without a rebuild).
    op.add_column("stripe_meters",
                  sa.Column("event_time_window", sa.String(length=20), nullable=True))
    op.add_column("stripe_usage_outbox",
                  sa.Column("cancel_adjustment_id", sa.String(length=255), nullable=True))
    op.add_column("stripe_usage_outbox",
                  sa.Column("cancel_adjustment_status", sa.String(length=20), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("stripe_usage_outbox") as batch:
        batch.drop_column("cancel_adjustment_status")
        batch.drop_column("cancel_adjustment_id")
    with op.batch_alter_table("stripe_meters") as batch:
        batch.drop_column("event_time_window")
    op.drop_index(op.f("ix_stripe_stream_requests_sent_at"), table_name="stripe_stream_requests")
    op.drop_table("stripe_stream_requests")
