"""What producers outside this process read (migration 0024): the values the running project
records for them, such as the default meter ``billing_outbox_enqueue`` uses when a caller
names none."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base, UTCDateTime


class OutboxSetting(Base):
    """One value the project records for its producers (``default_meter``: the
    ``STRIPE_METER_EVENT_NAME`` of the last process that started or upgraded the database)."""

    __tablename__ = "outbox_settings"

    name: Mapped[str] = mapped_column(String(50), primary_key=True)
    value: Mapped[str] = mapped_column(String(200))
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime())
