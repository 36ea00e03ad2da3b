"""Producers in any language: billing_outbox_enqueue(...) on PostgreSQL, and outbox_settings

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-07 03:00:00

- ``outbox_settings``: values the running project records for producers outside it; today
  ``default_meter``, the meter ``billing_outbox_enqueue`` uses when a caller names none.
- On PostgreSQL, ``billing_outbox_enqueue(p_tenant_id, p_quantity, p_idempotency_key,
  p_meter, p_occurred_at)`` and its helper ``billing_outbox_text_problem``, in the outbox's
  schema (``webapp.outbox.sql_enqueue``): ``enqueue_usage``'s rules inside the caller's own
  transaction. SQLite has no functions of this kind: producers there use the documented
  ``INSERT``.
"""
import sqlalchemy as sa
from alembic import op

from webapp.models.base import UTCDateTime
from webapp.outbox import sql_enqueue

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "outbox_settings",
        sa.Column("name", sa.String(length=50), nullable=False),
        sa.Column("value", sa.String(length=200), nullable=False),
        sa.Column("recorded_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_outbox_settings")),
    )
    sql_enqueue.install(op.get_bind(), with_source=False)


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        for statement in sql_enqueue.drop_statements():
            bind.exec_driver_sql(statement)
    op.drop_table("outbox_settings")
