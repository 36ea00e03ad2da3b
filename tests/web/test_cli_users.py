"""``billing-outbox users …``: role changes, deactivation, ending sessions and a password reset
from the command line, each audited as the CLI user; the reset is also how a locked-out admin
gets back in."""

from __future__ import annotations

import re

from conftest import cli, worker_env
from sqlalchemy import select

from webapp import login_throttle
from webapp.models import AuditEntry, User
from webapp.read.audit import NOT_SIGN_IN

from .conftest import PASSWORD, login
from .test_cli import ok, one_line_error


def test_users_commands_change_roles_and_end_sessions(db_url, engine, app, client_as,
                                                      users) -> None:
    env = worker_env(db_url)
    operator = client_as("operator")
    out = ok(cli("users", "set-role", users["operator"], "--role", "viewer", env=env))
    assert "is now viewer" in out.stdout
    assert operator.get("/").status_code == 302
    viewer = client_as("viewer")
    ok(cli("users", "end-sessions", users["viewer"], env=env))
    assert viewer.get("/").status_code == 302
    ok(cli("users", "deactivate", users["viewer"], env=env))
    assert login(app.test_client(), users["viewer"]).status_code == 401
    ok(cli("users", "activate", users["viewer"], env=env))
    assert login(app.test_client(), users["viewer"]).status_code == 303
    one_line_error(cli("users", "end-sessions", "nobody@example.com", env=env),
                   "no user nobody@example.com", code=1)
    with engine.connect() as conn:
        rows = conn.execute(select(AuditEntry.action, AuditEntry.actor).where(NOT_SIGN_IN)
                            .order_by(AuditEntry.id)).all()
    assert [a for a, _ in rows] == ["user_role", "user_end_sessions", "user_deactivate",
                                    "user_activate"]
    assert all(actor.startswith("cli:") for _, actor in rows)


def test_reset_password_lets_a_locked_out_admin_back_in(db_url, engine, app, users) -> None:
    client = app.test_client()
    for _ in range(login_throttle.ACCOUNT.failures):
        login(client, users["admin"], "somebody-guessing")
    assert login(client, users["admin"]).status_code == 429
    out = ok(cli("users", "reset-password", users["admin"], env=worker_env(db_url)))
    temporary = re.search(r"must change it\): (\S+)$", out.stdout.strip()).group(1)
    resp = login(app.test_client(), users["admin"], temporary)
    assert resp.status_code == 303 and resp.headers["Location"].endswith("/account/password")
    assert login(app.test_client(), users["admin"], PASSWORD).status_code == 401
    with engine.connect() as conn:
        assert conn.execute(select(User.must_change_password)
                            .where(User.email == users["admin"])).scalar_one() is True
    assert temporary not in out.stderr
