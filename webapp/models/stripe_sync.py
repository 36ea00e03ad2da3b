"""What the outbox keeps of Stripe's side: its meters, the events it reported (error
reports and their samples), where each periodic exchange stands, and reconciliation runs."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, Float, ForeignKey, Index, Integer, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base, BigID, UTCDateTime


class StripeMeter(Base):
    """A meter as Stripe last listed it, by the event name events are sent with. A meter no
    longer listed is kept as ``missing``: its events wait, visibly, until it exists again."""

    __tablename__ = "stripe_meters"

    event_name: Mapped[str] = mapped_column(String(100), primary_key=True)
    meter_id: Mapped[str | None] = mapped_column(String(255))
    display_name: Mapped[str | None] = mapped_column(String(255))
    #: ``active``, ``inactive`` (at Stripe), or ``missing`` (not listed, or Stripe said so).
    status: Mapped[str] = mapped_column(String(20))
    customer_key: Mapped[str] = mapped_column(String(100))
    value_key: Mapped[str] = mapped_column(String(100))
    #: ``sum``, ``count`` or ``last`` (``default_aggregation.formula``).
    formula: Mapped[str] = mapped_column(String(20))
    #: ``day`` or ``hour`` for a pre-aggregated meter (Stripe keeps one value per customer and
    #: window, the last one sent): its events are not sent, they wait (migration 0017).
    event_time_window: Mapped[str | None] = mapped_column(String(20))
    seen_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class SyncState(Base):
    """Where one periodic exchange with Stripe stands (``meters``, ``events``, ``reconcile``):
    when it last ran, whether it went well, and a lease so one process at a time runs it."""

    __tablename__ = "stripe_sync_state"

    name: Mapped[str] = mapped_column(String(50), primary_key=True)
    ran_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    ok: Mapped[bool | None] = mapped_column(Boolean)
    detail: Mapped[str | None] = mapped_column(Text)
    locked_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    locked_by: Mapped[str | None] = mapped_column(String(200))


class StripeEvent(Base):
    """One Stripe event (API v2) the outbox read, stored once by its id, with what applying
    it did."""

    __tablename__ = "stripe_events"

    id: Mapped[str] = mapped_column(String(255), primary_key=True)
    type: Mapped[str] = mapped_column(String(100))
    created: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    meter_id: Mapped[str | None] = mapped_column(String(255))
    #: ``poll`` or ``webhook``: how it reached the outbox first.
    source: Mapped[str] = mapped_column(String(20))
    stored_at: Mapped[datetime] = mapped_column(UTCDateTime())
    #: Errors Stripe counted, and how many it sampled (samples are samples: fewer).
    error_count: Mapped[int] = mapped_column(Integer, default=0)
    sample_count: Mapped[int] = mapped_column(Integer, default=0)
    rejected: Mapped[int] = mapped_column(Integer, default=0)
    unmatched: Mapped[int] = mapped_column(Integer, default=0)
    summary: Mapped[str | None] = mapped_column(Text)
    #: The whole event as JSON, kept for the record (``webapp.models.limits``: what is kept).
    body: Mapped[str | None] = mapped_column(Text, info={"max_chars": 65536})


class StripeErrorSample(Base):
    """One sample error of a Stripe error report, and what became of it here."""

    __tablename__ = "stripe_error_samples"

    id: Mapped[int] = mapped_column(BigID, primary_key=True, autoincrement=True)
    stripe_event_id: Mapped[str] = mapped_column(String(255), index=True)
    code: Mapped[str | None] = mapped_column(String(100))
    message: Mapped[str | None] = mapped_column(Text)
    identifier: Mapped[str | None] = mapped_column(String(255))
    event_id: Mapped[int | None] = mapped_column(BigID, index=True)
    #: ``rejected`` (applied), ``waiting`` (its event is not sent yet: applied once it is),
    #: ``already`` (already rejected, cancelled or resolved), ``stale`` (an identifier the
    #: event no longer goes by), ``unmatched`` (no event of ours).
    outcome: Mapped[str] = mapped_column(String(20))
    at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        Index("ix_samples_waiting", "id", postgresql_where=text("outcome = 'waiting'"),
              sqlite_where=text("outcome = 'waiting'")),
    )


class StreamRequest(Base):
    """One meter event stream request that may have reached Stripe (migration 0017): the
    ``Idempotency-Key`` it was sent with, which Stripe's error reports may name instead of an
    event's identifier, and the events it carried. One row per request of up to 100 events,
    written in the transaction that records their outcomes."""

    __tablename__ = "stripe_stream_requests"

    idempotency_key: Mapped[str] = mapped_column(String(255), primary_key=True)
    stripe_request_id: Mapped[str | None] = mapped_column(String(255))
    sent_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    #: The outbox ids of the events it carried, comma-separated, in the request's order.
    event_ids: Mapped[str] = mapped_column(Text)
    events: Mapped[int] = mapped_column(Integer)


class StripeCustomerCheck(Base):
    """What Stripe last said of one customer (``GET /v1/customers/{id}``, migration 0018):
    ``active``, ``deleted`` or ``missing`` (Stripe has no such customer). Kept so that every
    process asks Stripe about a customer at most once per ``STRIPE_METERS_REFRESH_SECONDS``:
    before a mapping, and when an error report says a customer was not found."""

    __tablename__ = "stripe_customer_checks"

    customer_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    state: Mapped[str] = mapped_column(String(20))
    name: Mapped[str | None] = mapped_column(String(255))
    checked_at: Mapped[datetime] = mapped_column(UTCDateTime())
    #: Stripe's request id of the answer, to quote to Stripe.
    request_id: Mapped[str | None] = mapped_column(String(255))


class ReconciliationRun(Base):
    """One comparison of the units sent with Stripe's meter event summaries."""

    __tablename__ = "reconciliation_runs"

    id: Mapped[int] = mapped_column(BigID, primary_key=True, autoincrement=True)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    since: Mapped[datetime] = mapped_column(UTCDateTime())
    until: Mapped[datetime] = mapped_column(UTCDateTime())
    tenant_id: Mapped[str | None] = mapped_column(String(100))
    #: ``schedule``, ``button`` or ``cli``.
    trigger: Mapped[str] = mapped_column(String(20))
    actor: Mapped[str | None] = mapped_column(String(255))
    buckets_checked: Mapped[int] = mapped_column(Integer, default=0)
    pending: Mapped[int] = mapped_column(Integer, default=0)
    mismatches: Mapped[int] = mapped_column(Integer, default=0)
    calls: Mapped[int] = mapped_column(Integer, default=0)
    ok: Mapped[bool] = mapped_column(Boolean, default=False)
    # JSON lists of text (``webapp.models.limits.fit_json_list``: how much is kept).
    errors: Mapped[str | None] = mapped_column(Text, info={"max_chars": 20000})
    notes: Mapped[str | None] = mapped_column(Text, info={"max_chars": 20000})  # skipped meters…


