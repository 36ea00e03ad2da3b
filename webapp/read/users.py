"""The Users page, and the reads sign-in needs: who may sign in, with which role."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Engine, func, select

from ..db import reading
from ..outbox.sql import USERS, row_dict


def users_list(engine: Engine) -> list[dict[str, Any]]:
    """Every user (never the password hash)."""
    with reading(engine) as conn:
        return [row_dict(r) for r in conn.execute(
            select(USERS.c.id, USERS.c.email, USERS.c.role, USERS.c.active, USERS.c.created_at,
                   USERS.c.last_login_at, USERS.c.password_changed_at,
                   USERS.c.must_change_password).order_by(USERS.c.email))]


def user_by_id(conn: Connection, user_id: int) -> dict[str, Any] | None:
    """A user's id, email, role, whether they are active, their session generation and
    whether they must change their password; None if there is none."""
    row = conn.execute(select(USERS.c.id, USERS.c.email, USERS.c.role, USERS.c.active,
                              USERS.c.session_generation, USERS.c.must_change_password)
                       .where(USERS.c.id == user_id)).first()
    return dict(row._mapping) if row else None


def signed_in_user(engine: Engine, user_id: int) -> dict[str, Any] | None:
    """:func:`user_by_id` in a snapshot of its own (every request of a signed-in user)."""
    with reading(engine) as conn:
        return user_by_id(conn, user_id)


def user_count(engine: Engine) -> int:
    """How many users exist (none: the first-run page)."""
    with reading(engine) as conn:
        return int(conn.execute(select(func.count()).select_from(USERS)).scalar_one())
