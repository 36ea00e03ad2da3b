"""The outbox: tenants, events, the calls made for them, the sending switch and the
drainers' heartbeats (the rollups of final facts are in :mod:`webapp.models.rollups`)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, Index, Integer, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from ..status import (
    DEAD,
    IN_FLIGHT,
    NOT_WAITING,
    REJECTED,
    RESOLVED,
    SENT,
    SENT_OR_CLAIMED,
    WAITING,
    sql_in,
    sql_not_in,
)
from .base import Base, BigID, UTCDateTime


class Tenant(Base):
    """A customer of ours, mapped to the Stripe customer its usage is billed to."""

    __tablename__ = "billing_tenants"

    tenant_id: Mapped[str] = mapped_column(String(100), primary_key=True)
    name: Mapped[str | None] = mapped_column(String(200))
    stripe_customer_id: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        # Search: the tenants billed to a Stripe customer (migration 0009).
        Index("ix_tenants_customer", "stripe_customer_id",
              postgresql_where=text("stripe_customer_id IS NOT NULL"),
              sqlite_where=text("stripe_customer_id IS NOT NULL")),
    )


#: Partial-index predicates that queries outside this module repeat word for word (so that
#: SQLite, which matches a partial index by the terms of its predicate, can use the index).
IN_FLIGHT_SQL = sql_in(IN_FLIGHT)
#: Waiting: ``ix_outbox_claimable``'s predicate.
CLAIMABLE_SQL = sql_in(WAITING)
#: Pending or retrying, written as the complement of the other statuses: the claim's own
#: predicate is ``status IN ('pending', 'retrying')``, and SQLite must never take this
#: index for the claim's.
WAITING_IDLE_SQL = sql_not_in(NOT_WAITING)
#: Waiting, and billed on a draft invoice: ``ix_outbox_invoice_first``'s predicate, which the
#: claim repeats word for word.
INVOICE_FIRST_SQL = f"{CLAIMABLE_SQL} AND invoice_finalizes_at IS NOT NULL"
#: The variable-length columns ``ix_outbox_dead_errors`` carries, and the most bytes they may
#: hold together for a row to be in it. A B-tree entry must stay under 2,704 bytes or the write
#: that makes it fails; messages are kept up to 2,000 characters (``limits.TEXT_LIMIT``), so a
#: dead row whose texts are longer than this is in ``ix_outbox_dead_outsize`` instead: the two
#: indexes hold every dead row exactly once, and the dead-letter reads ask both.
DEAD_INDEXED_TEXT = ("tenant_id", "meter", "idempotency_key", "last_error_class",
                     "last_error_code", "last_error_message", "dead_reason")
DEAD_INDEXED_BYTES = 2400
_TEXT_BYTES = {"postgresql": "octet_length(coalesce({}, ''))",
               "sqlite": "length(CAST(coalesce({}, '') AS BLOB))"}
#: Per dialect: the indexed texts fit (``ix_outbox_dead_errors``) or do not
#: (``ix_outbox_dead_outsize``). Queries repeat these terms word for word
#: (``outbox.sql.DEAD_FITS``) so that both databases match them to the indexes' predicates.
DEAD_FITS_SQL = {d: " + ".join(f.format(c) for c in DEAD_INDEXED_TEXT)
                 + f" <= {DEAD_INDEXED_BYTES}" for d, f in _TEXT_BYTES.items()}
DEAD_OUTSIZE_SQL = {d: " + ".join(f.format(c) for c in DEAD_INDEXED_TEXT)
                    + f" > {DEAD_INDEXED_BYTES}" for d, f in _TEXT_BYTES.items()}
#: The other predicates, each written once for both dialects.
_NOT_IN_FLIGHT, _RESTING = sql_not_in(IN_FLIGHT), sql_not_in(SENT_OR_CLAIMED)
_SENT, _DEAD, _RESOLVED, _REJECTED = (sql_in([s]) for s in (SENT, DEAD, RESOLVED, REJECTED))


class OutboxEvent(Base):
    """One usage event waiting for, or done with, delivery to Stripe.

    ``status`` is written only by :mod:`webapp.outbox`; see ``webapp.outbox.states`` for what
    moves an event out of each status. On PostgreSQL the table's pages are filled to 90%
    (migration 0016), so that a batch's row versions stay together.
    """

    __tablename__ = "stripe_usage_outbox"

    id: Mapped[int] = mapped_column(BigID, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(String(100))
    meter: Mapped[str] = mapped_column(String(100))
    quantity: Mapped[int] = mapped_column(BigInteger)
    idempotency_key: Mapped[str] = mapped_column(String(100), unique=True)
    occurred_at: Mapped[datetime] = mapped_column(UTCDateTime())
    status: Mapped[str] = mapped_column(String(16))
    attempt_count: Mapped[int] = mapped_column(Integer, default=0)
    # Every call made for this event, including those that do not count toward the budget.
    call_count: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime())
    processing_deadline_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    claim_token: Mapped[str | None] = mapped_column(String(32))
    claimed_by: Mapped[str | None] = mapped_column(String(200))
    # Fixed at the first attempt: a later change of the tenant's mapping must not change what
    # a retry sends (Stripe would answer idempotency_error, or bill the wrong customer).
    stripe_customer_id: Mapped[str | None] = mapped_column(String(255))
    # Generation of the transport idempotency key; bumped after a 5xx, whose saved answer
    # Stripe would otherwise replay for ever.
    key_generation: Mapped[int] = mapped_column(Integer, default=0)
    first_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    first_unknown_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    last_outcome: Mapped[str | None] = mapped_column(String(20))
    last_error_class: Mapped[str | None] = mapped_column(String(100))
    last_error_code: Mapped[str | None] = mapped_column(String(100))
    last_http_status: Mapped[int | None] = mapped_column(Integer)
    last_error_message: Mapped[str | None] = mapped_column(Text)
    last_request_id: Mapped[str | None] = mapped_column(String(255))
    # The identifier Stripe knows the event by when it is not the idempotency key: set when a
    # rejected event is requeued (``<key>~r<n>``, see ``states.requeue_identifier``), since
    # Stripe may still hold the rejected one in its dedupe set.
    stripe_identifier: Mapped[str | None] = mapped_column(String(100))
    identifier_generation: Mapped[int] = mapped_column(Integer, default=0,
                                                       server_default=text("0"))
    # Stripe's asynchronous report that it refused the event after accepting the call.
    rejected_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    reject_code: Mapped[str | None] = mapped_column(String(100))
    reject_message: Mapped[str | None] = mapped_column(Text)
    reject_event_id: Mapped[str | None] = mapped_column(String(255))
    # How the rejection was traced to this event (migration 0018): ``sample`` (a sample named
    # its identifier), ``request`` (a sample named the stream request that carried it, and
    # the rest of what Stripe said singled it out), ``customer`` (Stripe said its customer
    # does not exist, asked when a report counted refusals for missing customers).
    reject_found_by: Mapped[str | None] = mapped_column(String(20))
    cancelled_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    cancelled_by: Mapped[str | None] = mapped_column(String(255))
    cancel_reason: Mapped[str | None] = mapped_column(String(40))
    cancel_note: Mapped[str | None] = mapped_column(Text)
    # What Stripe answered to the cancel (a meter event adjustment, migration 0017): its id
    # where the answer carries one (else the request id of the call), and its status,
    # ``pending`` or ``complete``.
    cancel_adjustment_id: Mapped[str | None] = mapped_column(String(255))
    cancel_adjustment_status: Mapped[str | None] = mapped_column(String(20))
    dead_reason: Mapped[str | None] = mapped_column(Text)
    dead_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    resolved_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    resolved_by: Mapped[str | None] = mapped_column(String(255))
    resolve_reason: Mapped[str | None] = mapped_column(String(40))
    resolve_note: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    #: While the event's period is billed on a draft invoice: when that invoice finalizes.
    #: Set and cleared by the billing refresher (``webapp.outbox.invoices``, migration 0022);
    #: the claim takes these events first, soonest to finalize first.
    invoice_finalizes_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    #: Where the event came from (migration 0026): ``sql`` (``billing_outbox_enqueue``),
    #: ``http:<token name>`` (the ingest API); None: ``enqueue_usage`` in Python, which writes
    #: nothing more for it on the request path.
    source: Mapped[str | None] = mapped_column(String(120))

    __table_args__ = (
        # The claim: an index scan over due rows only, never over everything ever sent.
        Index("ix_outbox_claimable", "next_attempt_at", "id",
              postgresql_where=text(CLAIMABLE_SQL), sqlite_where=text(CLAIMABLE_SQL)),
        # The claim's first part: events a draft invoice still needs (none at most times).
        Index("ix_outbox_invoice_first", "invoice_finalizes_at", "next_attempt_at", "id",
              postgresql_where=text(INVOICE_FIRST_SQL), sqlite_where=text(INVOICE_FIRST_SQL)),
        # The rescuer: expired claims only.
        Index("ix_outbox_processing_deadline", "processing_deadline_at",
              postgresql_where=text(IN_FLIGHT_SQL), sqlite_where=text(IN_FLIGHT_SQL)),
        # A tenant's events, newest first. Events in flight are left out (migration 0005):
        # a claim then writes no entry here; the tenant page adds them from the rescuer's
        # index, where the few of them are.
        Index("ix_outbox_tenant_created", "tenant_id", "created_at",
              postgresql_where=text(_NOT_IN_FLIGHT), sqlite_where=text(_NOT_IN_FLIGHT)),
        # The dashboard's read side (migration 0002; see webapp/queries.py for the queries).
        # Everything not yet sent, covering (on PostgreSQL) the per-status counts, per-tenant
        # usage, retry histograms and 35-day alerts without touching the 95% of rows sent.
        # Events in flight are left out of it and of ix_outbox_waiting_created (migration
        # 0005), as of the tenant index: the reads add them from the rescuer's index.
        Index("ix_outbox_unsent", "status", "occurred_at",
              postgresql_include=["tenant_id", "meter", "quantity", "stripe_customer_id",
                                  "attempt_count", "last_outcome", "last_error_code",
                                  "last_http_status"],
              postgresql_where=text(_RESTING), sqlite_where=text(_RESTING)),
        # One tenant's unsent events (migration 0015): its page's usage and waiting count
        # read the tenant's entries, not every unsent event's. Written at the same status
        # changes as ix_outbox_unsent (none by a claim or a send).
        Index("ix_outbox_unsent_tenant", "tenant_id", "status", "occurred_at",
              postgresql_include=["meter", "quantity"],
              postgresql_where=text(_RESTING), sqlite_where=text(_RESTING)),
        Index("ix_outbox_sent_at", "sent_at",
              postgresql_where=text(_SENT), sqlite_where=text(_SENT)),
        # A customer's sent events on a meter by time (migration 0027): what the invoice-line
        # judge compares one line with, and where it looks for usage on no invoice. Written
        # once per event, by the send that makes it ``sent``.
        Index("ix_outbox_sent_customer", "stripe_customer_id", "meter", "occurred_at",
              postgresql_where=text(_SENT), sqlite_where=text(_SENT)),
        # Pending or retrying (see WAITING_IDLE_SQL).
        Index("ix_outbox_waiting_created", "created_at",
              postgresql_where=text(WAITING_IDLE_SQL), sqlite_where=text(WAITING_IDLE_SQL)),
        Index("ix_outbox_dead", "dead_at", "id",
              postgresql_where=text(_DEAD), sqlite_where=text(_DEAD)),
        Index("ix_outbox_dead_tenant", "tenant_id", "dead_at", "id",
              postgresql_where=text(_DEAD), sqlite_where=text(_DEAD)),
        # The dead-letter groups and text search (migration 0011): on PostgreSQL every column
        # they read or filter on is in the index, so they read it alone (index-only), not one
        # heap page per dead event across the whole table. Rows whose texts would not fit an
        # index entry are in the next index (see DEAD_INDEXED_TEXT).
        Index("ix_outbox_dead_errors", "dead_at", "id",
              postgresql_include=["tenant_id", "meter", "quantity", "occurred_at",
                                  "idempotency_key", "last_error_class", "last_error_code",
                                  "last_http_status", "last_error_message", "dead_reason"],
              postgresql_where=text(f"{_DEAD} AND {DEAD_FITS_SQL['postgresql']}"),
              sqlite_where=text(f"{_DEAD} AND {DEAD_FITS_SQL['sqlite']}")),
        Index("ix_outbox_dead_outsize", "dead_at", "id",
              postgresql_where=text(f"{_DEAD} AND {DEAD_OUTSIZE_SQL['postgresql']}"),
              sqlite_where=text(f"{_DEAD} AND {DEAD_OUTSIZE_SQL['sqlite']}")),
        Index("ix_outbox_resolved", "dead_at", "id",
              postgresql_where=text(_RESOLVED), sqlite_where=text(_RESOLVED)),
        # Rejected events, newest report first (migration 0006).
        Index("ix_outbox_rejected", "rejected_at", "id",
              postgresql_where=text(_REJECTED), sqlite_where=text(_REJECTED)),
        # Error samples name an event by the identifier Stripe has; a requeued rejected
        # event's is its own, unique like the idempotency keys.
        Index("ix_outbox_stripe_identifier", "stripe_identifier", unique=True,
              postgresql_where=text("stripe_identifier IS NOT NULL"),
              sqlite_where=text("stripe_identifier IS NOT NULL")),
        # The events list's source filter (migration 0026): the events of other producers
        # only, so enqueue_usage's inserts never touch it.
        Index("ix_outbox_source", "source", "id",
              postgresql_where=text("source IS NOT NULL"),
              sqlite_where=text("source IS NOT NULL")),
    )

    @property
    def identifier(self) -> str:
        """The identifier Stripe knows this event by."""
        return self.stripe_identifier or self.idempotency_key

    def lane(self) -> tuple[str, str]:
        """The (Stripe customer, meter) pair Stripe allows one concurrent call for."""
        return (self.stripe_customer_id or "", self.meter)


class DeliveryAttempt(Base):
    """One call to Stripe for one event, whatever came of it."""

    __tablename__ = "stripe_usage_attempts"

    id: Mapped[int] = mapped_column(BigID, primary_key=True, autoincrement=True)
    # No foreign key (migration 0004): attempts are written only by ``record_outcomes``, in
    # the transaction that updates their event under its claim, and events are never deleted.
    event_id: Mapped[int] = mapped_column(BigID, index=True)
    attempted_at: Mapped[datetime] = mapped_column(UTCDateTime())
    duration_ms: Mapped[int | None] = mapped_column(Integer)
    worker: Mapped[str | None] = mapped_column(String(200))
    claim_token: Mapped[str | None] = mapped_column(String(32))
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    outcome: Mapped[str] = mapped_column(String(20))
    counted: Mapped[bool] = mapped_column(Boolean, default=True)
    http_status: Mapped[int | None] = mapped_column(Integer)
    stripe_request_id: Mapped[str | None] = mapped_column(String(255))
    error_class: Mapped[str | None] = mapped_column(String(100))
    error_code: Mapped[str | None] = mapped_column(String(100))
    error_message: Mapped[str | None] = mapped_column(Text)
    # False when the worker's claim had been taken over: the outcome was not applied.
    applied: Mapped[bool] = mapped_column(Boolean, default=True)

    __table_args__ = (
        # Failure rates and /metrics read recent calls from the index alone (migration 0002);
        # it serves every range on attempted_at.
        Index("ix_attempts_recent", "attempted_at", "outcome", "duration_ms"),
        # Search: the calls Stripe answered under a request id (migration 0009).
        Index("ix_attempts_request_id", "stripe_request_id",
              postgresql_where=text("stripe_request_id IS NOT NULL"),
              sqlite_where=text("stripe_request_id IS NOT NULL")),
    )


class Control(Base):
    """Process-wide switches every worker reads, such as "sending paused"."""

    __tablename__ = "outbox_control"

    name: Mapped[str] = mapped_column(String(50), primary_key=True)
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    reason: Mapped[str | None] = mapped_column(Text)
    # "operator" (a person paused; only a person resumes) or "systemic" (a probe may resume).
    kind: Mapped[str | None] = mapped_column(String(20))
    changed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    changed_by: Mapped[str | None] = mapped_column(String(255))


class DrainerHeartbeat(Base):
    """What each long-running drainer (a ``worker`` process, the dashboard's in-app job)
    last said about itself, written every few seconds from its loop: whether Stripe is being
    held off (the circuit breaker, kept in the process's memory) and when it last got an
    event through. The dashboard's status line reads these; a row not refreshed for a minute
    belongs to a process that is gone."""

    __tablename__ = "drainer_heartbeats"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    #: ``worker`` or ``app`` (the dashboard's scheduler job).
    kind: Mapped[str] = mapped_column(String(20))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    seen_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    #: Whether it has a Stripe API key (False: it sends nothing).
    can_send: Mapped[bool] = mapped_column(Boolean, default=True)
    #: ``closed``, ``open`` or ``half_open``, and since when it has been holding claims.
    breaker: Mapped[str] = mapped_column(String(20), default="closed")
    holding_since: Mapped[datetime | None] = mapped_column(UTCDateTime())
    next_probe_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    #: What the calls that opened the breaker got (an outcome and HTTP status, no data).
    last_failure: Mapped[str | None] = mapped_column(String(200))
    last_sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    sent_total: Mapped[int] = mapped_column(BigInteger, default=0)
