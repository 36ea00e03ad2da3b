"""``POST /api/v1/usage`` on SQLite and PostgreSQL: per-event results in order (created,
duplicate, error with the field), every error of a request as a whole as problem+json, the
token's rate, a revoked token, and no session or CSRF: a signed-in browser alone is refused.
The tokens as a user runs them: ``billing-outbox tokens create|list|revoke``, audited."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from conftest import cli, worker_env
from flask import Flask
from sqlalchemy import Engine, select

from webapp.models import AuditEntry, IngestToken, OutboxEvent, utcnow
from webapp.outbox.tokens import create_token, revoke_token
from webapp.read.audit import NOT_SIGN_IN
from webapp.web import api

URL = "/api/v1/usage"


@pytest.fixture(autouse=True)
def fresh_buckets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api, "BUCKETS", api._Buckets())


@pytest.fixture
def token(engine: Engine) -> str:
    return create_token(engine, "orders-service", actor="admin@example.com", now=utcnow())[1]


def post(client: Any, token: str | None, body: Any, *, raw: bytes | None = None,
         content_type: str = "application/json") -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = raw if raw is not None else json.dumps(body)
    return client.post(URL, data=data, headers=headers, content_type=content_type)


def event(key: str, **over: Any) -> dict[str, Any]:
    return {"tenant_id": "acme", "quantity": 3, "idempotency_key": key, **over}


def test_each_event_gets_its_result_in_order(app: Flask, engine: Engine, token: str) -> None:
    client = app.test_client()
    at = (datetime.now(UTC) - timedelta(minutes=5)).replace(microsecond=0)
    first = post(client, token, {"events": [
        event("o:1", occurred_at=at.isoformat().replace("+00:00", "Z")),
        event("o:2", meter="storage_gb"),
        event("o:3", quantity=0),
        event("o:1", occurred_at=at.isoformat()),          # the same again, in the batch
        event("o:2", quantity=4, meter="storage_gb"),       # the same key, other content
        {"tenant_id": "acme", "quantity": 1},               # no key
        event("o:4", occurred_at="yesterday"),
        event("o:5", quantity=2.5),
        event("o:6", colour="blue"),
        "not an object",
    ]})
    assert first.status_code == 200 and first.mimetype == "application/json"
    results = first.get_json()["results"]
    assert [(r["idempotency_key"], r["status"]) for r in results] == [
        ("o:1", "created"), ("o:2", "created"), ("o:3", "error"), ("o:1", "duplicate"),
        ("o:2", "error"), (None, "error"), ("o:4", "error"), ("o:5", "error"),
        ("o:6", "error"), (None, "error")]
    assert results[3]["id"] == results[0]["id"]
    assert [r["error"]["field"] for r in results if r["status"] == "error"] == [
        "quantity", "idempotency_key", "idempotency_key", "occurred_at", "quantity", "colour",
        "event"]
    assert results[2]["error"]["message"] == "must be positive (got 0)"
    assert results[4]["error"]["message"] == (
        f"already names event {results[1]['id']} with a different quantity")
    with engine.connect() as conn:
        rows = {r.idempotency_key: r for r in conn.execute(select(OutboxEvent.__table__))}
    assert set(rows) == {"o:1", "o:2"}
    assert rows["o:1"].occurred_at == at and rows["o:2"].meter == "storage_gb"
    assert rows["o:1"].meter == "api_requests" and rows["o:1"].status == "pending"
    # The whole batch again (a producer's retry): nothing is added.
    again = post(client, token, {"events": [event("o:1", occurred_at=at.isoformat()),
                                            event("o:2", meter="storage_gb")]})
    assert [(r["status"], r["id"]) for r in again.get_json()["results"]] == [
        ("duplicate", results[0]["id"]), ("duplicate", results[1]["id"])]


@pytest.mark.parametrize(("label", "send", "status"), [
    ("no token", lambda c, t: post(c, None, {"events": [event("k")]}), 401),
    ("an unknown token", lambda c, t: post(c, "bo_" + "x" * 43, {"events": [event("k")]}), 401),
    ("not a bearer", lambda c, t: c.post(URL, json={"events": []},
                                         headers={"Authorization": f"Basic {t}"}), 401),
    ("not JSON", lambda c, t: post(c, t, None, raw=b"tenant=acme",
                                   content_type="application/x-www-form-urlencoded"), 415),
    ("malformed JSON", lambda c, t: post(c, t, None, raw=b'{"events": ['), 400),
    ("not an object", lambda c, t: post(c, t, [event("k")]), 400),
    ("no events", lambda c, t: post(c, t, {"events": []}), 400),
    ("1,001 events", lambda c, t: post(c, t, {"events": [event(f"k{i}")
                                                         for i in range(1001)]}), 413),
    ("over 1 MiB", lambda c, t: post(c, t, {"events": [event("k", pad="x" * (1 << 20))]}), 413),
])
def test_request_errors_are_problem_documents(app: Flask, engine: Engine, token: str,
                                              label: str, send: Any, status: int) -> None:
    resp = send(app.test_client(), token)
    assert resp.status_code == status, label
    assert resp.mimetype == "application/problem+json"
    doc = resp.get_json()
    assert doc["status"] == status and doc["title"] and doc["detail"]
    if status == 401:
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    with engine.connect() as conn:
        assert conn.execute(select(OutboxEvent.id)).first() is None


def test_a_revoked_token_is_refused_at_once(app: Flask, engine: Engine, token: str) -> None:
    client = app.test_client()
    assert post(client, token, {"events": [event("r:1")]}).status_code == 200
    revoke_token(engine, "orders-service", actor="admin@example.com", now=utcnow())
    resp = post(client, token, {"events": [event("r:2")]})
    assert resp.status_code == 403 and "revoked" in resp.get_json()["detail"]


def test_past_the_tokens_rate_it_is_told_when_to_come_back(app: Flask, engine: Engine) -> None:
    _, slow = create_token(engine, "slow", rate_per_second=0.5, actor="a", now=utcnow())
    client = app.test_client()
    assert post(client, slow, {"events": [event("s:1")]}).status_code == 200
    refused = post(client, slow, {"events": [event("s:2")]})
    assert refused.status_code == 429
    assert refused.mimetype == "application/problem+json"
    assert int(refused.headers["Retry-After"]) >= 1


def test_a_session_alone_is_refused_and_no_csrf_is_asked(client_as: Any, token: str) -> None:
    admin = client_as("admin")
    resp = admin.post(URL, json={"events": [event("c:1")]})
    assert resp.status_code == 401 and resp.mimetype == "application/problem+json"
    resp = admin.post(URL, json={"events": [event("c:1")]},
                      headers={"Authorization": f"Bearer {token}"})
    assert resp.status_code == 200  # the token counts, the cookie and CSRF play no part
    assert admin.get(URL).status_code == 405
    assert admin.get(URL).mimetype == "application/problem+json"


def test_the_token_records_when_it_was_last_used(app: Flask, engine: Engine,
                                                 token: str) -> None:
    with engine.connect() as conn:
        assert conn.execute(select(IngestToken.last_used_at)).scalar() is None
    post(app.test_client(), token, {"events": [event("u:1")]})
    with engine.connect() as conn:
        assert conn.execute(select(IngestToken.last_used_at)).scalar() is not None


def test_tokens_as_a_user_runs_them(db_url: str, engine: Engine) -> None:
    env = worker_env(db_url)
    made = cli("tokens", "create", "billing-svc", env=env)
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    assert secret.startswith("bo_") and len(secret) == 46
    assert "shown this once" in made.stderr
    again = cli("tokens", "create", "billing-svc", env=env)
    assert again.returncode == 1 and "exists already" in again.stderr
    listed = cli("tokens", "list", "--json", env=env)
    assert secret not in listed.stdout
    [row] = json.loads(listed.stdout)["tokens"]
    assert (row["name"], row["scopes"], row["revoked_at"]) == ("billing-svc", ["ingest"], None)
    assert secret.startswith(row["prefix"])
    assert cli("tokens", "revoke", "billing-svc", env=env).returncode == 0
    twice = cli("tokens", "revoke", "billing-svc", env=env)
    assert twice.returncode == 1 and "revoked already" in twice.stderr
    with engine.connect() as conn:
        stored = conn.execute(select(IngestToken.token_hash)).scalar_one()
        audit = conn.execute(select(AuditEntry.action, AuditEntry.note).where(NOT_SIGN_IN)
                             .order_by(AuditEntry.id)).all()
    assert secret not in stored and len(stored) == 64
    assert [tuple(a) for a in audit] == [("token_create", "billing-svc"),
                                        ("token_revoke", "billing-svc")]


def test_the_dashboard_says_where_each_event_came_from(app: Flask, engine: Engine,
                                                       client_as: Any, token: str) -> None:
    """Python, SQL or an HTTP token: on the event page, and as the events list's filter."""
    from sqlalchemy.orm import Session

    from webapp.outbox import enqueue_usage

    with Session(engine) as s, s.begin():
        py_id = enqueue_usage(s, tenant_id="acme", quantity=1, idempotency_key="py:1").id
    http_id = post(app.test_client(), token, {"events": [event("h:1")]}).get_json()[
        "results"][0]["id"]
    viewer = client_as("viewer")
    page = viewer.get(f"/events/{http_id}").get_data(as_text=True)
    assert "the HTTP API, token “orders-service”" in page
    assert "/events?source=http:orders-service" in page
    assert "Python (enqueue_usage)" in viewer.get(f"/events/{py_id}").get_data(as_text=True)

    def listed(source: str) -> set[int]:
        html = viewer.get(f"/events?source={source}").get_data(as_text=True)
        return {i for i in (py_id, http_id) if f'href="/events/{i}"' in html}

    assert listed("python") == {py_id}
    assert listed("http") == {http_id}
    assert listed("http:orders-service") == {http_id}
    assert listed("http:someone-else") == set()
    assert listed("sql") == set()
    assert viewer.get("/events?source=ftp").status_code == 400
    chips = viewer.get("/events?source=http").get_data(as_text=True)
    assert "from the HTTP API (any token)" in chips
