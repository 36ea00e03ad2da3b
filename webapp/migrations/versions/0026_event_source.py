"""Where each event came from: stripe_usage_outbox.source

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-07 03:30:00

- ``source``: ``sql`` (``billing_outbox_enqueue``), ``http:<token name>`` (the ingest API);
  NULL for ``enqueue_usage`` in Python (nothing more written on the request path). A nullable
  column without a default: adding it rewrites nothing on PostgreSQL.
- ``ix_outbox_source``: the events list's source filter, over the non-NULL ones only, so
  ``enqueue_usage``'s inserts never touch it.
- ``billing_outbox_enqueue`` replaced to write ``source = 'sql'``.
"""
import sqlalchemy as sa
from alembic import op

from webapp.outbox import sql_enqueue

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("stripe_usage_outbox") as batch:
        batch.add_column(sa.Column("source", sa.String(length=120), nullable=True))
    op.create_index("ix_outbox_source", "stripe_usage_outbox", ["source", "id"],
                    postgresql_where=sa.text("source IS NOT NULL"),
                    sqlite_where=sa.text("source IS NOT NULL"))
    sql_enqueue.install(op.get_bind(), with_source=True)


def downgrade() -> None:
    sql_enqueue.install(op.get_bind(), with_source=False)
    op.drop_index("ix_outbox_source", table_name="stripe_usage_outbox")
    with op.batch_alter_table("stripe_usage_outbox") as batch:
        batch.drop_column("source")