class ReconciledDay(Base):
    """What reconciliation last found for one customer, meter and whole UTC day it compared
    (migration 0020): ours (units; events for a ``count`` meter) and Stripe's summary, matched
    or not. Usage rows show Stripe's figure beside ours from these; a day not compared (too
    young, or holding an event whose outcome is not known yet) has no row."""

    __tablename__ = "reconciled_days"

    stripe_customer_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    meter: Mapped[str] = mapped_column(String(100), primary_key=True)
    day: Mapped[str] = mapped_column(String(10), primary_key=True)
    formula: Mapped[str] = mapped_column(String(20))
    ours: Mapped[int] = mapped_column(BigInteger)
    stripe: Mapped[float] = mapped_column(Float)
    compared_at: Mapped[datetime] = mapped_column(UTCDateTime())
    run_id: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (
        # Whether any day of a stretch was compared (a period's plan, as the usage rollups').
        Index("ix_reconciled_days_day", "day"),
    )


class ReconciledMonth(Base):
    """The compared days of one customer, meter and UTC month added up (written with them):
    a month of 100,000 customers reads 200,000 rows, not six million."""

    __tablename__ = "reconciled_months"

    stripe_customer_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    meter: Mapped[str] = mapped_column(String(100), primary_key=True)
    month: Mapped[str] = mapped_column(String(7), primary_key=True)
    ours: Mapped[int] = mapped_column(BigInteger)
    stripe: Mapped[float] = mapped_column(Float)
    days: Mapped[int] = mapped_column(Integer)
    compared_at: Mapped[datetime] = mapped_column(UTCDateTime())


class ReconciledMeterDay(Base):
    """Every customer's compared day of one meter added up (migration 0021, written with the
    days): a period's per-meter figures read a row per meter and day."""

    __tablename__ = "reconciled_meter_days"

    meter: Mapped[str] = mapped_column(String(100), primary_key=True)
    day: Mapped[str] = mapped_column(String(10), primary_key=True)
    ours: Mapped[int] = mapped_column(BigInteger)
    stripe: Mapped[float] = mapped_column(Float)
    customer_days: Mapped[int] = mapped_column(Integer)
    compared_at: Mapped[datetime] = mapped_column(UTCDateTime())


class ReconciliationMismatch(Base):
    """A bucket where Stripe's total and ours differ."""

    __tablename__ = "reconciliation_mismatches"

    id: Mapped[int] = mapped_column(BigID, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(
        BigID, ForeignKey("reconciliation_runs.id", ondelete="CASCADE"), index=True)
    tenant_id: Mapped[str] = mapped_column(String(400))
    stripe_customer_id: Mapped[str] = mapped_column(String(255))
    meter: Mapped[str] = mapped_column(String(100))
    formula: Mapped[str] = mapped_column(String(20))
    start: Mapped[datetime] = mapped_column(UTCDateTime())
    end: Mapped[datetime] = mapped_column(UTCDateTime())
    local_units: Mapped[int] = mapped_column(BigInteger)
    stripe_units: Mapped[float] = mapped_column(Float)
    difference: Mapped[float] = mapped_column(Float)
