"""Signing in and out, sessions, first run, and the headers every response carries."""

from __future__ import annotations

import re

from flask import Flask

from webapp.models import utcnow
from webapp.users import create_user, set_active

from .conftest import CSRF_RE, PASSWORD, csrf_of, login

PAGES = ["/", "/retries", "/tenants", "/tenants/acme", "/tenants.csv", "/mappings",
         "/dead-letters",
         "/dead-letters/groups", "/dead-letters/requeue-all", "/events/1", "/events?q=1",
         "/search?q=key-", "/search?q=nothing-here",
         "/audit", "/audit.csv", "/users"]


def test_first_run_page_when_no_user_exists(app: Flask) -> None:
    client = app.test_client()
    resp = client.get("/")
    assert resp.status_code == 302 and resp.headers["Location"].startswith("/login")
    page = client.get("/login")
    html = page.get_data(as_text=True)
    assert page.status_code == 200
    assert "billing-outbox users create you@example.com --role admin" in html
    assert 'type="password"' not in html  # nobody can log in yet: no form


def test_anonymous_requests_go_to_the_login_page(client_as, seed) -> None:
    seed.event()
    client = client_as(None)
    for path in PAGES:
        resp = client.get(path)
        assert resp.status_code == 302, path
        assert resp.headers["Location"].startswith("/login?next="), path


def test_anonymous_htmx_requests_get_hx_redirect(client_as) -> None:
    client = client_as(None)
    resp = client.get("/dead-letters?tenant=acme", headers={"HX-Request": "true"})
    assert resp.status_code == 401
    assert resp.headers["HX-Redirect"] == "/login?next=/dead-letters?tenant%3Dacme"
    # A poll from a page comes back to that page after logging in, not to the fragment.
    resp = client.get("/dead-letters/groups", headers={
        "HX-Request": "true", "HX-Current-URL": "http://localhost/dead-letters?meter=m"})
    assert resp.headers["HX-Redirect"] == "/login?next=/dead-letters?meter%3Dm"


def test_login_then_back_to_the_page_asked_for(client_as, users) -> None:
    client = client_as(None)
    first = client.get("/audit?action=requeue")
    assert first.status_code == 302
    page = client.get(first.headers["Location"])
    token = CSRF_RE.search(page.get_data(as_text=True)).group(1)
    nxt = re.search(r'name="next" value="([^"]+)"', page.get_data(as_text=True)).group(1)
    resp = client.post("/login", data={"email": users["viewer"], "password": PASSWORD,
                                       "csrf_token": token, "next": nxt.replace("&amp;", "&")})
    assert resp.status_code == 303
    assert resp.headers["Location"] == "/audit?action=requeue"
    assert client.get("/audit").status_code == 200


def test_wrong_password_or_unknown_email(client_as, users) -> None:
    client = client_as(None)
    for email, password in ((users["admin"], "wrong-password-123"),
                            ("nobody@example.com", PASSWORD)):
        resp = login(client, email, password)
        assert resp.status_code == 401
        assert "Wrong email or password" in resp.get_data(as_text=True)
        assert client.get("/").status_code == 302


def test_open_redirects_are_refused(client_as, users) -> None:
    for target in ("//evil.example/x", "https://evil.example/", "/\\evil.example", "javascript:x",
                   "/\t/evil.example", "/\n/evil.example", " //evil.example"):
        client = client_as(None)
        page = client.get("/login")
        token = CSRF_RE.search(page.get_data(as_text=True)).group(1)
        resp = client.post("/login", data={"email": users["viewer"], "password": PASSWORD,
                                           "csrf_token": token, "next": target})
        # Sent to the Overview, or refused outright (a control character): never elsewhere.
        assert resp.status_code in (303, 400), target
        assert resp.headers.get("Location", "/") == "/", target


def test_login_starts_a_fresh_session(client_as, users) -> None:
    """Session fixation: nothing from the anonymous session survives signing in."""
    client = client_as(None)
    before = csrf_of(client, "/login")
    with client.session_transaction() as sess:
        sess["planted"] = "by an attacker"
    resp = client.post("/login", data={"email": users["operator"], "password": PASSWORD,
                                       "csrf_token": before})
    assert resp.status_code == 303
    with client.session_transaction() as sess:
        assert "planted" not in sess
        assert sess["uid"]
        assert sess["csrf"] != before
    assert csrf_of(client) != before


def test_logout_is_a_post_with_csrf(client_as) -> None:
    client = client_as("viewer")
    assert client.get("/logout").status_code == 405
    assert client.post("/logout").status_code == 400          # no token: still signed in
    assert client.get("/").status_code == 200
    resp = client.post("/logout", data={"csrf_token": csrf_of(client)})
    assert resp.status_code == 303
    assert client.get("/").status_code == 302


def test_deactivated_user_is_signed_out_at_the_next_request(client_as, users, engine) -> None:
    client = client_as("operator")
    assert client.get("/").status_code == 200
    with engine.connect() as conn:
        from sqlalchemy import select

        from webapp.models import User

        uid = conn.execute(select(User.id).where(User.email == users["operator"])).scalar_one()
    set_active(engine, uid, False, now=utcnow())
    assert client.get("/").status_code == 302
    assert login(client_as(None), users["operator"]).status_code == 401


def test_security_headers_and_cookie_flags(app: Flask, client_as, users) -> None:
    client = client_as(None)
    page = client.get("/login")
    token = CSRF_RE.search(page.get_data(as_text=True)).group(1)
    resp = client.post("/login", data={"email": users["viewer"], "password": PASSWORD,
                                       "csrf_token": token})
    cookie = resp.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie
    assert ("Secure" in cookie) == bool(app.config["SESSION_COOKIE_SECURE"])
    for path in ("/", "/login", "/metrics", "/healthz"):
        h = client.get(path).headers
        csp = h["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp
        assert "frame-ancestors 'none'" in csp
        assert h["X-Frame-Options"] == "DENY"
        assert h["X-Content-Type-Options"] == "nosniff"
        assert h["Referrer-Policy"] == "same-origin"
    assert client.get("/").headers["Cache-Control"] == "no-store"


def test_pages_have_no_inline_script_or_style(client_as, seed) -> None:
    """The CSP allows only our own files: an inline script, handler or style would be blocked
    in a real browser, so none may be rendered."""
    ev = seed.event(status="dead")
    seed.event(status="sent")
    client = client_as("admin")
    for path in PAGES + [f"/events/{ev}", "/login"]:
        resp = client.get(path)
        if resp.mimetype != "text/html" or resp.status_code != 200:
            continue
        html = resp.get_data(as_text=True)
        for tag in re.findall(r"<script\b[^>]*>", html):
            assert "src=" in tag, (path, tag)
        assert not re.search(r"<style\b", html), path
        assert not re.search(r"\sstyle\s*=", html), path
        assert not re.search(r"\son[a-z]+\s*=", html), path
        if "<html" in html:
            assert '/static/htmx-2.0.11.min.js' in html
            assert "X-CSRF-Token" in html


def test_a_new_user_can_sign_in(client_as, engine) -> None:
    create_user(engine, "New.Person@Example.com", PASSWORD, "viewer", now=utcnow())
    assert login(client_as(None), "new.person@example.com").status_code == 303
