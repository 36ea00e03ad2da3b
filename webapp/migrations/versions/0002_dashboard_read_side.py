"""dashboard read side: partial indexes and rollups for the pages

The pages must stay fast at a million rows, 95% of them sent. Everything not yet sent is
small and is read through partial indexes; sent rows are final, so they are folded into
small rollups once their ``sent_at`` stretch is closed (see ``webapp.queries``).

Partial-index predicates are literals on both dialects, and the queries repeat them
literally, so PostgreSQL can match them even in generic plans and SQLite can match them at all.

Revision ID: 0002
Revises: 0001
"""
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

import webapp.models

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None

UNSENT = "status <> 'sent'"
SENT = "status = 'sent'"
WAITING = "status IN ('pending', 'processing', 'retrying')"
DEAD = "status = 'dead'"
RESOLVED = "status = 'resolved'"

# Covered by ix_outbox_unsent on PostgreSQL (INCLUDE; SQLite has no such clause and reads
# these from the table).
UNSENT_INCLUDE = ["tenant_id", "meter", "quantity", "stripe_customer_id", "attempt_count",
                  "last_outcome", "last_error_code", "last_http_status"]

# (name, columns, predicate)
INDEXES = [
    ("ix_outbox_unsent", ["status", "occurred_at"], UNSENT),
    ("ix_outbox_sent_at", ["sent_at"], SENT),
    ("ix_outbox_waiting_created", ["created_at"], WAITING),
    ("ix_outbox_dead", ["dead_at", "id"], DEAD),
    ("ix_outbox_dead_tenant", ["tenant_id", "dead_at", "id"], DEAD),
    ("ix_outbox_resolved", ["dead_at", "id"], RESOLVED),
]


def upgrade() -> None:
    with op.batch_alter_table('stripe_usage_outbox', schema=None) as batch_op:
        for name, columns, predicate in INDEXES:
            include = UNSENT_INCLUDE if name == "ix_outbox_unsent" else []
            batch_op.create_index(name, columns, unique=False,
                                  postgresql_where=sa.text(predicate),
                                  sqlite_where=sa.text(predicate),
                                  postgresql_include=include)
    with op.batch_alter_table('stripe_usage_attempts', schema=None) as batch_op:
        batch_op.create_index('ix_attempts_recent', ['attempted_at', 'outcome', 'duration_ms'],
                              unique=False)

    state = op.create_table(
        'rollup_state',
        sa.Column('name', sa.String(length=50), nullable=False),
        sa.Column('watermark', webapp.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column('id_mark', sa.BigInteger(), nullable=False),
        sa.Column('events', sa.BigInteger(), nullable=False),
        sa.Column('quantity', sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint('name', name=op.f('pk_rollup_state')),
    )
    op.create_table(
        'usage_sent_rollup',
        sa.Column('day', sa.String(length=10), nullable=False),
        sa.Column('tenant_id', sa.String(length=100), nullable=False),
        sa.Column('meter', sa.String(length=100), nullable=False),
        sa.Column('events', sa.BigInteger(), nullable=False),
        sa.Column('quantity', sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint('day', 'tenant_id', 'meter',
                                name=op.f('pk_usage_sent_rollup')),
    )
    op.create_table(
        'attempt_rollup',
        sa.Column('outcome', sa.String(length=20), nullable=False),
        sa.Column('bucket', sa.Integer(), nullable=False),
        sa.Column('attempts', sa.BigInteger(), nullable=False),
        sa.Column('duration_ms', sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint('outcome', 'bucket', name=op.f('pk_attempt_rollup')),
    )
    # Nothing folded yet: the watermark starts at the epoch, so every row is still "live".
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    op.bulk_insert(state, [
        {"name": "sent_usage", "watermark": epoch, "id_mark": 0, "events": 0, "quantity": 0},
        {"name": "attempts", "watermark": epoch, "id_mark": 0, "events": 0, "quantity": 0},
    ])


def downgrade() -> None:
    op.drop_table('attempt_rollup')
    op.drop_table('usage_sent_rollup')
    op.drop_table('rollup_state')
    with op.batch_alter_table('stripe_usage_attempts', schema=None) as batch_op:
        batch_op.drop_index('ix_attempts_recent')
    with op.batch_alter_table('stripe_usage_outbox', schema=None) as batch_op:
        for name, _columns, predicate in reversed(INDEXES):
            batch_op.drop_index(name, postgresql_where=sa.text(predicate),
                                sqlite_where=sa.text(predicate))
