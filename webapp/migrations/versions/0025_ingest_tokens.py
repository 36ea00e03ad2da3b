"""The HTTP ingest API's tokens

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-07 03:10:00

``ingest_tokens``: a bearer token per producer (name, scopes, requests a second), kept as its
SHA-256 only; revoked ones stay, so the audit log and the events keep naming them.
"""
import sqlalchemy as sa
from alembic import op

from webapp.models.base import UTCDateTime

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ingest_tokens",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("scopes", sa.String(length=200), nullable=False),
        sa.Column("rate_per_second", sa.Float(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("created_by", sa.String(length=255), nullable=False),
        sa.Column("last_used_at", UTCDateTime(), nullable=True),
        sa.Column("revoked_at", UTCDateTime(), nullable=True),
        sa.Column("revoked_by", sa.String(length=255), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ingest_tokens")),
        sa.UniqueConstraint("name", name=op.f("uq_ingest_tokens_name")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_ingest_tokens_token_hash")),
    )


def downgrade() -> None:
    op.drop_table("ingest_tokens")
