"""What the notifier keeps (migration 0023): the state of each alert kind, so that a change is
announced once however many processes watch it and whatever restarts in between, and each
message to each channel with its own retries."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Index, Integer, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from ..status import DELIVERY_ALL, DELIVERY_PENDING, sql_in
from .base import Base, BigID, UTCDateTime

#: Deliveries still to go: ``ix_notify_deliveries_pending``'s predicate.
_PENDING_SQL = sql_in([DELIVERY_PENDING], known=DELIVERY_ALL)


class NotifyAlert(Base):
    """One alert kind (``holding``, ``dead_letters``, …) as the notifier last saw it. A change
    of ``state`` is written with ``version`` compared and raised, in the same transaction as
    the messages it sends: whoever's update counts sends them, once."""

    __tablename__ = "notify_alerts"

    kind: Mapped[str] = mapped_column(String(40), primary_key=True)
    #: ``ok`` or ``firing``.
    state: Mapped[str] = mapped_column(String(10), server_default="ok")
    version: Mapped[int] = mapped_column(Integer, server_default="0")
    severity: Mapped[str | None] = mapped_column(String(10))
    title: Mapped[str | None] = mapped_column(String(300))
    text: Mapped[str | None] = mapped_column(Text)
    count: Mapped[int | None] = mapped_column(BigInteger)
    #: The dashboard page with the rows it counts (a path; the message carries the full URL).
    path: Mapped[str | None] = mapped_column(String(1000))
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    #: When the last message (the start, or a reminder) was sent for this firing.
    last_sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    #: Firing, but not seen since then: it ends once it stays away long enough.
    clear_since: Mapped[datetime | None] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class NotifyDelivery(Base):
    """One message to one channel: sent, waiting for its next try, or given up."""

    __tablename__ = "notify_deliveries"
    __table_args__ = (
        Index("ix_notify_deliveries_pending", "channel", "id",
              postgresql_where=text(_PENDING_SQL), sqlite_where=text(_PENDING_SQL)),
        Index("ix_notify_deliveries_created", "created_at"),
    )

    id: Mapped[int] = mapped_column(BigID, primary_key=True, autoincrement=True)
    #: The message's id, the same on every channel (the webhook body's ``id``).
    message_id: Mapped[str] = mapped_column(String(40))
    kind: Mapped[str] = mapped_column(String(40))
    #: ``firing``, ``reminder``, ``resolved`` or ``test``.
    event: Mapped[str] = mapped_column(String(10))
    channel: Mapped[str] = mapped_column(String(10))
    #: ``pending``, ``sent`` or ``failed`` (given up).
    status: Mapped[str] = mapped_column(String(10), server_default=DELIVERY_PENDING)
    #: The message as JSON (the webhook body; Slack's and the email's are made from it).
    body: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime())
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    last_error: Mapped[str | None] = mapped_column(String(500))
    #: The receiver's HTTP status (or the SMTP reply code) of the last try.
    last_status: Mapped[int | None] = mapped_column(Integer)
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    claimed_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    claimed_by: Mapped[str | None] = mapped_column(String(255))
