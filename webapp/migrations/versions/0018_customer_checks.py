"""What Stripe last said of each customer; how a rejection was traced to its event

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-03 17:30:00

A tenant is mapped only to a customer Stripe has, and an error report that says a customer was
not found is traced to the events sent to customers Stripe does not have: both ask Stripe
(``GET /v1/customers/{id}``). The answer is kept per customer (``active``, ``deleted`` or
``missing``, when, and Stripe's request id), so every process asks about one customer at most
once per ``STRIPE_METERS_REFRESH_SECONDS``.

``stripe_usage_outbox.reject_found_by``: how a rejection was traced to the event (a sample
naming it, a sample naming the stream request that carried it, or Stripe saying its customer
does not exist). Nullable, no default: adding it rewrites nothing on PostgreSQL.
"""
import sqlalchemy as sa
from alembic import op

from webapp.models.base import UTCDateTime

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "stripe_customer_checks",
        sa.Column("customer_id", sa.String(length=255), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=True),
        sa.Column("checked_at", UTCDateTime(), nullable=False),
        sa.Column("request_id", sa.String(length=255), nullable=True),
        sa.PrimaryKeyConstraint("customer_id", name=op.f("pk_stripe_customer_checks")),
    )
    op.add_column("stripe_usage_outbox",
                  sa.Column("reject_found_by", sa.String(length=20), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("stripe_usage_outbox") as batch:
        batch.drop_column("reject_found_by")
    op.drop_table("stripe_customer_checks")
