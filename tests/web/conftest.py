"""Fixtures for the dashboard tests: the app on each backend, users of each role signed in
through the real log-in form, and a ``seed`` helper that writes outbox rows directly."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from conftest import make_settings
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import Engine, func, insert, select
from werkzeug.security import generate_password_hash

import webapp.users
from webapp import create_app
from webapp.models import (
    AuditEntry,
    Control,
    DeliveryAttempt,
    OutboxEvent,
    Tenant,
    User,
    utcnow,
)
from webapp.users import create_user

T = OutboxEvent.__table__
PASSWORD = "correct-horse-battery"
ROLES = ("viewer", "operator", "admin")
CSRF_RE = re.compile(r'name="csrf_token" value="([^"]+)"')


@pytest.fixture(autouse=True)
def fast_hashes(monkeypatch: pytest.MonkeyPatch) -> None:
    """scrypt with small parameters: the same code path, milliseconds instead of a second per
    user (the cost parameters travel in the hash, so checking stays correct)."""
    monkeypatch.setattr(webapp.users, "hash_password",
                        lambda p: generate_password_hash(p, method="scrypt:1024:8:1"))


@pytest.fixture
def app(db_url: str, engine: Engine) -> Flask:
    return create_app({"TESTING": True}, settings=make_settings(db_url), engine=engine,
                      start_drainer=False)


@pytest.fixture
def users(engine: Engine) -> dict[str, str]:
    """One user per role: role → email (password ``PASSWORD``)."""
    out = {}
    for role in ROLES:
        email = f"{role}@example.com"
        create_user(engine, email, PASSWORD, role, now=utcnow())
        out[role] = email
    return out


def login(client: FlaskClient, email: str, password: str = PASSWORD) -> Any:
    """Sign in through the form, as a person would."""
    page = client.get("/login")
    token = CSRF_RE.search(page.get_data(as_text=True))
    assert token, "the log-in form has a CSRF field"
    return client.post("/login", data={"email": email, "password": password,
                                       "csrf_token": token.group(1)})


def csrf_of(client: FlaskClient, path: str = "/") -> str:
    """The session's CSRF token, as the page gives it to the browser."""
    html = client.get(path).get_data(as_text=True)
    found = CSRF_RE.search(html) or re.search(r'"X-CSRF-Token": "([^"]+)"', html)
    assert found, f"{path} carries the CSRF token"
    return found.group(1)


@pytest.fixture
def client_as(app: Flask, users: dict[str, str]) -> Callable[[str | None], FlaskClient]:
    """A fresh test client signed in with ``role`` (None: anonymous)."""

    def make(role: str | None) -> FlaskClient:
        client = app.test_client()
        if role is not None:
            resp = login(client, users[role])
            assert resp.status_code == 303, resp.get_data(as_text=True)[:500]
        return client

    return make


class Seed:
    """Writes outbox rows, attempts and tenants straight into the database."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._keys = itertools.count(1)

    def event(self, **kw: Any) -> int:
        now = kw.pop("now", None) or utcnow()
        status = kw.get("status", "pending")
        n = next(self._keys)
        row: dict[str, Any] = dict(
            tenant_id="acme", meter="api_requests", quantity=1,
            idempotency_key=f"key-{n}-{status}", occurred_at=now, status=status,
            attempt_count=0, call_count=0, next_attempt_at=now, key_generation=0,
            created_at=now, updated_at=now)
        if status == "sent":
            row.update(sent_at=now, attempt_count=1, call_count=1, last_outcome="delivered",
                       first_attempt_at=now)
        if status in ("dead", "resolved"):
            row.update(dead_at=now, dead_reason="No such customer", attempt_count=1,
                       call_count=1, last_outcome="permanent",
                       last_error_class="InvalidRequestError",
                       last_error_code="resource_missing", last_http_status=400,
                       last_error_message="No such customer: 'cus_x'", first_attempt_at=now)
        if status == "resolved":
            row.update(resolved_at=now, resolved_by="someone@example.com",
                       resolve_reason="written_off", resolve_note="seeded")
        if status == "retrying":
            row.update(attempt_count=1, call_count=1, last_outcome="not_executed",
                       last_http_status=429, last_error_code="rate_limit",
                       next_attempt_at=now + timedelta(minutes=5), first_attempt_at=now)
        row.update(kw)
        with self.engine.begin() as conn:
            return int(conn.execute(insert(T).values(**row).returning(T.c.id)).scalar_one())

    def events(self, n: int, **kw: Any) -> list[int]:
        return [self.event(**kw) for _ in range(n)]

    def attempt(self, event_id: int, **kw: Any) -> None:
        row: dict[str, Any] = dict(event_id=event_id, attempted_at=utcnow(), duration_ms=120,
                                   worker="test:1", outcome="delivered", counted=True,
                                   http_status=200, applied=True)
        row.update(kw)
        with self.engine.begin() as conn:
            conn.execute(insert(DeliveryAttempt.__table__).values(**row))

    def tenant(self, tenant_id: str, customer: str | None, name: str | None = None) -> None:
        now = utcnow()
        with self.engine.begin() as conn:
            conn.execute(insert(Tenant.__table__).values(
                tenant_id=tenant_id, name=name, stripe_customer_id=customer, created_at=now,
                updated_at=now))

    def get(self, event_id: int) -> Any:
        with self.engine.connect() as conn:
            return conn.execute(select(T).where(T.c.id == event_id)).one()

    def statuses(self) -> dict[int, str]:
        with self.engine.connect() as conn:
            return dict(conn.execute(select(T.c.id, T.c.status)).all())  # type: ignore[arg-type]

    def audit_count(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(AuditEntry.__table__))
                       .scalar_one())

    def snapshot(self) -> tuple[Any, ...]:
        """Everything a dashboard action could change, for "nothing changed" checks."""
        with self.engine.connect() as conn:
            events = conn.execute(select(T).order_by(T.c.id)).all()
            tenants = conn.execute(select(Tenant.__table__)).all()
            control = conn.execute(select(Control.__table__)).all()
            users = conn.execute(select(User.__table__.c.email, User.__table__.c.active)).all()
            audit = conn.execute(select(AuditEntry.__table__)).all()
        return (events, tenants, control, users, audit)


@pytest.fixture
def seed(engine: Engine) -> Seed:
    return Seed(engine)


@pytest.fixture
def now() -> datetime:
    return utcnow()


__all__ = ["PASSWORD", "ROLES", "Seed", "csrf_of", "login"]
