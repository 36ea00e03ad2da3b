"""Transport and what anonymous callers see: the Secure cookie over plain http is explained in
plain words, HSTS goes with Secure cookies, every page keeps its security headers,
``/metrics`` answers only its bearer token when one is set, and no anonymous page says
anything about tenants, the Stripe mode or whether sending is on."""

from __future__ import annotations

import pytest
from conftest import make_settings
from flask import Flask

from webapp import create_app
from webapp.models import utcnow
from webapp.outbox.operations import pause, set_tenant

from .conftest import CSRF_RE

PLAIN = "http://billing.example.com"
TOKEN = "prometheus-scrape-token-0123456789"
HEADERS = {
    "Content-Security-Policy": "frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


def make_app(db_url, engine, **settings) -> Flask:
    config = {"TESTING": True, "SESSION_COOKIE_SECURE": settings.pop("secure", False)}
    return create_app(config, settings=make_settings(db_url, **settings), engine=engine,
                      start_drainer=False)


def test_secure_cookie_over_plain_http_is_explained(db_url, engine, users) -> None:
    app = make_app(db_url, engine, secure=True)
    client = app.test_client()
    page = client.get("/login", base_url=PLAIN)
    html = page.get_data(as_text=True)
    assert "plain http" in html and "SESSION_COOKIE_SECURE" in html
    assert page.headers["Strict-Transport-Security"].startswith("max-age=")
    # The browser drops the Secure cookie over http, so the post arrives without a session.
    token = CSRF_RE.search(html).group(1)
    resp = app.test_client().post("/login", base_url=PLAIN, data={
        "email": users["viewer"], "password": "x" * 12, "csrf_token": token})
    body = resp.get_data(as_text=True)
    assert resp.status_code == 400
    assert "SESSION_COOKIE_SECURE" in body and "security token" not in body

    https = app.test_client().get("/login", base_url="https://billing.example.com")
    assert "plain http" not in https.get_data(as_text=True)
    # Browsers keep Secure cookies for localhost: no warning there.
    local = app.test_client().get("/login", base_url="http://127.0.0.1:8000")
    assert "plain http" not in local.get_data(as_text=True)


def test_no_hsts_without_secure_cookies(db_url, engine) -> None:
    page = make_app(db_url, engine).test_client().get("/login")
    assert "Strict-Transport-Security" not in page.headers
    assert "plain http" not in page.get_data(as_text=True)


def test_every_page_keeps_its_security_headers(app, client_as) -> None:
    client = client_as("admin")
    paths = ["/login", "/healthz", "/metrics"]
    paths += [rule.rule for rule in app.url_map.iter_rules()
              if "GET" in (rule.methods or ()) and not rule.arguments]
    for path in paths:
        resp = client.get(path)
        for name, must in HEADERS.items():
            assert must in resp.headers.get(name, ""), (path, name)


def test_metrics_answers_only_its_token_when_one_is_set(db_url, engine) -> None:
    client = make_app(db_url, engine, metrics_token=TOKEN).test_client()
    assert client.get("/metrics").status_code == 401
    wrong = client.get("/metrics", headers={"Authorization": "Bearer " + TOKEN[:-1] + "x"})
    assert wrong.status_code == 401 and "billing_outbox" not in wrong.get_data(as_text=True)
    assert wrong.headers["WWW-Authenticate"].startswith("Bearer")
    assert client.get("/metrics", headers={"Authorization": "Basic " + TOKEN}
                      ).status_code == 401
    ok = client.get("/metrics", headers={"Authorization": "Bearer " + TOKEN})
    assert ok.status_code == 200 and "billing_outbox_events" in ok.get_data(as_text=True)


def test_metrics_is_open_without_a_token(app) -> None:
    assert app.test_client().get("/metrics").status_code == 200


@pytest.mark.parametrize("paused", [False, True])
def test_anonymous_pages_say_nothing_about_tenants_mode_or_sending(app, engine, users,
                                                                   paused) -> None:
    set_tenant(engine, "tenant-anon-check", stripe_customer_id="cus_ANONCHECK",
               name="Anon Check Co", now=utcnow())
    client = app.test_client()
    if paused:
        pause(engine, actor="ops@example.com", reason="maintenance", now=utcnow())
    for rule in app.url_map.iter_rules():
        if "GET" not in (rule.methods or ()) or rule.arguments or rule.endpoint in (
                "static", "metrics.metrics", "health.health"):  # monitors': METRICS_TOKEN
            continue
        resp = client.get(rule.rule)
        body = resp.get_data(as_text=True)
        assert resp.status_code in (200, 302, 401, 404), (rule.rule, resp.status_code)
        for secret in ("tenant-anon-check", "cus_ANONCHECK", "Anon Check Co", "Stripe test",
                       "Stripe LIVE", "not configured", "Sending", "paused", "maintenance"):
            assert secret not in body, (rule.rule, secret)
