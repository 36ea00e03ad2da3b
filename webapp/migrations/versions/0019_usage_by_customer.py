"""Usage by the Stripe customer it went to: the customer in the usage rollups' keys

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-03 18:30:00

Usage was summed per tenant and meter, and shown beside the customer the tenant is mapped to
*now*: a tenant remapped within a period showed all its units under the new customer, though
they went to the old one (fixed on each event at its first attempt). The sent rollups (daily,
monthly, yearly), the pruned-usage rollup and the prepared reports' rows gain
``stripe_customer_id`` in their keys (``""`` where an event had none: never attempted).

The sent rollups are emptied and their mark set back, as ``rollups.rebuild`` does: the folder
service folds the outbox's sent rows again at its next run, each under its own customer (about
3 s at 10 million rows), and every read stays exact meanwhile (it adds the rows the rollups do
not hold). Sent events already pruned have no row left: they come back from the pruned-usage
rollup under the customer their tenant is mapped to at this upgrade (the best that is known of
them), as do pruned resolved and cancelled events. Prepared reports are a cache: they are
emptied and prepared again.
"""
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
STATUSES = ("sent", "pending", "retrying", "rejected", "dead", "cancelled", "resolved")
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
BYTEWISE = sa.String(length=100).with_variant(sa.String(length=100, collation="C"), "postgresql")
SORTED = ("sent_units", "sent_events", "waiting_events", "dead_events")
#: The customer a tenant is mapped to now, '' when none: what is known of pruned usage.
MAPPED_NOW = ("COALESCE((SELECT t.stripe_customer_id FROM billing_tenants t "
              "WHERE t.tenant_id = p.tenant_id), '')")


def _unlogged() -> list[str]:
    """The report rows are a cache without write-ahead log on PostgreSQL (migration 0014),
    as the reports they refer to are: created so at once (a logged table cannot refer to an
    unlogged one)."""
    return ["UNLOGGED"] if op.get_bind().dialect.name == "postgresql" else []


def _set_aside(name: str, old: str) -> None:
    """Rename table ``name`` to ``old``, with its primary key's name (PostgreSQL names it in
    the same namespace as tables: the new table's would clash)."""
    op.rename_table(name, old)
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE {old} RENAME CONSTRAINT pk_{name} TO pk_{old}")


