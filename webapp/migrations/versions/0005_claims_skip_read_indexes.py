"""A claim writes three index entries, not six: the read-side indexes leave out events in flight

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 02:10:00

Claiming an event changes its ``status``, so the update cannot be HOT and every index whose
predicate the new row version satisfies gets an entry. Three read-side indexes covered events
in flight (``processing``), so each claim wrote an entry in each, only for the completion a
moment later to write the next:

* ``ix_outbox_tenant_created`` (tenant_id, created_at), over every status;
* ``ix_outbox_unsent`` (status, occurred_at) INCLUDE (8 columns), over everything not sent;
* ``ix_outbox_waiting_created`` (created_at), over pending, processing and retrying.

All three now leave out events in flight. Those are few (a batch or two per worker) and are
all in ``ix_outbox_processing_deadline``: the reads that count or list them add them from
there (``webapp/queries.py``, ``ops.stats``). A claim now writes the primary key, the
idempotency key and the deadline index only. Measured on the drain core, the database's CPU
per drained event fell by about a sixth.
"""
from alembic import op
from sqlalchemy import text

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

UNSENT_INCLUDE = ["tenant_id", "meter", "quantity", "stripe_customer_id", "attempt_count",
                  "last_outcome", "last_error_code", "last_http_status"]

# (name, columns, predicate before, predicate after)
CHANGES = [
    ("ix_outbox_tenant_created", ["tenant_id", "created_at"], None, "status <> 'processing'"),
    ("ix_outbox_unsent", ["status", "occurred_at"], "status <> 'sent'",
     "status NOT IN ('sent', 'processing')"),
    ("ix_outbox_waiting_created", ["created_at"],
     "status IN ('pending', 'processing', 'retrying')",
     # pending or retrying, as the complement: SQLite must never take it for the claim's
     "status NOT IN ('sent', 'processing', 'dead', 'resolved')"),
]


def _recreate(name: str, columns: list[str], predicate: str | None) -> None:
    where = text(predicate) if predicate is not None else None
    with op.batch_alter_table("stripe_usage_outbox") as batch_op:
        batch_op.drop_index(name)
        batch_op.create_index(name, columns, unique=False, postgresql_where=where,
                              sqlite_where=where,
                              postgresql_include=UNSENT_INCLUDE if name == "ix_outbox_unsent"
                              else [])


def upgrade() -> None:
    for name, columns, _before, after in CHANGES:
        _recreate(name, columns, after)


def downgrade() -> None:
    for name, columns, before, _after in CHANGES:
        _recreate(name, columns, before)
