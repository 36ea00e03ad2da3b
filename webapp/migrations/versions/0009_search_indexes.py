"""Indexes for the search box: a Stripe request id and a Stripe customer id

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 15:00:00

Search finds the calls Stripe answered under a request id (``req_…``, which Stripe's support
and its dashboard quote) and the tenants billed to a customer (``cus_…``). Neither column had
an index, and calls grow with events (a million or more): without one, each such search would
read the whole table. The request index leaves out calls without a request id (network
errors); it costs one entry per call recorded, written in the same insert as the call.
Tenant ids and idempotency keys are searched by prefix as ranges over their existing indexes.
"""
from alembic import op
from sqlalchemy import text

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

HAS_REQUEST = "stripe_request_id IS NOT NULL"
HAS_CUSTOMER = "stripe_customer_id IS NOT NULL"


def upgrade() -> None:
    with op.batch_alter_table("stripe_usage_attempts") as batch_op:
        batch_op.create_index("ix_attempts_request_id", ["stripe_request_id"], unique=False,
                              postgresql_where=text(HAS_REQUEST),
                              sqlite_where=text(HAS_REQUEST))
    with op.batch_alter_table("billing_tenants") as batch_op:
        batch_op.create_index("ix_tenants_customer", ["stripe_customer_id"], unique=False,
                              postgresql_where=text(HAS_CUSTOMER),
                              sqlite_where=text(HAS_CUSTOMER))


def downgrade() -> None:
    with op.batch_alter_table("billing_tenants") as batch_op:
        batch_op.drop_index("ix_tenants_customer")
    with op.batch_alter_table("stripe_usage_attempts") as batch_op:
        batch_op.drop_index("ix_attempts_request_id")
