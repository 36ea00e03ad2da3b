"""What producers outside this process use: the values the running project records for them,
such as the default meter ``billing_outbox_enqueue`` uses when a caller names none (migration
0024), and the tokens of the HTTP ingest API (0025)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Float, String
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base, BigID, UTCDateTime


class OutboxSetting(Base):
    """One value the project records for its producers (``default_meter``: the
    ``STRIPE_METER_EVENT_NAME`` of the last process that started or upgraded the database)."""

    __tablename__ = "outbox_settings"

    name: Mapped[str] = mapped_column(String(50), primary_key=True)
    value: Mapped[str] = mapped_column(String(200))
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime())


class IngestToken(Base):
    """A bearer token for ``POST /api/v1/usage``: only its SHA-256 is kept (the token is shown
    once, when it is made); revoked tokens stay, so the audit and the events keep its name."""

    __tablename__ = "ingest_tokens"

    id: Mapped[int] = mapped_column(BigID, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    #: Hex SHA-256 of the token.
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    #: The token's first characters, to tell tokens apart on screen.
    prefix: Mapped[str] = mapped_column(String(16))
    #: Comma-separated scopes (``ingest``).
    scopes: Mapped[str] = mapped_column(String(200))
    #: Requests a second this token may make (per serving process).
    rate_per_second: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    created_by: Mapped[str] = mapped_column(String(255))
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    revoked_by: Mapped[str | None] = mapped_column(String(255))
