"""The ingest tokens page (admins): a token made there is shown once, in the answer to the
form only (never in a redirect, a flash or the cookie); the list never shows it; a revoke
refuses the token's next request; everything audited, every form CSRF-checked."""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import Engine, select

from webapp.models import AuditEntry
from webapp.read.audit import NOT_SIGN_IN

from .conftest import csrf_of


def test_an_admin_makes_a_token_sees_it_once_and_revokes_it(client_as: Any,
                                                            engine: Engine) -> None:
    admin = client_as("admin")
    resp = admin.post("/tokens", data={"name": "orders-service", "rate": "20",
                                       "csrf_token": csrf_of(admin, "/tokens")})
    assert resp.status_code == 200
    assert resp.headers["Cache-Control"] == "no-store"
    html = resp.get_data(as_text=True)
    secret = re.search(r'id="token-value">(bo_[A-Za-z0-9_-]+)<', html)
    assert secret, html[:2000]
    token = secret.group(1)
    assert "Set-Cookie" not in resp.headers or token not in resp.headers["Set-Cookie"]
    later = admin.get("/tokens").get_data(as_text=True)
    assert token not in later
    assert 'data-name="orders-service" data-state="active"' in later
    assert token[:10] + "…" in later
    api = admin.application.test_client()
    ok = api.post("/api/v1/usage", json={"events": [
        {"tenant_id": "acme", "quantity": 1, "idempotency_key": "p:1"}]},
        headers={"Authorization": f"Bearer {token}"})
    assert ok.status_code == 200
    revoked = admin.post("/tokens/orders-service/revoke",
                         data={"csrf_token": csrf_of(admin, "/tokens")})
    assert revoked.status_code == 303
    after = admin.get("/tokens").get_data(as_text=True)
    assert "Revoked &#39;orders-service&#39;" in after or "Revoked 'orders-service'" in after
    assert 'data-state="revoked"' in after
    assert api.post("/api/v1/usage", json={"events": [
        {"tenant_id": "acme", "quantity": 1, "idempotency_key": "p:2"}]},
        headers={"Authorization": f"Bearer {token}"}).status_code == 403
    with engine.connect() as conn:
        actions = conn.execute(select(AuditEntry.action, AuditEntry.actor).where(NOT_SIGN_IN)
                               .order_by(AuditEntry.id)).all()
    assert [tuple(a) for a in actions] == [("token_create", "admin@example.com"),
                                          ("token_revoke", "admin@example.com")]


def test_only_admins_and_only_with_the_forms_token(client_as: Any) -> None:
    for role in ("viewer", "operator"):
        c = client_as(role)
        assert c.get("/tokens").status_code == 403
        assert c.post("/tokens", data={"name": "x", "csrf_token": csrf_of(c)}).status_code == 403
    admin = client_as("admin")
    assert admin.post("/tokens", data={"name": "no-csrf"}).status_code == 400
    dup = {"name": "twice", "csrf_token": csrf_of(admin, "/tokens")}
    assert admin.post("/tokens", data=dup).status_code == 200
    again = admin.post("/tokens", data=dup)
    assert again.status_code == 303
    assert "exists already" in admin.get("/tokens").get_data(as_text=True)
    assert admin.post("/tokens/nobody/revoke",
                      data={"csrf_token": csrf_of(admin, "/tokens")}).status_code == 303
    assert "no token is named" in admin.get("/tokens").get_data(as_text=True)
