"""Sessions end on the server: a cookie copied before log-out, deactivation, a password change,
a role change or an admin's "end sessions" opens nothing afterwards; sessions have an idle and
an absolute lifetime; a reset password must be changed before anything else."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import Engine, select

from webapp import login_throttle
from webapp.models import AuditEntry, User, utcnow
from webapp.services import services_of
from webapp.users import password_problem, set_active, set_role

from .conftest import PASSWORD, csrf_of, login

NEW_PASSWORD = "amber-falcon-orchard-71"


def copied_cookie(client: FlaskClient) -> str:
    cookie = client.get_cookie("session")
    assert cookie is not None
    return cookie.value


def replay(app: Flask, cookie: str) -> int:
    """Status of the Overview for a browser that only has ``cookie``."""
    other = app.test_client()
    other.set_cookie("session", cookie)
    return other.get("/").status_code


def user_id(engine: Engine, email: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(User.id).where(User.email == email)).scalar_one())


def test_a_cookie_copied_before_log_out_opens_nothing_after(app, client_as) -> None:
    client = client_as("viewer")
    cookie = copied_cookie(client)
    assert replay(app, cookie) == 200
    client.post("/logout", data={"csrf_token": csrf_of(client)})
    assert replay(app, cookie) == 302
    assert client.get("/").status_code == 302


def test_log_out_ends_the_users_other_sessions_too(app, client_as, users, engine) -> None:
    laptop, phone = client_as("operator"), client_as("operator")
    laptop.post("/logout", data={"csrf_token": csrf_of(laptop)})
    assert phone.get("/").status_code == 302
    with engine.connect() as conn:
        actions = [a for (a,) in conn.execute(select(AuditEntry.action)
                                              .where(AuditEntry.actor == users["operator"]))]
    assert actions.count("logout") == 1 and actions.count("login") == 2


def test_deactivation_then_reactivation_does_not_revive_the_cookie(app, client_as, users,
                                                                    engine) -> None:
    cookie = copied_cookie(client_as("operator"))
    uid = user_id(engine, users["operator"])
    set_active(engine, uid, False, now=utcnow(), actor="admin@example.com")
    set_active(engine, uid, True, now=utcnow(), actor="admin@example.com")
    assert replay(app, cookie) == 302
    assert login(app.test_client(), users["operator"]).status_code == 303  # signs in anew


def test_a_role_change_ends_the_sessions(app, client_as, users, engine) -> None:
    cookie = copied_cookie(client_as("operator"))
    set_role(engine, user_id(engine, users["operator"]), "viewer", now=utcnow(),
             actor="admin@example.com")
    assert replay(app, cookie) == 302


def test_admin_ends_a_users_sessions_from_the_users_page(app, client_as, users,
                                                          engine) -> None:
    victim = client_as("viewer")
    admin = client_as("admin")
    uid = user_id(engine, users["viewer"])
    resp = admin.post(f"/users/{uid}/end-sessions", data={"csrf_token": csrf_of(admin)})
    assert resp.status_code == 303
    assert victim.get("/").status_code == 302
    assert admin.get("/").status_code == 200
    resp = admin.post(f"/users/{user_id(engine, users['admin'])}/end-sessions",
                      data={"csrf_token": csrf_of(admin)}, follow_redirects=True)
    assert "you cannot end the sessions of yourself" in resp.get_data(as_text=True)


def test_admin_changes_a_role_from_the_page(app, client_as, users, engine) -> None:
    victim = client_as("operator")
    admin = client_as("admin")
    uid = user_id(engine, users["operator"])
    resp = admin.post(f"/users/{uid}/role", data={"csrf_token": csrf_of(admin), "role": "viewer"},
                      follow_redirects=True)
    assert "is now viewer" in resp.get_data(as_text=True)
    assert victim.get("/").status_code == 302
    with engine.connect() as conn:
        assert conn.execute(select(User.role).where(User.id == uid)).scalar_one() == "viewer"
        note = conn.execute(select(AuditEntry.note).where(AuditEntry.action == "user_role")
                            ).scalar_one()
    assert note == f"{users['operator']}: operator → viewer"
    bad = admin.post(f"/users/{uid}/role", data={"csrf_token": csrf_of(admin), "role": "root"},
                     follow_redirects=True)
    assert "role must be one of" in bad.get_data(as_text=True)


def test_a_password_change_ends_every_other_session(app, client_as, users) -> None:
    me, elsewhere = client_as("viewer"), client_as("viewer")
    cookie = copied_cookie(me)
    form = {"csrf_token": csrf_of(me), "current_password": PASSWORD,
            "new_password": NEW_PASSWORD, "confirm_password": NEW_PASSWORD}
    resp = me.post("/account/password", data=form)
    assert resp.status_code == 303
    assert me.get("/").status_code == 200            # the session that changed it goes on
    assert elsewhere.get("/").status_code == 302
    assert replay(app, cookie) == 302                 # as does a copy of its old cookie
    assert login(app.test_client(), users["viewer"]).status_code == 401
    assert login(app.test_client(), users["viewer"], NEW_PASSWORD).status_code == 303


@pytest.mark.parametrize(("current", "new", "confirm", "says"), [
    ("wrong-password-here", NEW_PASSWORD, NEW_PASSWORD, "current password is not right"),
    (PASSWORD, NEW_PASSWORD, NEW_PASSWORD + "x", "confirmation differ"),
    (PASSWORD, "short", "short", "at least 12 characters"),
    (PASSWORD, "Password2024!", "Password2024!", "first ones a guesser tries"),
    (PASSWORD, PASSWORD, PASSWORD, "must differ"),
])
def test_a_refused_password_change_says_why_and_changes_nothing(app, client_as, users, current,
                                                                 new, confirm, says) -> None:
    me = client_as("viewer")
    resp = me.post("/account/password", data={
        "csrf_token": csrf_of(me), "current_password": current, "new_password": new,
        "confirm_password": confirm})
    assert resp.status_code == 400 and says in resp.get_data(as_text=True)
    assert me.get("/").status_code == 200
    assert login(app.test_client(), users["viewer"]).status_code == 303


def test_a_reset_from_the_users_page_lifts_the_log_in_lock(app, client_as, users,
                                                          engine) -> None:
    """The same rule as the CLI's reset: a locked-out person gets back in with the temporary
    password an admin reads on the users page."""
    person = app.test_client()
    for _ in range(login_throttle.ACCOUNT.failures):
        login(person, users["operator"], "somebody-guessing")
    assert login(person, users["operator"]).status_code == 429
    admin = client_as("admin")
    page = admin.post(f"/users/{user_id(engine, users['operator'])}/reset-password",
                      data={"csrf_token": csrf_of(admin)})
    temporary = re.search(r'id="temporary-password">([^<]+)<',
                          page.get_data(as_text=True)).group(1)
    resp = login(app.test_client(), users["operator"], temporary)
    assert resp.status_code == 303 and resp.headers["Location"].endswith("/account/password")


def test_an_admin_reset_must_be_changed_at_the_next_log_in(app, client_as, users,
                                                           engine) -> None:
    victim = client_as("operator")
    admin = client_as("admin")
    uid = user_id(engine, users["operator"])
    page = admin.post(f"/users/{uid}/reset-password", data={"csrf_token": csrf_of(admin)})
    html = page.get_data(as_text=True)
    temporary = re.search(r'id="temporary-password">([^<]+)<', html).group(1)
    assert page.status_code == 200 and len(temporary) >= 12
    assert victim.get("/").status_code == 302                   # their sessions ended
    assert admin.get_cookie("session") is not None
    assert temporary not in admin.get_cookie("session").value   # never kept in a cookie

    person = app.test_client()
    resp = login(person, users["operator"], temporary)
    assert resp.status_code == 303 and resp.headers["Location"].endswith("/account/password")
    for path in ("/", "/dead-letters", "/events/1"):
        assert person.get(path).headers.get("Location", "").endswith("/account/password")
    fragment = person.get("/", headers={"HX-Request": "true"})
    assert fragment.headers.get("HX-Redirect", "").endswith("/account/password")
    assert person.post("/logout", data={"csrf_token": csrf_of(person, "/account/password")}
                       ).status_code == 303
    login(person, users["operator"], temporary)
    resp = person.post("/account/password", data={
        "csrf_token": csrf_of(person, "/account/password"), "current_password": temporary,
        "new_password": NEW_PASSWORD, "confirm_password": NEW_PASSWORD})
    assert resp.status_code == 303
    assert person.get("/dead-letters").status_code == 200
    with engine.connect() as conn:
        actions = [a for (a,) in conn.execute(select(AuditEntry.action)
                                              .order_by(AuditEntry.id))]
    assert "password_reset" in actions and "password_change" in actions


def advance(app: Flask, by: timedelta) -> None:
    start = utcnow()
    services_of(app).clock = lambda: start + by


def test_an_idle_session_ends_and_says_why(app, client_as) -> None:
    client = client_as("viewer")
    advance(app, timedelta(minutes=59))
    assert client.get("/").status_code == 200
    advance(app, timedelta(minutes=59 + 61))      # an hour after the last request
    resp = client.get("/", follow_redirects=True)
    assert "signed out after 1 hour without activity" in resp.get_data(as_text=True)


def test_a_page_polling_itself_does_not_keep_an_idle_session_alive(app, client_as) -> None:
    client = client_as("viewer")
    poll = {"HX-Request": "true", "HX-Trigger": "overview-live",
            "HX-Current-URL": "http://localhost/"}
    for minutes in range(5, 60, 5):
        advance(app, timedelta(minutes=minutes))
        assert client.get("/", headers=poll).status_code == 200
    advance(app, timedelta(minutes=61))
    ended = client.get("/", headers=poll)
    assert ended.status_code == 401 and ended.headers["HX-Redirect"].startswith("/login")
    # A person clicking, even inside the live panel, is activity.
    other = client_as("viewer")
    click = {"HX-Request": "true", "HX-Trigger": "pause-form"}
    for minutes in range(50, 200, 50):
        advance(app, timedelta(minutes=minutes))
        assert other.get("/", headers=click).status_code == 200


def test_a_session_ends_at_its_absolute_lifetime_however_busy(app, client_as) -> None:
    client = client_as("viewer")
    for minutes in range(50, 12 * 60, 50):        # a request every 50 minutes
        advance(app, timedelta(minutes=minutes))
        assert client.get("/").status_code == 200, minutes
    advance(app, timedelta(hours=12, minutes=1))
    resp = client.get("/", follow_redirects=True)
    assert "sessions last at most 12 hours" in resp.get_data(as_text=True)


def test_a_forged_or_old_style_cookie_is_just_signed_out(app, client_as) -> None:
    client = client_as("viewer")
    with client.session_transaction() as sess:
        del sess["gen"]
    assert client.get("/").status_code == 302


@pytest.mark.parametrize(("password", "ok"), [
    ("amber-falcon-orchard-71", True),
    ("aaaaaaaaaaaaaaaa", False),
    ("123456789012345", False),
    ("qwertyuiop123", False),
    ("P@ssw0rd-2024!!", False),
    ("viewer@example.com-1", False),
    ("x" * 1025, False),
])
def test_the_password_policy(password: str, ok: bool) -> None:
    assert (password_problem(password, "viewer@example.com") is None) is ok


def test_the_users_page_offers_every_action(client_as) -> None:
    html = client_as("admin").get("/users").get_data(as_text=True)
    for label in ("Set role", "Deactivate", "End sessions", "Reset password",
                  "change your password"):
        assert label in html


Make = Callable[[str | None], FlaskClient]
