"""People who sign in to the dashboard: creation, password check, roles."""

from __future__ import annotations

import functools
import hmac
import re
from datetime import datetime

from sqlalchemy import Engine, insert, select, update
from sqlalchemy.orm import Session
from werkzeug.security import check_password_hash, generate_password_hash

from .audit import write_audit
from .models import User

ROLES = ("viewer", "operator", "admin")
ROLE_RANK = {role: i for i, role in enumerate(ROLES)}
EMAIL_RE = re.compile(r"^[^@\s]{1,64}@[^@\s]{1,190}\.[^@\s]{1,60}$")
MIN_PASSWORD = 12


@functools.cache
def _dummy_hash() -> str:
    """A real hash of a random password, checked when the email is unknown, so a wrong email
    and a wrong password take the same time. Made on first use, not at import: every CLI
    command imports this module."""
    return generate_password_hash("not-a-real-password-4f1c", method="scrypt")


class UserError(ValueError):
    """Bad input for a user; the message says which."""


def hash_password(password: str) -> str:
    """scrypt (werkzeug's default KDF): salted and deliberately slow."""
    return generate_password_hash(password, method="scrypt")


def create_user(engine: Engine, email: str, password: str, role: str, *, now: datetime,
                actor: str | None = None) -> int:
    """Create an active user; its id. Audited when ``actor`` is given. Raises ``UserError``
    for a bad email, role or password, or an email already in use."""
    email = email.strip().lower()
    if not EMAIL_RE.match(email):
        raise UserError(f"not an email address: {email!r}")
    if role not in ROLES:
        raise UserError(f"role must be one of {', '.join(ROLES)}")
    if len(password) < MIN_PASSWORD:
        raise UserError(f"password must be at least {MIN_PASSWORD} characters")
    with engine.begin() as conn:
        exists = conn.execute(select(User.id).where(User.email == email)).first()
        if exists:
            raise UserError(f"a user {email} already exists")
        user_id = int(conn.execute(insert(User).values(
            email=email, password_hash=hash_password(password), role=role, active=True,
            created_at=now).returning(User.id)).scalar_one())
        if actor is not None:
            write_audit(conn, actor=actor, action="user_create", note=f"{email} as {role}",
                        now=now)
        return user_id


def authenticate(engine: Engine, email: str, password: str) -> User | None:
    """The active user with this email and password, or None (in constant-ish time)."""
    email = (email or "").strip().lower()
    with Session(engine, expire_on_commit=False) as db:
        user = db.scalars(select(User).where(User.email == email)).first()
    if user is None:
        check_password_hash(_dummy_hash(), password or "")
        return None
    ok = check_password_hash(user.password_hash, password or "")
    return user if ok and user.active else None


def set_active(engine: Engine, user_id: int, active: bool, *, now: datetime,
               actor: str | None = None) -> str:
    """Activate or deactivate a user (their sessions end at their next request); returns the
    email. Audited when ``actor`` is given. Raises ``UserError`` for an unknown id."""
    with engine.begin() as conn:
        email = conn.execute(update(User).where(User.id == user_id).values(active=active)
                             .returning(User.email)).scalar()
        if email is None:
            raise UserError(f"no user with id {user_id}")
        if actor is not None:
            write_audit(conn, actor=actor, action="user_activate" if active
                        else "user_deactivate", note=str(email), now=now)
    return str(email)


def record_login(engine: Engine, user_id: int, *, now: datetime) -> None:
    """Remember when a user last signed in (shown on the users page)."""
    with engine.begin() as conn:
        conn.execute(update(User).where(User.id == user_id).values(last_login_at=now))


def has_role(role: str | None, needed: str) -> bool:
    return role in ROLE_RANK and ROLE_RANK[role] >= ROLE_RANK[needed]


def same_token(a: str | None, b: str | None) -> bool:
    """Constant-time comparison of two secrets."""
    if not a or not b:
        return False
    return hmac.compare_digest(a.encode(), b.encode())
