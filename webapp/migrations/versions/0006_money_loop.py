"""Closing the loop with Stripe after its 200: rejected and cancelled events, Stripe's meters,
its error reports, and reconciliation runs

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 09:00:00

Two statuses join the outbox: ``rejected`` (Stripe accepted the call, then reported the event
invalid) and ``cancelled`` (a meter event adjustment). ``ix_outbox_waiting_created`` names the
statuses it leaves out, so it is rebuilt to leave these two out as well. Events carry the
identifier Stripe knows them by once a rejected one is requeued under a new one, what Stripe
reported, and who cancelled them and why.
"""
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy import text

from webapp.models.base import UTCDateTime

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

WAITING_BEFORE = "status NOT IN ('sent', 'processing', 'dead', 'resolved')"
WAITING_AFTER = ("status NOT IN ('sent', 'processing', 'dead', 'resolved', 'rejected', "
                 "'cancelled')")

def _new_columns() -> list[sa.Column[Any]]:
    return [
    sa.Column("stripe_identifier", sa.String(length=100), nullable=True),
    sa.Column("identifier_generation", sa.Integer(), nullable=False, server_default=text("0")),
    sa.Column("rejected_at", UTCDateTime(), nullable=True),
    sa.Column("reject_code", sa.String(length=100), nullable=True),
    sa.Column("reject_message", sa.Text(), nullable=True),
    sa.Column("reject_event_id", sa.String(length=255), nullable=True),
    sa.Column("cancelled_at", UTCDateTime(), nullable=True),
    sa.Column("cancelled_by", sa.String(length=255), nullable=True),
    sa.Column("cancel_reason", sa.String(length=40), nullable=True),
    sa.Column("cancel_note", sa.Text(), nullable=True),
    ]


def _waiting_index(predicate: str) -> None:
    where = text(predicate)
    with op.batch_alter_table("stripe_usage_outbox") as batch_op:
        batch_op.drop_index("ix_outbox_waiting_created")
        batch_op.create_index("ix_outbox_waiting_created", ["created_at"], unique=False,
                              postgresql_where=where, sqlite_where=where)


