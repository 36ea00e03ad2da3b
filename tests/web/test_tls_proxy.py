"""Through Debian's nginx terminating TLS with a self-signed certificate, configured by the
example the docs ship (``deploy/nginx/billing-outbox.conf``), the app served by gunicorn with
``TRUSTED_PROXIES=1`` and ``SESSION_COOKIE_SECURE=true``: plain http sends people to https; the
log-in works; the session cookie is Secure; every answer carries HSTS; the log-in throttle
counts the address nginx saw, and a client's own ``X-Forwarded-For`` changes nothing.

Clients connect from different loopback addresses (127.0.0.2, 127.0.0.3): nginx sees them
apart, while the app's own peer is always nginx (127.0.0.1)."""

from __future__ import annotations

import http.client
import re
import secrets
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REQUIRE_POSTGRES, cli, worker_env
from sqlalchemy import select
from support.nginx import HOST, Nginx, available
from support.served import served

from webapp import login_throttle
from webapp.db import make_engine
from webapp.models import AuditEntry
from webapp.web.security import INSECURE_TRANSPORT

pytestmark = pytest.mark.slow

EMAIL = "finance@example.com"
PASSWORD = "a long passphrase for the test"
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


@pytest.fixture
def stack(db_url: str, tmp_path: Path) -> Iterator[tuple[Nginx, str, Any]]:
    """(nginx, the app's own address, the engine) with one admin user."""
    reason = available()
    if reason:
        if REQUIRE_POSTGRES:
            pytest.fail(f"REQUIRE_POSTGRES=1 (as in CI) but {reason}")
        pytest.skip(reason)
    env = worker_env(db_url, TRUSTED_PROXIES="1", SESSION_COOKIE_SECURE="true",
                     DRAINER_ENABLED="false", SECRET_KEY=secrets.token_urlsafe(48))
    assert cli("db", "upgrade", env=env).returncode == 0
    made = cli("users", "create", EMAIL, "--role", "admin", "--password-stdin", env=env,
               input=PASSWORD + "\n")
    assert made.returncode == 0, made.stderr
    engine = make_engine(db_url)
    with served(env, tmp_path / "serve.log") as base:
        proxy = Nginx(int(urllib.parse.urlsplit(base).port or 0)).start()
        try:
            yield proxy, base, engine
        finally:
            proxy.stop()
            engine.dispose()


class Answer:
    def __init__(self, resp: http.client.HTTPResponse) -> None:
        self.status = resp.status
        self.headers = resp.headers
        self.body = resp.read().decode(errors="replace")

    def cookie(self) -> str:
        """The session cookie it sets, as ``name=value``."""
        sets = self.headers.get_all("Set-Cookie") or []
        assert sets, f"no cookie set (status {self.status})"
        return sets[-1].split(";", 1)[0]

    def csrf(self) -> str:
        m = CSRF.search(self.body)
        assert m, "the form carries a CSRF field"
        return m.group(1)


def https(proxy: Nginx, method: str, path: str, *, source: str = "127.0.0.2",
          cookie: str | None = None, form: dict[str, str] | None = None,
          headers: dict[str, str] | None = None) -> Answer:
    """One request through nginx over TLS, from loopback address ``source``, the certificate
    checked against the test's own."""
    conn = http.client.HTTPSConnection("127.0.0.1", proxy.tls_port, context=proxy.context(),
                                       source_address=(source, 0), timeout=15)
    h = {"Host": HOST, **(headers or {})}
    body = None
    if cookie:
        h["Cookie"] = cookie
    if form is not None:
        h["Content-Type"] = "application/x-www-form-urlencoded"
        body = urllib.parse.urlencode(form)
    try:
        conn.request(method, path, body=body, headers=h)
        return Answer(conn.getresponse())
    finally:
        conn.close()


def log_in(proxy: Nginx, email: str, password: str, *, source: str,
           headers: dict[str, str] | None = None) -> Answer:
    page = https(proxy, "GET", "/login", source=source)
    assert page.status == 200, page.body[:500]
    return https(proxy, "POST", "/login", source=source, cookie=page.cookie(),
                 form={"email": email, "password": password, "csrf_token": page.csrf()},
                 headers=headers)


