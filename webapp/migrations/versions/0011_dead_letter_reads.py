"""Dead letters read from an index: the error groups and the text search over 10 million rows

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 21:00:00

The dead-letter page groups the dead events by error and searches their messages. Both read
every dead event, and dead events are a few in every hundred rows, spread over the whole table:
with 210,000 of them among 10 million rows, each read touched nearly every heap page (groups
about 590 ms, a search about 450 ms). ``ix_outbox_dead_errors`` holds, for dead events only,
every column those reads use (PostgreSQL: INCLUDE), so they read the index alone.

A B-tree entry must stay under 2,704 bytes, or the write that makes it fails (here: recording
the outcome that kills an event, which would then be sent again and again). Messages are kept
up to 2,000 characters, so the index takes only the rows whose texts add up to at most 2,400
bytes; the others are in ``ix_outbox_dead_outsize`` (dead_at, id), normally empty. The reads
ask both. Only dead rows get an entry: a claim, a send and a retry write none.

The index is built in the migration's transaction (as 0009's), which holds writes to the
outbox while it reads the table once: a few seconds at 10 million rows.
"""
from alembic import op
from sqlalchemy import text

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

TEXTS = ("tenant_id", "meter", "idempotency_key", "last_error_class", "last_error_code",
         "last_error_message", "dead_reason")
BYTES = {"postgresql": "octet_length(coalesce({}, ''))",
         "sqlite": "length(CAST(coalesce({}, '') AS BLOB))"}
INCLUDE = ["tenant_id", "meter", "quantity", "occurred_at", "idempotency_key",
           "last_error_class", "last_error_code", "last_http_status", "last_error_message",
           "dead_reason"]


def _where(dialect: str, comparison: str) -> str:
    size = " + ".join(BYTES[dialect].format(c) for c in TEXTS)
    return f"status = 'dead' AND {size} {comparison} 2400"


def upgrade() -> None:
    with op.batch_alter_table("stripe_usage_outbox") as batch_op:
        batch_op.create_index("ix_outbox_dead_errors", ["dead_at", "id"], unique=False,
                              postgresql_include=INCLUDE,
                              postgresql_where=text(_where("postgresql", "<=")),
                              sqlite_where=text(_where("sqlite", "<=")))
        batch_op.create_index("ix_outbox_dead_outsize", ["dead_at", "id"], unique=False,
                              postgresql_where=text(_where("postgresql", ">")),
                              sqlite_where=text(_where("sqlite", ">")))


def downgrade() -> None:
    with op.batch_alter_table("stripe_usage_outbox") as batch_op:
        batch_op.drop_index("ix_outbox_dead_outsize")
        batch_op.drop_index("ix_outbox_dead_errors")