def _rollup(name: str, period: str, length: int) -> None:
    op.create_table(
        name,
        sa.Column(period, sa.String(length=length), nullable=False),
        sa.Column("tenant_id", sa.String(length=100), nullable=False),
        sa.Column("stripe_customer_id", sa.String(length=255), nullable=False),
        sa.Column("meter", sa.String(length=100), nullable=False),
        sa.Column("events", sa.BigInteger(), nullable=False),
        sa.Column("quantity", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(period, "tenant_id", "stripe_customer_id", "meter",
                                name=op.f(f"pk_{name}")),
    )


def upgrade() -> None:
    # The pruned-usage rollup keeps its counts, under the customer mapped now.
    _set_aside("usage_pruned_rollup", "usage_pruned_rollup_0018")
    op.create_table(
        "usage_pruned_rollup",
        sa.Column("day", sa.String(length=10), nullable=False),
        sa.Column("tenant_id", sa.String(length=100), nullable=False),
        sa.Column("stripe_customer_id", sa.String(length=255), nullable=False),
        sa.Column("meter", sa.String(length=100), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("events", sa.BigInteger(), nullable=False),
        sa.Column("quantity", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("day", "tenant_id", "stripe_customer_id", "meter", "status",
                                name=op.f("pk_usage_pruned_rollup")),
    )
    op.execute(sa.text(
        "INSERT INTO usage_pruned_rollup (day, tenant_id, stripe_customer_id, meter, status, "
        f"events, quantity) SELECT p.day, p.tenant_id, {MAPPED_NOW}, p.meter, p.status, "
        "p.events, p.quantity FROM usage_pruned_rollup_0018 p"))
    op.drop_table("usage_pruned_rollup_0018")

    # The sent rollups: rebuilt, the pruned sent usage first; the folder folds the rows.
    op.drop_index("ix_usage_sent_rollup_tenant", table_name="usage_sent_rollup")
    op.drop_index("ix_usage_sent_monthly_tenant", table_name="usage_sent_monthly")
    for name in ("usage_sent_rollup", "usage_sent_monthly", "usage_sent_yearly"):
        op.drop_table(name)
    _rollup("usage_sent_rollup", "day", 10)
    _rollup("usage_sent_monthly", "month", 7)
    _rollup("usage_sent_yearly", "year", 4)
    op.create_index("ix_usage_sent_rollup_tenant", "usage_sent_rollup", ["tenant_id", "day"])
    op.create_index("ix_usage_sent_monthly_tenant", "usage_sent_monthly",
                    ["tenant_id", "month"])
    op.create_index("ix_usage_sent_yearly_customer", "usage_sent_yearly",
                    ["stripe_customer_id", "tenant_id"])
    pruned_sent = ("FROM usage_pruned_rollup WHERE status = 'sent'")
    op.execute(sa.text(
        "INSERT INTO usage_sent_rollup (day, tenant_id, stripe_customer_id, meter, events, "
        f"quantity) SELECT day, tenant_id, stripe_customer_id, meter, events, quantity "
        f"{pruned_sent}"))
    for name, period, width in (("usage_sent_monthly", "month", 7),
                                ("usage_sent_yearly", "year", 4)):
        op.execute(sa.text(
            f"INSERT INTO {name} ({period}, tenant_id, stripe_customer_id, meter, events, "
            f"quantity) SELECT substr(day, 1, {width}), tenant_id, stripe_customer_id, meter, "
            f"sum(events), sum(quantity) {pruned_sent} GROUP BY substr(day, 1, {width}), "
            "tenant_id, stripe_customer_id, meter"))
    op.execute(sa.text("DELETE FROM usage_sent_day"))
    op.execute(sa.text(
        "INSERT INTO usage_sent_day (day, events, quantity) "
        f"SELECT day, sum(events), sum(quantity) {pruned_sent} GROUP BY day"))
    op.execute(sa.text(
        "UPDATE rollup_state SET watermark = :epoch, id_mark = 0, "
        f"events = (SELECT coalesce(sum(events), 0) {pruned_sent}), "
        f"quantity = (SELECT coalesce(sum(quantity), 0) {pruned_sent}) "
        "WHERE name = 'sent_usage'").bindparams(epoch=EPOCH))

    # Prepared reports: a cache, prepared again; with their totals per meter.
    op.add_column("usage_reports", sa.Column("meter_totals", sa.Text(), nullable=True))
    for figure in SORTED:
        op.drop_index(f"ix_usage_report_rows_{figure}", table_name="usage_report_rows")
    op.drop_table("usage_report_rows")
    op.execute(sa.text("DELETE FROM usage_reports"))
    op.create_table(
        "usage_report_rows",
        sa.Column("report_id", BIG_ID, nullable=False),
        sa.Column("tenant_id", BYTEWISE, nullable=False),
        sa.Column("stripe_customer_id", sa.String(length=255), nullable=False),
        sa.Column("meter", BYTEWISE, nullable=False),
        *[sa.Column(f"{s}_{w}", sa.BigInteger(), nullable=False)
          for s in STATUSES for w in ("events", "units")],
        sa.Column("waiting_events", sa.BigInteger(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.ForeignKeyConstraint(["report_id"], ["usage_reports.id"], ondelete="CASCADE",
                                name=op.f("fk_usage_report_rows_report_id_usage_reports")),
        sa.PrimaryKeyConstraint("report_id", "tenant_id", "stripe_customer_id", "meter",
                                name=op.f("pk_usage_report_rows")),
        prefixes=_unlogged(),
    )
    for figure in SORTED:
        op.create_index(f"ix_usage_report_rows_{figure}", "usage_report_rows",
                        ["report_id", sa.text(f"{figure} DESC"), "tenant_id", "meter"])


def _fold_customers(name: str, keys: tuple[str, ...], columns: list[sa.Column[Any]]) -> None:
    """``name`` back to one row per ``keys`` (its customers summed together)."""
    old = f"{name}_0019"
    _set_aside(name, old)
    op.create_table(name, *columns, sa.PrimaryKeyConstraint(*keys, name=op.f(f"pk_{name}")))
    listed = ", ".join(keys)
    op.execute(sa.text(f"INSERT INTO {name} ({listed}, events, quantity) SELECT {listed}, "
                       f"sum(events), sum(quantity) FROM {old} GROUP BY {listed}"))
    op.drop_table(old)


def _figures() -> list[sa.Column[Any]]:
    return [sa.Column("events", sa.BigInteger(), nullable=False),
            sa.Column("quantity", sa.BigInteger(), nullable=False)]


def downgrade() -> None:
    """Back to one row per tenant and meter: the customers' figures summed (which customer
    the usage went to is lost)."""
    with op.batch_alter_table("usage_reports") as batch:
        batch.drop_column("meter_totals")
    for figure in SORTED:
        op.drop_index(f"ix_usage_report_rows_{figure}", table_name="usage_report_rows")
    op.drop_table("usage_report_rows")
    op.execute(sa.text("DELETE FROM usage_reports"))
    op.create_table(
        "usage_report_rows",
        sa.Column("report_id", BIG_ID, nullable=False),
        sa.Column("tenant_id", BYTEWISE, nullable=False),
        sa.Column("meter", BYTEWISE, nullable=False),
        *[sa.Column(f"{s}_{w}", sa.BigInteger(), nullable=False)
          for s in STATUSES for w in ("events", "units")],
        sa.Column("waiting_events", sa.BigInteger(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("stripe_customer_id", sa.String(length=255), nullable=True),
        sa.ForeignKeyConstraint(["report_id"], ["usage_reports.id"], ondelete="CASCADE",
                                name=op.f("fk_usage_report_rows_report_id_usage_reports")),
        sa.PrimaryKeyConstraint("report_id", "tenant_id", "meter",
                                name=op.f("pk_usage_report_rows")),
        prefixes=_unlogged(),
    )
    for figure in SORTED:
        op.create_index(f"ix_usage_report_rows_{figure}", "usage_report_rows",
                        ["report_id", sa.text(f"{figure} DESC"), "tenant_id", "meter"])
    op.drop_index("ix_usage_sent_yearly_customer", table_name="usage_sent_yearly")
    op.drop_index("ix_usage_sent_rollup_tenant", table_name="usage_sent_rollup")
    op.drop_index("ix_usage_sent_monthly_tenant", table_name="usage_sent_monthly")
    for name, period, length in (("usage_sent_rollup", "day", 10),
                                 ("usage_sent_monthly", "month", 7),
                                 ("usage_sent_yearly", "year", 4)):
        _fold_customers(name, (period, "tenant_id", "meter"), [
            sa.Column(period, sa.String(length=length), nullable=False),
            sa.Column("tenant_id", sa.String(length=100), nullable=False),
            sa.Column("meter", sa.String(length=100), nullable=False), *_figures()])
    op.create_index("ix_usage_sent_rollup_tenant", "usage_sent_rollup", ["tenant_id", "day"])
    op.create_index("ix_usage_sent_monthly_tenant", "usage_sent_monthly",
                    ["tenant_id", "month"])
    _fold_customers("usage_pruned_rollup", ("day", "tenant_id", "meter", "status"), [
        sa.Column("day", sa.String(length=10), nullable=False),
        sa.Column("tenant_id", sa.String(length=100), nullable=False),
        sa.Column("meter", sa.String(length=100), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False), *_figures()])
