"""Failed log-ins are throttled per account and per client address, in the database: every
worker and replica sees the same count. While locked even the right password is refused with
429 and ``Retry-After``; every log-in, failure and lock-out is audited."""

from __future__ import annotations

import http.cookiejar
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, stop_process, wait_for, worker_env
from flask import Flask
from sqlalchemy import select

from webapp import login_throttle
from webapp.db import make_engine
from webapp.models import AuditEntry, utcnow
from webapp.services import services_of
from webapp.users import create_user

from .conftest import CSRF_RE, PASSWORD, login


def audit(engine, actor: str) -> list[str]:
    with engine.connect() as conn:
        return [a for (a,) in conn.execute(select(AuditEntry.action)
                                           .where(AuditEntry.actor == actor)
                                           .order_by(AuditEntry.id))]


def client_from(app: Flask, address: str):
    client = app.test_client()
    client.environ_base["REMOTE_ADDR"] = address
    return client


def test_five_failures_lock_the_account_and_the_right_password_waits(app, users,
                                                                     engine) -> None:
    email = users["operator"]
    client = client_from(app, "203.0.113.7")
    for _ in range(login_throttle.ACCOUNT.failures - 1):
        assert login(client, email, "not-the-password").status_code == 401
    locked = login(client, email, "not-the-password")
    assert locked.status_code == 429
    assert 14 * 60 <= int(locked.headers["Retry-After"]) <= 15 * 60
    assert "Try again in 15 minutes" in locked.get_data(as_text=True)

    # Another address, the right password: still refused while the account is locked.
    right = login(client_from(app, "198.51.100.9"), email, PASSWORD)
    assert right.status_code == 429 and "Retry-After" in right.headers
    # Audited when the lock is set; refused tries while locked add no row each.
    assert audit(engine, email) == ["login_failure"] * 5 + ["login_lockout"]
    for _ in range(10):
        assert login(client, email, "still-guessing").status_code == 429
    assert len(audit(engine, email)) == 6

    # Once the lock has passed, the right password gets in and the count starts again.
    start = utcnow()
    services_of(app).clock = lambda: start + timedelta(minutes=16)
    assert login(client_from(app, "198.51.100.9"), email, PASSWORD).status_code == 303
    assert audit(engine, email)[-1] == "login"
    assert login(client_from(app, "198.51.100.9"), email, "wrong-again").status_code == 401


def test_an_unknown_account_is_throttled_the_same_way(app, users, engine) -> None:
    """The answers do not tell which emails exist."""
    client = client_from(app, "203.0.113.8")
    codes = [login(client, "nobody@example.com", "guess-" + str(i)).status_code
             for i in range(6)]
    assert codes == [401, 401, 401, 401, 429, 429]
    assert "login_lockout" in audit(engine, "nobody@example.com")


def test_one_address_guessing_many_accounts_is_locked(app, users, engine) -> None:
    client = client_from(app, "192.0.2.44")
    codes = [login(client, f"guess{i}@example.com", "wrong-password-x").status_code
             for i in range(login_throttle.ADDRESS.failures)]
    assert codes[:-1] == [401] * (login_throttle.ADDRESS.failures - 1) and codes[-1] == 429
    # A real account from that address waits too; from elsewhere it signs in.
    assert login(client, users["viewer"]).status_code == 429
    assert login(client_from(app, "192.0.2.45"), users["viewer"]).status_code == 303


def test_a_success_clears_the_accounts_count(app, users) -> None:
    client = client_from(app, "203.0.113.9")
    for _ in range(4):
        assert login(client, users["viewer"], "nope-nope-nope").status_code == 401
    assert login(client, users["viewer"]).status_code == 303
    fresh = client_from(app, "203.0.113.9")
    assert [login(fresh, users["viewer"], "nope-nope-nope").status_code
            for _ in range(4)] == [401] * 4


# -- across processes ----------------------------------------------------------------------------

