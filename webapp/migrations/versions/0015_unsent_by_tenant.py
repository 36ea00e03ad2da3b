"""One tenant's unsent events: ``ix_outbox_unsent_tenant``

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02 02:00:00

A tenant's page reads the tenant's unsent events over its period (its usage) and counts those
waiting to be sent. ``ix_outbox_unsent`` leads with (status, occurred_at), so for one tenant
both walked every unsent event of every tenant and kept its few: at 10 million rows, 400 days
of the largest tenant read 330,000 index entries (and a heap page for each not all-visible)
to keep 6,900, and the waiting count read a heap page per waiting event. This index holds the
same rows (neither sent nor in flight) by (tenant_id, status, occurred_at), covering the
meter and quantity: both reads take the tenant's own entries only.

It costs what ``ix_outbox_unsent`` costs, at the same writes: an entry when an event is
enqueued (pending) and when an outcome makes it retrying, dead or rejected (and a requeue,
resolve or cancel); a claim (to processing) and a send (to sent) write none. Built in the
migration's transaction (as 0009's and 0011's): one read of the table, about 10 seconds at
10 million rows.
"""
from alembic import op
from sqlalchemy import text

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

WHERE = "status NOT IN ('sent', 'processing')"


def upgrade() -> None:
    with op.batch_alter_table("stripe_usage_outbox") as batch_op:
        batch_op.create_index("ix_outbox_unsent_tenant", ["tenant_id", "status", "occurred_at"],
                              unique=False, postgresql_include=["meter", "quantity"],
                              postgresql_where=text(WHERE), sqlite_where=text(WHERE))


def downgrade() -> None:
    with op.batch_alter_table("stripe_usage_outbox") as batch_op:
        batch_op.drop_index("ix_outbox_unsent_tenant")
