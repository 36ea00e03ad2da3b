"""Lighter writes per drained event: two indexes and one foreign key fewer

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29 23:20:00

An outbox row is updated twice on its way to Stripe (claimed, then sent) and leaves one
attempt row. Each update changes ``status``, which several partial indexes' predicates read,
so PostgreSQL cannot make it a HOT update: every index on the table gets a new entry.
Profiled with ``perf`` on the drain, index insertion was about half of the database's work and
the attempts' foreign-key check another eighth (one SPI query per inserted row). None of these
earned it:

* ``ix_outbox_status_updated`` (status, updated_at): no query filters or sorts on
  ``updated_at``; status lookups are served by the partial indexes. The planner also picked it
  for the token-guarded completion and then filtered a thousand-element id list row by row.
* ``ix_attempts_attempted_at`` (attempted_at): ``ix_attempts_recent`` (attempted_at, outcome,
  duration_ms) begins with the same column and serves every range on it.
* the foreign key from ``stripe_usage_attempts.event_id`` to the outbox: attempts are written
  in one place only (``record_outcomes``), in the transaction that updates their event under
  its claim, with ids the claim itself returned; nothing ever deletes an event, so its
  ``ON DELETE CASCADE`` never ran. ``ix_stripe_usage_attempts_event_id`` stays for the event
  page.
"""
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

FK = "fk_stripe_usage_attempts_event_id_stripe_usage_outbox"


def upgrade() -> None:
    with op.batch_alter_table("stripe_usage_outbox") as batch_op:
        batch_op.drop_index("ix_outbox_status_updated")
    with op.batch_alter_table("stripe_usage_attempts") as batch_op:
        batch_op.drop_index("ix_attempts_attempted_at")
        batch_op.drop_constraint(FK, type_="foreignkey")


def downgrade() -> None:
    with op.batch_alter_table("stripe_usage_attempts") as batch_op:
        batch_op.create_foreign_key(FK, "stripe_usage_outbox", ["event_id"], ["id"],
                                    ondelete="CASCADE")
        batch_op.create_index("ix_attempts_attempted_at", ["attempted_at"], unique=False)
    with op.batch_alter_table("stripe_usage_outbox") as batch_op:
        batch_op.create_index("ix_outbox_status_updated", ["status", "updated_at"],
                              unique=False)