class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _attempt(base: str, email: str, password: str) -> int:
    """One log-in as a browser would make it: the form, then the post; a fresh connection and
    cookie jar each time, so the two requests may land on either worker."""
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()), _NoRedirect)
    html = opener.open(base + "/login", timeout=10).read().decode()
    token = CSRF_RE.search(html).group(1)
    body = urllib.parse.urlencode({"email": email, "password": password,
                                   "csrf_token": token}).encode()
    try:
        return int(opener.open(base + "/login", body, timeout=10).status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.mark.slow
def test_throttling_holds_across_two_gunicorn_workers(pg_url: str, tmp_path: Path) -> None:
    from .test_serve import free_port, get

    engine = make_engine(pg_url)
    create_user(engine, "ops@example.com", PASSWORD, "operator", now=utcnow())
    port = free_port()
    env = worker_env(pg_url, None, DRAINER_ENABLED="false", SESSION_COOKIE_SECURE="false",
                     GUNICORN_CMD_ARGS="--access-logformat '%(p)s %(m)s %(U)s %(s)s'")
    log_path = tmp_path / "serve.log"
    log = open(log_path, "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "webapp", "serve", "--port", str(port),
                             "--workers", "2"], env=env, cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    def answered() -> list[tuple[str, str]]:
        """(worker pid, status) of every log-in POST in the access log so far."""
        lines = [line.split() for line in log_path.read_text().splitlines()
                 if " POST /login " in line]
        return [(p[0], p[3]) for p in lines if len(p) == 4]

    try:
        wait_for(lambda: get(base + "/healthz")[0] == 200, 30, message="gunicorn up")
        # Ten wrong passwords at once, spread over both workers: one lock, at the fifth.
        with ThreadPoolExecutor(max_workers=10) as pool:
            codes = list(pool.map(lambda i: _attempt(base, "ops@example.com", f"wrong-{i}-pw"),
                                  range(10)))
            assert set(codes) <= {401, 429} and 429 in codes, codes
            # The right password, ten at a time, until each worker has refused it: the lock
            # is in the database, so both say 429 (which worker takes a connection is up to
            # the kernel, hence the batches).
            wait_for(lambda: len(answered()) >= 10, 10, interval=0.05,
                     message="the wrong guesses in the access log")
            seen = len(answered())
            refused_by: set[str] = set()
            for _ in range(8):
                batch = list(pool.map(lambda _: _attempt(base, "ops@example.com", PASSWORD),
                                      range(10)))
                assert batch == [429] * 10, batch
                wait_for(lambda: len(answered()) >= seen + 10, 10, interval=0.05,
                         message="the batch in the access log")
                later = answered()[seen:]
                assert {status for _, status in later} == {"429"}, later
                refused_by |= {pid for pid, _ in later}
                seen = len(answered())
                if len(refused_by) == 2:
                    break
        assert len(refused_by) == 2, f"both workers refused the right password: {refused_by}"
        with engine.connect() as conn:
            actions = [a for (a,) in conn.execute(select(AuditEntry.action).where(
                AuditEntry.actor == "ops@example.com"))]
        assert actions.count("login_lockout") == 1, actions
        assert actions.count("login_failure") >= login_throttle.ACCOUNT.failures
        assert "login" not in actions
    finally:
        stop_process(proc)
        log.close()
        engine.dispose()


def test_guessing_the_current_password_on_the_password_form_is_throttled(app, client_as, users,
                                                                         engine) -> None:
    """A session alone (a copied cookie, an unlocked laptop) is no way to guess the password:
    the form's current-password check counts against the account like a log-in."""
    from .conftest import csrf_of

    email = users["operator"]
    me = client_as("operator")
    codes = []
    for i in range(login_throttle.ACCOUNT.failures + 1):
        resp = me.post("/account/password", data={
            "csrf_token": csrf_of(me), "current_password": f"guess-{i}-xxxxxxx",
            "new_password": "amber-falcon-orchard-71",
            "confirm_password": "amber-falcon-orchard-71"})
        codes.append(resp.status_code)
    assert codes == [400] * (login_throttle.ACCOUNT.failures - 1) + [429, 429]
    assert "Try again in 15 minutes" in resp.get_data(as_text=True)
    assert "Retry-After" in resp.headers
    # The right current password waits too, and so does a log-in to that account.
    right = me.post("/account/password", data={
        "csrf_token": csrf_of(me), "current_password": PASSWORD,
        "new_password": "amber-falcon-orchard-71", "confirm_password": "amber-falcon-orchard-71"})
    assert right.status_code == 429
    assert login(client_from(app, "198.51.100.20"), email).status_code == 429
    assert audit(engine, email).count("password_change_failure") == login_throttle.ACCOUNT.failures
    assert "login_lockout" in audit(engine, email)
