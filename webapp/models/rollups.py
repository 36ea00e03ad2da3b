"""The rollups of final facts: sent usage by hour, day, month and year (per customer, since
migration 0019), what retention pruned, attempts by hour, and how far each has folded."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base, UTCDateTime


class RollupState(Base):
    """How far a rollup has folded (webapp.queries): rows stamped before ``watermark`` and
    with an id up to ``id_mark`` are in it; ``events``/``quantity`` total what it holds.
    """

    __tablename__ = "rollup_state"

    name: Mapped[str] = mapped_column(String(50), primary_key=True)
    watermark: Mapped[datetime] = mapped_column(UTCDateTime())
    id_mark: Mapped[int] = mapped_column(BigInteger, default=0)
    events: Mapped[int] = mapped_column(BigInteger, default=0)
    quantity: Mapped[int] = mapped_column(BigInteger, default=0)


#: The Stripe customer a rollup row's usage went to (the one fixed on each event at its first
#: attempt, migration 0019); ``""`` where an event had none (never attempted).
def _customer_key() -> Mapped[str]:
    return mapped_column(String(255), primary_key=True)


class SentUsageRollup(Base):
    """Sent usage folded by UTC day of occurrence (``YYYY-MM-DD``), tenant, the Stripe customer
    it went to, and meter: a tenant remapped within a period has a row per customer.

    Sent is final, so a closed stretch of ``sent_at`` never changes once folded.
    """

    __tablename__ = "usage_sent_rollup"

    day: Mapped[str] = mapped_column(String(10), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(100), primary_key=True)
    stripe_customer_id: Mapped[str] = _customer_key()
    meter: Mapped[str] = mapped_column(String(100), primary_key=True)
    events: Mapped[int] = mapped_column(BigInteger, default=0)
    quantity: Mapped[int] = mapped_column(BigInteger, default=0)

    __table_args__ = (
        # One tenant's days (its page's chart and usage) among 100,000 tenants' (0010).
        Index("ix_usage_sent_rollup_tenant", "tenant_id", "day"),
    )


class SentUsageMonthly(Base):
    """The sent-usage rollup again by UTC month of occurrence (``YYYY-MM``), written in the
    same transactions as ``usage_sent_rollup`` (migration 0010): a year's usage reads twelve
    months per tenant and meter instead of 365 days."""

    __tablename__ = "usage_sent_monthly"

    month: Mapped[str] = mapped_column(String(7), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(100), primary_key=True)
    stripe_customer_id: Mapped[str] = _customer_key()
    meter: Mapped[str] = mapped_column(String(100), primary_key=True)
    events: Mapped[int] = mapped_column(BigInteger, default=0)
    quantity: Mapped[int] = mapped_column(BigInteger, default=0)

    __table_args__ = (
        # One tenant's months (its page, ``usage --tenant``) among 100,000 tenants' (0010).
        Index("ix_usage_sent_monthly_tenant", "tenant_id", "month"),
    )


class SentUsageYearly(Base):
    """The sent-usage rollup again by UTC year of occurrence (``YYYY``), written in the same
    transactions as the daily and monthly ones (migration 0011): a year of usage for 100,000
    tenants reads one row per tenant and meter (less the months outside the period, when
    those are fewer), not twelve."""

    __tablename__ = "usage_sent_yearly"

    year: Mapped[str] = mapped_column(String(4), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(100), primary_key=True)
    stripe_customer_id: Mapped[str] = _customer_key()
    meter: Mapped[str] = mapped_column(String(100), primary_key=True)
    events: Mapped[int] = mapped_column(BigInteger, default=0)
    quantity: Mapped[int] = mapped_column(BigInteger, default=0)

    __table_args__ = (
        # The tenants whose usage went to a Stripe customer, whatever they are mapped to now
        # (search, the events list's customer filter; migration 0019).
        Index("ix_usage_sent_yearly_customer", "stripe_customer_id", "tenant_id"),
    )


class SentUsageDay(Base):
    """The sent-usage rollup again per UTC day of occurrence, every tenant together
    (migration 0010): the Overview's long-range chart reads 30 rows, not 30 days of every
    tenant's rows."""

    __tablename__ = "usage_sent_day"

    day: Mapped[str] = mapped_column(String(10), primary_key=True)
    events: Mapped[int] = mapped_column(BigInteger, default=0)
    quantity: Mapped[int] = mapped_column(BigInteger, default=0)


class PrunedUsageRollup(Base):
    """What pruned events counted (migration 0010), by UTC day of occurrence, tenant, meter and
    status: written by ``webapp.outbox.retention.prune`` in the transaction that deletes the
    rows, so usage for a period is the same before and after. Pruned ``sent`` events are
    counted here *and* stay in ``usage_sent_rollup`` (they were folded before they could be
    pruned); usage reads take sent from that rollup and the other statuses from here."""

    __tablename__ = "usage_pruned_rollup"

    day: Mapped[str] = mapped_column(String(10), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(100), primary_key=True)
    stripe_customer_id: Mapped[str] = _customer_key()
    meter: Mapped[str] = mapped_column(String(100), primary_key=True)
    status: Mapped[str] = mapped_column(String(16), primary_key=True)
    events: Mapped[int] = mapped_column(BigInteger, default=0)
    quantity: Mapped[int] = mapped_column(BigInteger, default=0)


class AttemptRollup(Base):
    """Calls to Stripe folded by outcome and latency bucket (for /metrics counters)."""

    __tablename__ = "attempt_rollup"

    outcome: Mapped[str] = mapped_column(String(20), primary_key=True)
    # Index into webapp.queries.LATENCY_BUCKETS_MS; len(...) = above the last; -1 = no duration.
    bucket: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempts: Mapped[int] = mapped_column(BigInteger, default=0)
    duration_ms: Mapped[int] = mapped_column(BigInteger, default=0)
