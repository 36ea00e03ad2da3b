"""The people who use the dashboard, and the audit log of what they did."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, ForeignKey, Integer, String, Text, false
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base, BigID, UTCDateTime


class User(Base):
    """A person who signs in to the dashboard."""

    __tablename__ = "users"

    id: Mapped[int] = mapped_column(BigID, primary_key=True, autoincrement=True)
    email: Mapped[str] = mapped_column(String(254), unique=True)
    password_hash: Mapped[str] = mapped_column(String(255))
    role: Mapped[str] = mapped_column(String(20))
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    last_login_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    #: Bumped by log-out, deactivation, a password change, a role change and "end sessions":
    #: a session cookie names the generation it was issued under and dies when it moves on.
    session_generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    #: Set by an admin's password reset: every page leads to "choose a new password" until then.
    must_change_password: Mapped[bool] = mapped_column(Boolean, default=False,
                                                       server_default=false())
    password_changed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class LoginThrottle(Base):
    """Failed log-ins per account (``account:<email>``) and per client address
    (``address:<ip>``), shared by every process: a lock holds until ``locked_until``."""

    __tablename__ = "login_throttle"

    key: Mapped[str] = mapped_column(String(300), primary_key=True)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    window_started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    locked_until: Mapped[datetime | None] = mapped_column(UTCDateTime())


class AuditEntry(Base):
    """Who did what to which events, and why. Never updated or deleted."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(BigID, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    actor: Mapped[str] = mapped_column(String(255))
    action: Mapped[str] = mapped_column(String(50))
    event_ids: Mapped[str | None] = mapped_column(Text)  # comma-separated ids
    event_count: Mapped[int] = mapped_column(Integer, default=0)
    reason_code: Mapped[str | None] = mapped_column(String(40))
    note: Mapped[str | None] = mapped_column(Text)


class AuditEvent(Base):
    """Links an audit entry to each event it touched, so an event's page can list them."""

    __tablename__ = "audit_log_events"

    audit_id: Mapped[int] = mapped_column(
        BigID, ForeignKey("audit_log.id", ondelete="CASCADE"), primary_key=True)
    event_id: Mapped[int] = mapped_column(BigID, primary_key=True, index=True)
