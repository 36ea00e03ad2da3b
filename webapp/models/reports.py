"""Prepared usage reports: a long period's usage per tenant and meter, summed once and kept,
so the Tenants & usage page reads 200,000 stored rows instead of summing every event of the
period on each view (migration 0014)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from ..status import USAGE_ORDER
from .base import Base, BigID, UTCDateTime

#: The statuses a report keeps a pair of figures for (units and events), in the page's order:
#: ``webapp.read.usage_sources.USAGE_STATUSES`` (a test keeps the two equal).
REPORT_STATUSES = USAGE_ORDER


#: Text compared byte by byte on PostgreSQL (the ``"C"`` collation): the order the usage
#: table sorts tenants and meters in, so the indexes below serve its pages. SQLite's default
#: order is already bytewise.
BytewiseText = String(100).with_variant(String(100, collation="C"), "postgresql")
#: The figures a report's rows can be sorted by, largest first (an index each).
SORTED_FIGURES = ("sent_units", "sent_events", "waiting_events", "dead_events")


class UsageReport(Base):
    """One preparation of a period's usage (UTC days ``period_start``…``period_end``, every
    tenant), exact as of ``as_of``: the moment of the database snapshot it was summed in."""

    __tablename__ = "usage_reports"

    id: Mapped[int] = mapped_column(BigID, primary_key=True, autoincrement=True)
    period_start: Mapped[str] = mapped_column(String(10))
    period_end: Mapped[str] = mapped_column(String(10))
    as_of: Mapped[datetime] = mapped_column(UTCDateTime())
    #: tenant × meter rows, and how long summing them took.
    rows: Mapped[int] = mapped_column(Integer)
    seconds: Mapped[float] = mapped_column(Float)
    prepared_by: Mapped[str] = mapped_column(String(255))
    #: The whole period's totals (every row summed), so a page need not sum 200,000 rows.
    total_sent_events: Mapped[int] = mapped_column(BigInteger)
    total_sent_units: Mapped[int] = mapped_column(BigInteger)
    total_pending_events: Mapped[int] = mapped_column(BigInteger)
    total_pending_units: Mapped[int] = mapped_column(BigInteger)
    total_retrying_events: Mapped[int] = mapped_column(BigInteger)
    total_retrying_units: Mapped[int] = mapped_column(BigInteger)
    total_rejected_events: Mapped[int] = mapped_column(BigInteger)
    total_rejected_units: Mapped[int] = mapped_column(BigInteger)
    total_dead_events: Mapped[int] = mapped_column(BigInteger)
    total_dead_units: Mapped[int] = mapped_column(BigInteger)
    total_cancelled_events: Mapped[int] = mapped_column(BigInteger)
    total_cancelled_units: Mapped[int] = mapped_column(BigInteger)
    total_resolved_events: Mapped[int] = mapped_column(BigInteger)
    total_resolved_units: Mapped[int] = mapped_column(BigInteger)
    #: The same totals per meter, as JSON (``{meter: {figure: n}}``, migration 0019): units of
    #: different meters are never added together on the page.
    meter_totals: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        # The newest report of a period.
        Index("ix_usage_reports_period", "period_start", "period_end", "as_of"),
        # The reports past keeping.
        Index("ix_usage_reports_as_of", "as_of"),
    )


class UsageReportRow(Base):
    """A tenant and meter's usage in a report: units and events per status."""

    __tablename__ = "usage_report_rows"

    report_id: Mapped[int] = mapped_column(
        BigID, ForeignKey("usage_reports.id", ondelete="CASCADE"), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(BytewiseText, primary_key=True)
    #: The Stripe customer the row's usage went to (``""``: none yet), migration 0019.
    stripe_customer_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    meter: Mapped[str] = mapped_column(BytewiseText, primary_key=True)
    sent_events: Mapped[int] = mapped_column(BigInteger)
    sent_units: Mapped[int] = mapped_column(BigInteger)
    pending_events: Mapped[int] = mapped_column(BigInteger)
    pending_units: Mapped[int] = mapped_column(BigInteger)
    retrying_events: Mapped[int] = mapped_column(BigInteger)
    retrying_units: Mapped[int] = mapped_column(BigInteger)
    rejected_events: Mapped[int] = mapped_column(BigInteger)
    rejected_units: Mapped[int] = mapped_column(BigInteger)
    dead_events: Mapped[int] = mapped_column(BigInteger)
    dead_units: Mapped[int] = mapped_column(BigInteger)
    cancelled_events: Mapped[int] = mapped_column(BigInteger)
    cancelled_units: Mapped[int] = mapped_column(BigInteger)
    resolved_events: Mapped[int] = mapped_column(BigInteger)
    resolved_units: Mapped[int] = mapped_column(BigInteger)
    #: Pending and retrying events: the page's "waiting" order and filter.
    waiting_events: Mapped[int] = mapped_column(BigInteger)
    #: The tenant's name at that moment: a report is one snapshot, its filters read it
    #: without joining 100,000 tenants.
    name: Mapped[str | None] = mapped_column(String(200))


# A page of a report's rows, largest first, ties by tenant then meter: read in index order.
for _figure in SORTED_FIGURES:
    Index(f"ix_usage_report_rows_{_figure}", UsageReportRow.report_id,
          getattr(UsageReportRow, _figure).desc(), UsageReportRow.tenant_id,
          UsageReportRow.meter)