def notes(engine: Any) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        return [(a, n or "") for a, n in conn.execute(
            select(AuditEntry.action, AuditEntry.note).order_by(AuditEntry.id))]


def test_plain_http_is_sent_to_https(stack: tuple[Nginx, str, Any]) -> None:
    proxy, _, _ = stack
    conn = http.client.HTTPConnection("127.0.0.1", proxy.http_port, timeout=10)
    try:
        conn.request("GET", "/events?status=dead", headers={"Host": HOST})
        resp = conn.getresponse()
        assert resp.status == 301
        assert resp.headers["Location"] == f"https://{HOST}/events?status=dead"
    finally:
        conn.close()


def test_log_in_over_tls_with_a_secure_cookie_and_hsts(stack: tuple[Nginx, str, Any]) -> None:
    proxy, base, _ = stack
    page = https(proxy, "GET", "/login")
    assert page.status == 200
    assert page.headers["Strict-Transport-Security"] == "max-age=31536000"
    # The app knows the request came over https (nginx's X-Forwarded-Proto, which gunicorn
    # and the app's TRUSTED_PROXIES both take from a proxy on this host): no warning.
    assert INSECURE_TRANSPORT[:40] not in page.body

    done = https(proxy, "POST", "/login", cookie=page.cookie(),
                 form={"email": EMAIL, "password": PASSWORD, "csrf_token": page.csrf()})
    assert done.status == 303, done.body[:500]
    assert not done.headers["Location"].startswith("http:"), done.headers["Location"]
    assert done.headers["Strict-Transport-Security"] == "max-age=31536000"
    cookie_line = (done.headers.get_all("Set-Cookie") or [""])[-1]
    attributes = {a.strip().split("=")[0].lower() for a in cookie_line.split(";")[1:]}
    assert {"secure", "httponly", "samesite"} <= attributes, cookie_line
    assert "samesite=lax" in cookie_line.lower()

    overview = https(proxy, "GET", "/", cookie=done.cookie())
    assert overview.status == 200, overview.body[:500]
    assert EMAIL in overview.body
    assert overview.headers["Strict-Transport-Security"] == "max-age=31536000"

    # The same form straight from the app over plain http, under the public name: the app
    # sees no TLS there and says the cookie will not come back.
    host, port = urllib.parse.urlsplit(base).hostname, urllib.parse.urlsplit(base).port
    conn = http.client.HTTPConnection(host or "", port, timeout=10)
    try:
        conn.request("GET", "/login", headers={"Host": HOST})
        assert INSECURE_TRANSPORT[:40] in conn.getresponse().read().decode()
    finally:
        conn.close()


def test_the_throttle_counts_the_address_nginx_saw(stack: tuple[Nginx, str, Any]) -> None:
    proxy, _, engine = stack
    page = https(proxy, "GET", "/login", source="127.0.0.2")
    cookie, token = page.cookie(), page.csrf()
    limit = login_throttle.ADDRESS.failures
    answers = [https(proxy, "POST", "/login", source="127.0.0.2", cookie=cookie,
                     form={"email": f"guess{i}@example.com", "password": "wrong",
                           "csrf_token": token}).status for i in range(limit)]
    assert answers == [401] * (limit - 1) + [429]

    # The locked address, the right password, and a forged X-Forwarded-For: still refused.
    forged = log_in(proxy, EMAIL, PASSWORD, source="127.0.0.2",
                    headers={"X-Forwarded-For": "203.0.113.50"})
    assert forged.status == 429 and "Retry-After" in forged.headers
    # Another client behind the same proxy is not locked out with it.
    other = log_in(proxy, EMAIL, PASSWORD, source="127.0.0.3")
    assert other.status == 303, other.body[:500]

    audit = notes(engine)
    lockouts = [n for a, n in audit if a == "login_lockout"]
    assert len(lockouts) == 1 and lockouts[0].startswith("address:127.0.0.2 locked"), lockouts
    assert ("login", "from 127.0.0.3") in audit
    assert sum(1 for a, n in audit if a == "login_failure" and n == "from 127.0.0.2") == limit
    assert not [n for _, n in audit if "203.0.113.50" in n or "127.0.0.1" in n], audit
