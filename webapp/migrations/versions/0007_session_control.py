"""Sessions that can be ended, log-in throttling, password changes

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 12:00:00

Users gain a session generation (a cookie names the one it was issued under; log-out,
deactivation, a password or role change move it on, so every older cookie dies at once), a
"must change password" flag set by an admin's reset, and when the password last changed.
``login_throttle`` counts failed log-ins per account and per client address for every process.
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy import text

from webapp.models.base import UTCDateTime

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("users") as batch_op:
        batch_op.add_column(sa.Column("session_generation", sa.Integer(), nullable=False,
                                      server_default=text("0")))
        batch_op.add_column(sa.Column("must_change_password", sa.Boolean(), nullable=False,
                                      server_default=sa.false()))
        batch_op.add_column(sa.Column("password_changed_at", UTCDateTime(), nullable=True))
    op.create_table(
        "login_throttle",
        sa.Column("key", sa.String(length=300), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("window_started_at", UTCDateTime(), nullable=False),
        sa.Column("locked_until", UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_login_throttle")),
    )


def downgrade() -> None:
    op.drop_table("login_throttle")
    with op.batch_alter_table("users") as batch_op:
        batch_op.drop_column("password_changed_at")
        batch_op.drop_column("must_change_password")
        batch_op.drop_column("session_generation")
