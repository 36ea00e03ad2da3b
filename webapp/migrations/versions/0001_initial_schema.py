"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-29 20:29:05.891758
"""
from alembic import op
import sqlalchemy as sa
import webapp.models


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('audit_log',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('at', webapp.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('actor', sa.String(length=255), nullable=False),
    sa.Column('action', sa.String(length=50), nullable=False),
    sa.Column('event_ids', sa.Text(), nullable=True),
    sa.Column('event_count', sa.Integer(), nullable=False),
    sa.Column('reason_code', sa.String(length=40), nullable=True),
    sa.Column('note', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_audit_log'))
    )
    with op.batch_alter_table('audit_log', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_audit_log_at'), ['at'], unique=False)

    op.create_table('billing_tenants',
    sa.Column('tenant_id', sa.String(length=100), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=True),
    sa.Column('stripe_customer_id', sa.String(length=255), nullable=True),
    sa.Column('created_at', webapp.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('updated_at', webapp.models.UTCDateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('tenant_id', name=op.f('pk_billing_tenants'))
    )
    op.create_table('outbox_control',
    sa.Column('name', sa.String(length=50), nullable=False),
    sa.Column('paused', sa.Boolean(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('kind', sa.String(length=20), nullable=True),
    sa.Column('changed_at', webapp.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('changed_by', sa.String(length=255), nullable=True),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_outbox_control'))
    )
    op.create_table('stripe_usage_outbox',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('tenant_id', sa.String(length=100), nullable=False),
    sa.Column('meter', sa.String(length=100), nullable=False),
    sa.Column('quantity', sa.BigInteger(), nullable=False),
    sa.Column('idempotency_key', sa.String(length=100), nullable=False),
    sa.Column('occurred_at', webapp.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('attempt_count', sa.Integer(), nullable=False),
    sa.Column('call_count', sa.Integer(), nullable=False),
    sa.Column('next_attempt_at', webapp.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('processing_deadline_at', webapp.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('claim_token', sa.String(length=32), nullable=True),
    sa.Column('claimed_by', sa.String(length=200), nullable=True),
    sa.Column('stripe_customer_id', sa.String(length=255), nullable=True),
    sa.Column('key_generation', sa.Integer(), nullable=False),
    sa.Column('first_attempt_at', webapp.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('first_unknown_at', webapp.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('sent_at', webapp.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('last_outcome', sa.String(length=20), nullable=True),
    sa.Column('last_error_class', sa.String(length=100), nullable=True),
    sa.Column('last_error_code', sa.String(length=100), nullable=True),
    sa.Column('last_http_status', sa.Integer(), nullable=True),
    sa.Column('last_error_message', sa.Text(), nullable=True),
    sa.Column('last_request_id', sa.String(length=255), nullable=True),
    sa.Column('dead_reason', sa.Text(), nullable=True),
    sa.Column('dead_at', webapp.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('resolved_at', webapp.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('resolved_by', sa.String(length=255), nullable=True),
    sa.Column('resolve_reason', sa.String(length=40), nullable=True),
    sa.Column('resolve_note', sa.Text(), nullable=True),
    sa.Column('created_at', webapp.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('updated_at', webapp.models.UTCDateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_stripe_usage_outbox')),
    sa.UniqueConstraint('idempotency_key', name=op.f('uq_stripe_usage_outbox_idempotency_key'))
    )
    with op.batch_alter_table('stripe_usage_outbox', schema=None) as batch_op:
        batch_op.create_index('ix_outbox_claimable', ['next_attempt_at', 'id'], unique=False, postgresql_where=sa.text("status IN ('pending', 'retrying')"), sqlite_where=sa.text("status IN ('pending', 'retrying')"))
        batch_op.create_index('ix_outbox_processing_deadline', ['processing_deadline_at'], unique=False, postgresql_where=sa.text("status = 'processing'"), sqlite_where=sa.text("status = 'processing'"))
        batch_op.create_index('ix_outbox_status_updated', ['status', 'updated_at'], unique=False)
        batch_op.create_index('ix_outbox_tenant_created', ['tenant_id', 'created_at'], unique=False)

    op.create_table('users',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('email', sa.String(length=254), nullable=False),
    sa.Column('password_hash', sa.String(length=255), nullable=False),
    sa.Column('role', sa.String(length=20), nullable=False),
    sa.Column('active', sa.Boolean(), nullable=False),
    sa.Column('created_at', webapp.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('last_login_at', webapp.models.UTCDateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_users')),
    sa.UniqueConstraint('email', name=op.f('uq_users_email'))
    )
    op.create_table('audit_log_events',
    sa.Column('audit_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('event_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.ForeignKeyConstraint(['audit_id'], ['audit_log.id'], name=op.f('fk_audit_log_events_audit_id_audit_log'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('audit_id', 'event_id', name=op.f('pk_audit_log_events'))
    )
    with op.batch_alter_table('audit_log_events', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_audit_log_events_event_id'), ['event_id'], unique=False)

    op.create_table('stripe_usage_attempts',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('event_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('attempted_at', webapp.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('duration_ms', sa.Integer(), nullable=True),
    sa.Column('worker', sa.String(length=200), nullable=True),
    sa.Column('claim_token', sa.String(length=32), nullable=True),
    sa.Column('idempotency_key', sa.String(length=255), nullable=True),
    sa.Column('outcome', sa.String(length=20), nullable=False),
    sa.Column('counted', sa.Boolean(), nullable=False),
    sa.Column('http_status', sa.Integer(), nullable=True),
    sa.Column('stripe_request_id', sa.String(length=255), nullable=True),
    sa.Column('error_class', sa.String(length=100), nullable=True),
    sa.Column('error_code', sa.String(length=100), nullable=True),
    sa.Column('error_message', sa.Text(), nullable=True),
    sa.Column('applied', sa.Boolean(), nullable=False),
    sa.ForeignKeyConstraint(['event_id'], ['stripe_usage_outbox.id'], name=op.f('fk_stripe_usage_attempts_event_id_stripe_usage_outbox'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_stripe_usage_attempts'))
    )
    with op.batch_alter_table('stripe_usage_attempts', schema=None) as batch_op:
        batch_op.create_index('ix_attempts_attempted_at', ['attempted_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_stripe_usage_attempts_event_id'), ['event_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('stripe_usage_attempts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_stripe_usage_attempts_event_id'))
        batch_op.drop_index('ix_attempts_attempted_at')

    op.drop_table('stripe_usage_attempts')
    with op.batch_alter_table('audit_log_events', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_audit_log_events_event_id'))

    op.drop_table('audit_log_events')
    op.drop_table('users')
    with op.batch_alter_table('stripe_usage_outbox', schema=None) as batch_op:
        batch_op.drop_index('ix_outbox_tenant_created')
        batch_op.drop_index('ix_outbox_status_updated')
        batch_op.drop_index('ix_outbox_processing_deadline', postgresql_where=sa.text("status = 'processing'"), sqlite_where=sa.text("status = 'processing'"))
        batch_op.drop_index('ix_outbox_claimable', postgresql_where=sa.text("status IN ('pending', 'retrying')"), sqlite_where=sa.text("status IN ('pending', 'retrying')"))

    op.drop_table('stripe_usage_outbox')
    op.drop_table('outbox_control')
    op.drop_table('billing_tenants')
    with op.batch_alter_table('audit_log', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_audit_log_at'))

    op.drop_table('audit_log')
