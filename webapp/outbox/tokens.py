"""The HTTP ingest API's bearer tokens: made (shown once), listed, revoked, each change in the
audit log; checked on every request by their SHA-256, compared in constant time.

A token is ``bo_`` and 43 characters of ``secrets.token_urlsafe(32)``: 256 random bits, so a
plain SHA-256 of it is as good as a slow password hash and cheap to check per request."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, select
from sqlalchemy import update as sa_update

from ..audit import write_audit
from ..db import reading
from .ids import text_problem
from .sql import INGEST_TOKENS as K

PREFIX = "bo_"
SCOPES = ("ingest",)
#: Requests a second a token may make by default (per serving process).
DEFAULT_RATE = 50.0


class TokenError(ValueError):
    """A token change that cannot be made; the message says why."""


@dataclass(frozen=True)
class Token:
    id: int
    name: str
    prefix: str
    scopes: tuple[str, ...]
    rate_per_second: float
    created_at: datetime
    created_by: str
    last_used_at: datetime | None
    revoked_at: datetime | None
    revoked_by: str | None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _token(row: object) -> Token:
    from .sql import as_utc

    r = row._mapping  # type: ignore[attr-defined]
    return Token(r["id"], r["name"], r["prefix"], tuple(s for s in r["scopes"].split(",") if s),
                 float(r["rate_per_second"]), as_utc(r["created_at"]) or r["created_at"],
                 r["created_by"], as_utc(r["last_used_at"]), as_utc(r["revoked_at"]),
                 r["revoked_by"])


def create_token(engine: Engine, name: str, *, scopes: tuple[str, ...] = SCOPES,
                 rate_per_second: float = DEFAULT_RATE, actor: str,
                 now: datetime) -> tuple[Token, str]:
    """Make a token named ``name``; the token itself is returned this once and never kept."""
    problem = text_problem(name)
    if problem:
        raise TokenError(f"the name {problem}")
    unknown = [s for s in scopes if s not in SCOPES]
    if unknown or not scopes:
        raise TokenError(f"unknown scope {', '.join(unknown) or '(none)'}; the scopes are "
                         + ", ".join(SCOPES))
    if not 0.1 <= rate_per_second <= 10_000:
        raise TokenError("the rate must be from 0.1 to 10,000 requests a second")
    secret = PREFIX + secrets.token_urlsafe(32)
    with engine.begin() as conn:
        if conn.execute(select(K.c.id).where(K.c.name == name)).first() is not None:
            raise TokenError(f"a token named {name!r} exists already (names stay after a "
                             "revoke, so the audit log keeps meaning)")
        token_id = conn.execute(K.insert().values(
            name=name, token_hash=digest(secret), prefix=secret[:10], scopes=",".join(scopes),
            rate_per_second=rate_per_second, created_at=now, created_by=actor)
            .returning(K.c.id)).scalar_one()
        write_audit(conn, actor=actor, action="token_create", reason_code=",".join(scopes),
                    note=name, now=now)
        row = conn.execute(select(K).where(K.c.id == token_id)).one()
    return _token(row), secret


def list_tokens(engine: Engine) -> list[Token]:
    with reading(engine) as conn:
        return [_token(r) for r in conn.execute(select(K).order_by(K.c.name))]


def revoke_token(engine: Engine, name: str, *, actor: str, now: datetime) -> Token:
    """Revoke ``name`` at once (its next request is refused); a second revoke is refused."""
    if text_problem(name):
        raise TokenError(f"no token is named {name[:40]!r}")
    with engine.begin() as conn:
        row = conn.execute(select(K).where(K.c.name == name)).first()
        if row is None:
            raise TokenError(f"no token is named {name!r}")
        if row.revoked_at is not None:
            raise TokenError(f"the token {name!r} is revoked already")
        conn.execute(sa_update(K).where(K.c.id == row.id, K.c.revoked_at.is_(None))
                     .values(revoked_at=now, revoked_by=actor))
        write_audit(conn, actor=actor, action="token_revoke", note=name, now=now)
        return _token(conn.execute(select(K).where(K.c.id == row.id)).one())


def find_token(engine: Engine, presented: str) -> Token | None:
    """The token ``presented`` is, revoked or not; None when it is no token of ours."""
    if not presented.startswith(PREFIX) or len(presented) > 200:
        return None
    wanted = digest(presented)
    with engine.connect() as conn:
        row = conn.execute(select(K).where(K.c.token_hash == wanted)).first()
    if row is None or not hmac.compare_digest(row.token_hash, wanted):
        return None
    return _token(row)


def mark_used(engine: Engine, token_id: int, *, now: datetime) -> None:
    with engine.begin() as conn:
        conn.execute(sa_update(K).where(K.c.id == token_id).values(last_used_at=now))
