"""Tell PostgreSQL's planner which errors go with which status

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 23:40:00

The planner estimates ``status = 'dead' AND last_error_code = 'api_error'`` as the product of
the two conditions' shares of the whole table. The two are far from independent: almost
every error code belongs to a dead, retrying or rejected row, so at 10 million rows (2% dead,
a third of them ``api_error``) it expected 90 matching rows where there were 63,000, and the
events list filtered by code read every dead row's heap page (1 s) instead of walking the
newest rows (14 ms). Multi-column statistics (most common value lists over the status and its
error columns) give it the joint shares; ANALYZE, autovacuum's included, keeps them. SQLite
has no such statistics.
"""
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

#: name -> the outbox columns whose joint values the planner learns.
STATISTICS = {
    "stx_outbox_status_errors": ("status", "last_error_code", "last_error_class",
                                 "last_http_status"),
    "stx_outbox_status_reject": ("status", "reject_code"),
}


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name, columns in STATISTICS.items():
        op.execute(f"CREATE STATISTICS {name} (mcv) ON {', '.join(columns)} "
                   "FROM stripe_usage_outbox")
    # Filled now, not at the next autovacuum's ANALYZE.
    op.execute("ANALYZE stripe_usage_outbox")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name in STATISTICS:
        op.execute(f"DROP STATISTICS IF EXISTS {name}")
