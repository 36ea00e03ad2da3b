"""Fixtures for the dashboard tests: the app on each backend, users of each role signed in
through the real log-in form, and a ``seed`` helper that writes outbox rows directly."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from conftest import make_settings
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import Engine
from werkzeug.security import generate_password_hash

import webapp.users
from webapp import create_app
from webapp.models import (
    OutboxEvent,
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


def seed_every_kind(seed: Any, now: Any) -> dict[str, Any]:
    """A bit of every kind of row (sent rows and calls old enough to fold, dead, resolved,
    rejected, cancelled, Stripe's side, waiting and claimed): the dead event's id, the newest
    sent one's (``sent``) and a mapped tenant."""
    long_ago = now - timedelta(hours=3)
    seed.tenant("acme", "cus_acme", "Acme")
    seed.tenant("initech", None)
    for i in seed.events(3, status="sent", sent_at=long_ago, occurred_at=long_ago):
        seed.attempt(i, attempted_at=long_ago)
    dead = seed.event(status="dead", idempotency_key="order:1")
    seed.events(2, status="dead", tenant_id="initech")
    seed.event(status="resolved")
    seed.event(status="rejected", rejected_at=now, reject_code="meter_event_customer_not_found",
               reject_message="No such customer: 'cus_acme'", sent_at=long_ago)
    seed.event(status="cancelled", cancelled_at=now, cancel_reason="duplicate",
               cancelled_by="ops@example.com", sent_at=long_ago)
    sent = seed.event(status="sent", sent_at=now)
    seed.stripe_history(now)
    seed.event(status="retrying")
    seed.event(status="pending", tenant_id="initech")
    seed.event(status="processing", processing_deadline_at=now + timedelta(minutes=1),
               claim_token="t", claimed_by="h:1:ab")
    return {"event_id": dead, "sent": sent, "tenant_id": "acme"}


__all__ = ["PASSWORD", "ROLES", "csrf_of", "login", "seed_every_kind"]
