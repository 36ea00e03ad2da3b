"""People who sign in to the dashboard: creation, password check and changes, roles, and the
session generation that ends every session of a user at once."""

from __future__ import annotations

import functools
import hmac
import re
import secrets
from datetime import datetime

from sqlalchemy import Connection, Engine, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from werkzeug.security import check_password_hash, generate_password_hash

from . import login_throttle
from .audit import write_audit
from .models import User

ROLES = ("viewer", "operator", "admin")
ROLE_RANK = {role: i for i, role in enumerate(ROLES)}
EMAIL_RE = re.compile(r"^[^@\s]{1,64}@[^@\s]{1,190}\.[^@\s]{1,60}$")
MIN_PASSWORD = 12
MAX_PASSWORD = 1024

#: Passwords (and the words under them: "Password2024!" is "password") that a guesser tries
#: first. Short on purpose: the minimum length does most of the work.
_COMMON = """
password passw0rd p@ssw0rd p@ssword qwerty qwertyuiop qwertz azerty asdfghjkl asdfasdf
zxcvbnm letmein welcome iloveyou admin administrator root changeme default secret monkey
dragon master sunshine princess football baseball superman batman trustno shadow michael
abc abcdef abcdefgh abcdefghijkl login starwars whatever freedom hello helloworld billing
stripe outbox billingoutbox dashboard correcthorsebatterystaple qazwsxedc qwertyuiopasdf
"""
COMMON_PASSWORDS = frozenset(_COMMON.split())
_UNLEET = str.maketrans("@4310$5!7", "aaeiossit")


@functools.cache
def _dummy_hash() -> str:
    """A real hash of a random password, checked when the email is unknown, so a wrong email
    and a wrong password take the same time. Made on first use, not at import: every CLI
    command imports this module."""
    return generate_password_hash("not-a-real-password-4f1c", method="scrypt")


class UserError(ValueError):
    """Bad input for a user; the message says which."""


class WrongPassword(UserError):
    """The current password given to confirm a change was not the user's."""


def password_problem(password: str, email: str = "") -> str | None:
    """Why ``password`` is too weak, in plain words; None when it will do."""
    if len(password) < MIN_PASSWORD:
        return f"The password must be at least {MIN_PASSWORD} characters long."
    if len(password) > MAX_PASSWORD:
        return f"The password must be at most {MAX_PASSWORD} characters long."
    lowered = password.lower()
    if len(set(lowered)) < 4:
        return "The password repeats too few characters; choose a longer phrase."
    # "P@ssw0rd-2024!" is "password": drop what decorates the ends, undo the usual swaps.
    core = re.sub(r"^[\W\d_]+|[\W\d_]+$", "", lowered).translate(_UNLEET)
    words = re.sub(r"[^a-z]+", "", core)
    if lowered in COMMON_PASSWORDS or not words or words in COMMON_PASSWORDS:
        return "That password is among the first ones a guesser tries; choose another."
    local = email.strip().lower().split("@", 1)[0]
    if len(local) >= 4 and local in lowered:
        return "The password must not contain your email address."
    return None


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
    problem = password_problem(password, email)
    if problem:
        raise UserError(problem)
    try:
        return _insert_user(engine, email, password, role, now=now, actor=actor)
    except IntegrityError:  # the same email created at the same moment (a double click)
        raise UserError(f"a user {email} already exists") from None


def _insert_user(engine: Engine, email: str, password: str, role: str, *, now: datetime,
                 actor: str | None) -> int:
    with engine.begin() as conn:
        exists = conn.execute(select(User.id).where(User.email == email)).first()
        if exists:
            raise UserError(f"a user {email} already exists")
        user_id = int(conn.execute(insert(User).values(
            email=email, password_hash=hash_password(password), role=role, active=True,
            created_at=now, password_changed_at=now).returning(User.id)).scalar_one())
        if actor is not None:
            write_audit(conn, actor=actor, action="user_create", note=f"{email} as {role}",
                        now=now)
        return user_id


def authenticate(engine: Engine, email: str, password: str) -> User | None:
    """The active user with this email and password, or None (in constant-ish time)."""
    email = (email or "").strip().lower()
    password = (password or "")[:MAX_PASSWORD]
    with Session(engine, expire_on_commit=False) as db:
        user = db.scalars(select(User).where(User.email == email)).first()
    if user is None:
        check_password_hash(_dummy_hash(), password or "")
        return None
    ok = check_password_hash(user.password_hash, password or "")
    return user if ok and user.active else None


