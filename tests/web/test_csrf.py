"""Every POST needs the session's CSRF token (form field or X-CSRF-Token header): without it,
or with a wrong one, the answer is 400 and nothing changes — even for an admin."""

from __future__ import annotations

import pytest

from webapp.outbox.control import pause_state

from .conftest import csrf_of
from .test_roles import actions, seeded


@pytest.mark.parametrize("token", [None, "", "wrong-token", "other-session"])
def test_missing_or_wrong_token_is_400_and_changes_nothing(token, client_as, seed,
                                                           users) -> None:
    ids = seeded(seed)
    client = client_as("admin")
    if token == "other-session":
        token = csrf_of(client_as("admin"))
    for path, form, _needed in actions(ids, users) + [("/logout", {}, "viewer"),
                                                      ("/login", {"email": users["admin"],
                                                                  "password": "x"}, "viewer")]:
        before = seed.snapshot()
        data = dict(form)
        if token is not None:
            data["csrf_token"] = token
        resp = client.post(path, data=data)
        assert resp.status_code == 400, (path, resp.status_code)
        assert seed.snapshot() == before, path
    assert client.get("/").status_code == 200  # still signed in


def test_htmx_header_token_is_accepted(client_as, engine) -> None:
    client = client_as("operator")
    token = csrf_of(client)
    resp = client.post("/sending/pause", data={"reason": "via htmx"},
                       headers={"HX-Request": "true", "X-CSRF-Token": token})
    assert resp.status_code == 303
    with engine.connect() as conn:
        assert pause_state(conn).paused


def test_wrong_header_token_is_refused(client_as, engine) -> None:
    client = client_as("operator")
    resp = client.post("/sending/pause", data={"reason": "x"},
                       headers={"HX-Request": "true", "X-CSRF-Token": "nope"})
    assert resp.status_code == 400
    with engine.connect() as conn:
        assert not pause_state(conn).paused