def upgrade() -> None:
    with op.batch_alter_table("stripe_usage_outbox") as batch_op:
        for column in _new_columns():
            batch_op.add_column(column)
    rejected = text("status = 'rejected'")
    named = text("stripe_identifier IS NOT NULL")
    with op.batch_alter_table("stripe_usage_outbox") as batch_op:
        batch_op.create_index("ix_outbox_rejected", ["rejected_at", "id"], unique=False,
                              postgresql_where=rejected, sqlite_where=rejected)
        batch_op.create_index("ix_outbox_stripe_identifier", ["stripe_identifier"], unique=True,
                              postgresql_where=named, sqlite_where=named)
    _waiting_index(WAITING_AFTER)

    op.create_table(
        "stripe_meters",
        sa.Column("event_name", sa.String(length=100), nullable=False),
        sa.Column("meter_id", sa.String(length=255), nullable=True),
        sa.Column("display_name", sa.String(length=255), nullable=True),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("customer_key", sa.String(length=100), nullable=False),
        sa.Column("value_key", sa.String(length=100), nullable=False),
        sa.Column("formula", sa.String(length=20), nullable=False),
        sa.Column("seen_at", UTCDateTime(), nullable=True),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("event_name", name=op.f("pk_stripe_meters")),
    )
    op.create_table(
        "stripe_sync_state",
        sa.Column("name", sa.String(length=50), nullable=False),
        sa.Column("ran_at", UTCDateTime(), nullable=True),
        sa.Column("ok", sa.Boolean(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("locked_until", UTCDateTime(), nullable=True),
        sa.Column("locked_by", sa.String(length=200), nullable=True),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_stripe_sync_state")),
    )
    op.create_table(
        "stripe_events",
        sa.Column("id", sa.String(length=255), nullable=False),
        sa.Column("type", sa.String(length=100), nullable=False),
        sa.Column("created", UTCDateTime(), nullable=False),
        sa.Column("meter_id", sa.String(length=255), nullable=True),
        sa.Column("source", sa.String(length=20), nullable=False),
        sa.Column("stored_at", UTCDateTime(), nullable=False),
        sa.Column("error_count", sa.Integer(), nullable=False),
        sa.Column("sample_count", sa.Integer(), nullable=False),
        sa.Column("rejected", sa.Integer(), nullable=False),
        sa.Column("unmatched", sa.Integer(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=True),
        sa.Column("body", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stripe_events")),
    )
    with op.batch_alter_table("stripe_events") as batch_op:
        batch_op.create_index(batch_op.f("ix_stripe_events_created"), ["created"], unique=False)
    op.create_table(
        "stripe_error_samples",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True,
                  nullable=False),
        sa.Column("stripe_event_id", sa.String(length=255), nullable=False),
        sa.Column("code", sa.String(length=100), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("identifier", sa.String(length=255), nullable=True),
        sa.Column("event_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  nullable=True),
        sa.Column("outcome", sa.String(length=20), nullable=False),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stripe_error_samples")),
    )
    waiting = text("outcome = 'waiting'")
    with op.batch_alter_table("stripe_error_samples") as batch_op:
        batch_op.create_index(batch_op.f("ix_stripe_error_samples_stripe_event_id"),
                              ["stripe_event_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_stripe_error_samples_event_id"), ["event_id"],
                              unique=False)
        batch_op.create_index("ix_samples_waiting", ["id"], unique=False,
                              postgresql_where=waiting, sqlite_where=waiting)
    op.create_table(
        "reconciliation_runs",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True,
                  nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=False),
        sa.Column("finished_at", UTCDateTime(), nullable=True),
        sa.Column("since", UTCDateTime(), nullable=False),
        sa.Column("until", UTCDateTime(), nullable=False),
        sa.Column("tenant_id", sa.String(length=100), nullable=True),
        sa.Column("trigger", sa.String(length=20), nullable=False),
        sa.Column("actor", sa.String(length=255), nullable=True),
        sa.Column("buckets_checked", sa.Integer(), nullable=False),
        sa.Column("pending", sa.Integer(), nullable=False),
        sa.Column("mismatches", sa.Integer(), nullable=False),
        sa.Column("calls", sa.Integer(), nullable=False),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("errors", sa.Text(), nullable=True),
        sa.Column("notes", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_reconciliation_runs")),
    )
    with op.batch_alter_table("reconciliation_runs") as batch_op:
        batch_op.create_index(batch_op.f("ix_reconciliation_runs_started_at"), ["started_at"],
                              unique=False)
    op.create_table(
        "reconciliation_mismatches",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True,
                  nullable=False),
        sa.Column("run_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  nullable=False),
        sa.Column("tenant_id", sa.String(length=400), nullable=False),
        sa.Column("stripe_customer_id", sa.String(length=255), nullable=False),
        sa.Column("meter", sa.String(length=100), nullable=False),
        sa.Column("formula", sa.String(length=20), nullable=False),
        sa.Column("start", UTCDateTime(), nullable=False),
        sa.Column("end", UTCDateTime(), nullable=False),
        sa.Column("local_units", sa.BigInteger(), nullable=False),
        sa.Column("stripe_units", sa.Float(), nullable=False),
        sa.Column("difference", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["reconciliation_runs.id"],
                                name=op.f("fk_reconciliation_mismatches_run_id_reconciliation_runs"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_reconciliation_mismatches")),
    )
    with op.batch_alter_table("reconciliation_mismatches") as batch_op:
        batch_op.create_index(batch_op.f("ix_reconciliation_mismatches_run_id"), ["run_id"],
                              unique=False)


def downgrade() -> None:
    for table in ("reconciliation_mismatches", "reconciliation_runs", "stripe_error_samples",
                  "stripe_events", "stripe_sync_state", "stripe_meters"):
        op.drop_table(table)
    _waiting_index(WAITING_BEFORE)
    with op.batch_alter_table("stripe_usage_outbox") as batch_op:
        batch_op.drop_index("ix_outbox_stripe_identifier")
        batch_op.drop_index("ix_outbox_rejected")
        for column in reversed(_new_columns()):
            batch_op.drop_column(column.name)