def _change(conn: Connection, user_id: int, **values: object) -> str:
    """Update a user and move their session generation on (every session of theirs ends);
    the user's email. Raises ``UserError`` for an unknown id."""
    email = conn.execute(
        update(User).where(User.id == user_id)
        .values(session_generation=User.session_generation + 1, **values)
        .returning(User.email)).scalar()
    if email is None:
        raise UserError(f"no user with id {user_id}")
    return str(email)


def set_active(engine: Engine, user_id: int, active: bool, *, now: datetime,
               actor: str | None = None) -> str:
    """Activate or deactivate a user; every session of theirs ends either way, so a cookie
    from before a deactivation never comes back with a reactivation. Returns the email.
    Audited when ``actor`` is given. Raises ``UserError`` for an unknown id."""
    with engine.begin() as conn:
        email = _change(conn, user_id, active=active)
        if actor is not None:
            write_audit(conn, actor=actor, action="user_activate" if active
                        else "user_deactivate", note=email, now=now)
    return email


def set_role(engine: Engine, user_id: int, role: str, *, now: datetime, actor: str) -> str:
    """Give a user another role; their sessions end (they sign in again under it)."""
    if role not in ROLES:
        raise UserError(f"role must be one of {', '.join(ROLES)}")
    with engine.begin() as conn:
        old = conn.execute(select(User.role).where(User.id == user_id)).scalar()
        email = _change(conn, user_id, role=role)
        write_audit(conn, actor=actor, action="user_role", note=f"{email}: {old} → {role}",
                    now=now)
    return email


def end_sessions(engine: Engine, user_id: int, *, now: datetime, actor: str,
                 action: str = "user_end_sessions") -> str:
    """End every session of a user at once (log-out, or an admin's "end sessions")."""
    with engine.begin() as conn:
        email = _change(conn, user_id)
        write_audit(conn, actor=actor, action=action, note=email, now=now)
    return email


def change_password(engine: Engine, user_id: int, current: str, new: str, *,
                    now: datetime) -> int:
    """A user changes their own password (the current one is required). Every session of
    theirs ends; returns the new session generation, for the session that made the change.
    Raises ``UserError`` in plain words."""
    with Session(engine, expire_on_commit=False) as db:
        user = db.get(User, user_id)
    if user is None or not user.active:
        raise UserError("This account no longer exists or is deactivated.")
    if not check_password_hash(user.password_hash, current[:MAX_PASSWORD]):
        raise WrongPassword("The current password is not right.")
    if hmac.compare_digest(current.encode(), new.encode()):
        raise UserError("The new password must differ from the current one.")
    problem = password_problem(new, user.email)
    if problem:
        raise UserError(problem)
    with engine.begin() as conn:
        _change(conn, user_id, password_hash=hash_password(new), must_change_password=False,
                password_changed_at=now)
        write_audit(conn, actor=user.email, action="password_change", note=user.email,
                    now=now)
        return int(conn.execute(select(User.session_generation)
                                .where(User.id == user_id)).scalar_one())


def reset_password(engine: Engine, user_id: int, *, now: datetime, actor: str) -> tuple[str, str]:
    """An admin's reset: a new random password, shown once to the admin, that the user must
    change at their next log-in. Every session of theirs ends, and a log-in lock on the
    account is lifted in the same transaction, whichever door the reset came through (the
    users page or the CLI: the way back in for a locked-out person). Returns (email,
    password)."""
    password = secrets.token_urlsafe(12)
    with engine.begin() as conn:
        email = _change(conn, user_id, password_hash=hash_password(password),
                        must_change_password=True, password_changed_at=now)
        login_throttle.clear(conn, login_throttle.account_key(email))
        write_audit(conn, actor=actor, action="password_reset", note=email, now=now)
    return email, password


def user_id_by_email(engine: Engine, email: str) -> int:
    """The id of the user with this email; ``UserError`` if there is none."""
    with engine.connect() as conn:
        found = conn.execute(select(User.id).where(User.email == email.strip().lower())).scalar()
    if found is None:
        raise UserError(f"no user {email.strip().lower()}")
    return int(found)


def record_login(conn: Connection, user_id: int, *, now: datetime) -> None:
    """Remember, in the caller's transaction, when a user last signed in (users page)."""
    conn.execute(update(User).where(User.id == user_id).values(last_login_at=now))


def has_role(role: str | None, needed: str) -> bool:
    return role in ROLE_RANK and ROLE_RANK[role] >= ROLE_RANK[needed]


def same_token(a: str | None, b: str | None) -> bool:
    """Constant-time comparison of two secrets."""
    if not a or not b:
        return False
    return hmac.compare_digest(a.encode(), b.encode())
