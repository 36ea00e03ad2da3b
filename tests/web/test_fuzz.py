"""No route answers 5xx to malformed input. Every route of the app's URL map (GET and POST,
POSTs with the session's CSRF token) × every parameter its view declares (``params``'s
registry, ``view.accepts``) plus one it does not × hostile values, and every path part ×
the same values, as each role, on SQLite and PostgreSQL, over seeded rows so pages take
their real paths. Every 5xx (or exception) is collected and reported together.

One app and one client per role for the whole run, so it stays within seconds.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from conftest import make_settings
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import Engine, delete
from werkzeug.security import generate_password_hash

import webapp.users
from webapp import create_app, login_throttle
from webapp.models import utcnow
from webapp.services import services_of
from webapp.users import create_user
from webapp.web.params import declared

from .conftest import PASSWORD, csrf_of, login, seed_every_kind

#: (label, the value as it goes on the wire: already percent-encoded where it must be).
HOSTILE: list[tuple[str, str]] = [
    ("NUL", "%00"),
    ("CRLF", "%0D%0A"),
    ("2**63", str(2**63)),
    ("10**20", str(10**20)),
    ("-1", "-1"),
    ("3,000 characters", "a" * 3000),
    ("bad UTF-8", "%FF%FE"),
    ("raw bad bytes", "\xff\xfe"),  # sent as the bytes FF FE, not escaped
    ("SQL quote", quote("' OR 1=1--", safe="")),
    ("0001-01-01", "0001-01-01"),
    ("9999-12-31", "9999-12-31"),
    ("10000-01-01", "10000-01-01"),
    ("2026-02-30", "2026-02-30"),
    ("cursor past 64 bits", quote(f"2026-01-01T00:00:00Z~{2**64}", safe="")),
    ("cursor at year 1", quote("0001-01-01T00:00:00+01:00~1", safe="")),
    # Digits Python's isdigit() or int() take and a page does not: "²".isdigit() is true but
    # int("²") raises; int() reads "٣" as 3 and "１２" as 12.
    ("superscript ²", quote("²", safe="")),
    ("Arabic-Indic ٣", quote("٣", safe="")),
    ("fullwidth １２", quote("１２", safe="")),
    ("cursor id ٣", quote("2026-01-01T00:00:00Z~٣", safe="")),
]
UNDECLARED = "zz_undeclared"
#: A parameter no view reads takes no parsing path: these few values are enough for it.
UNDECLARED_VALUES = [(label, v) for label, v in HOSTILE
                     if label in ("NUL", "CRLF", "3,000 characters", "bad UTF-8")]
ROLES = (None, "viewer", "operator", "admin")
ID_SENTINEL, TENANT_SENTINEL = 424242424242, "tenant-sentinel"


def seed_rows(seed: Any, engine: Engine) -> dict[str, Any]:
    """A bit of every kind of row (and a day Stripe lost), so pages, filters and actions take
    their real paths."""
    now = utcnow()
    rows = seed_every_kind(seed, now)
    spare = create_user(engine, "spare@example.com", PASSWORD, "viewer", now=now)
    from webapp.outbox.tokens import create_token

    token, _ = create_token(engine, "fuzz-token", actor="test", now=now)
    return {**rows, "sent_id": rows["sent"], "user_id": spare,
            "mismatch_id": seed.lost_day(now), "token_name": token.name}


class Session:
    """One client signed in as ``role`` (None: anonymous) and its CSRF token."""

    def __init__(self, app: Flask, role: str | None) -> None:
        self.app, self.role = app, role
        self.client: FlaskClient = app.test_client()
        self.sign_in()

    def sign_in(self) -> None:
        # The hostile log-ins before this one may have locked the test client's address; the
        # throttle is proven elsewhere (test_login_throttle), here it would only stop the fuzz.
        with services_of(self.app).engine.begin() as conn:
            conn.execute(delete(login_throttle.THROTTLE))
        if self.role is not None:
            assert login(self.client, f"{self.role}@example.com").status_code == 303
        self.token = csrf_of(self.client, "/login" if self.role is None else "/")


def path_cases(rule: Any, sample: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(path, part, label): the rule with sample values, then each path part hostile."""
    values = {}
    for arg in rule.arguments:
        if arg == "tenant_id":
            values[arg] = TENANT_SENTINEL
        else:
            values[arg] = ID_SENTINEL
    template = rule.build(values, append_unknown=False)[1]
    real = {"tenant_id": sample["tenant_id"], "user_id": sample["user_id"],
            "event_id": sample["sent_id"] if "cancel" in rule.endpoint else sample["event_id"],
            "mismatch_id": sample["mismatch_id"], "name": sample["token_name"]}
    valid = template
    for arg in rule.arguments:
        sentinel = TENANT_SENTINEL if arg == "tenant_id" else str(ID_SENTINEL)
        valid = valid.replace(sentinel, quote(str(real[arg]), safe=""))
    yield valid, "", ""
    for arg in rule.arguments:
        sentinel = TENANT_SENTINEL if arg == "tenant_id" else str(ID_SENTINEL)
        for label, value in HOSTILE:
            if label == "raw bad bytes":
                continue  # a path is escaped by the test client; "bad UTF-8" is the same
            hostile = template
            for other in rule.arguments:
                if other != arg:
                    s = TENANT_SENTINEL if other == "tenant_id" else str(ID_SENTINEL)
                    hostile = hostile.replace(s, quote(str(real[other]), safe=""))
            yield hostile.replace(sentinel, value), arg, label


def request_cases(names: list[str], full: bool) -> list[tuple[str, str]]:
    """(what, query or form text): each name with each hostile value when ``full``, else
    every name hostile at once, once per value (what a role refused before parsing, or one
    that takes the same parsing path as the role fuzzed in full, needs)."""
    if full:
        return [(f"{n}={label}", f"{n}={v}") for n in names
                for label, v in (UNDECLARED_VALUES if n == UNDECLARED else HOSTILE)]
    values = HOSTILE if names != [UNDECLARED] else UNDECLARED_VALUES
    return [(f"all={label}", "&".join(f"{n}={v}" for n in names)) for label, v in values]


def fuzz(app: Flask, sample: dict[str, Any]) -> tuple[int, list[str]]:
    """Every case as every role; (requests sent, failures)."""
    sessions = [Session(app, role) for role in ROLES]
    failures: list[str] = []
    sent = 0
    rules = [r for r in app.url_map.iter_rules() if r.endpoint != "static"]
    for rule in sorted(rules, key=lambda r: (r.endpoint == "auth.logout", r.rule)):
        view = app.view_functions[rule.endpoint]
        fields, needed = declared(view), getattr(view, "required_role", None)
        for method in sorted({"GET", "POST"} & set(rule.methods or ())):
            wanted = ("query", "either") if method == "GET" else ("form", "either")
            names = [f.name for f in fields if f.source in wanted] + [UNDECLARED]
            for path, part, part_label in path_cases(rule, sample):
                for session in sessions:
                    # the route's own role gets every parameter × every value on its own
                    cases = (request_cases(names, session.role == needed) if not part
                             else [(f"path {part}={part_label}", f"{UNDECLARED}=x")])
                    for i, (what, encoded) in enumerate(cases):
                        headers = {"HX-Request": "true"} if i % 2 else {}
                        where = (f"{method} {path[:60]} as {session.role or 'anonymous'}: "
                                 f"{what}")
                        sent += 1
                        try:
                            if method == "GET":
                                resp = session.client.get(path, headers=headers, environ_overrides={
                                    "QUERY_STRING": encoded})  # WSGI: bytes as latin-1
                            else:
                                body = f"csrf_token={session.token}&{encoded}"
                                resp = session.client.post(
                                    path, data=body.encode("latin-1"), headers=headers,
                                    content_type="application/x-www-form-urlencoded")
                            resp.get_data()  # a streamed body is read to its end
                        except Exception as exc:  # noqa: BLE001 - collected, reported below
                            failures.append(f"{where}: {type(exc).__name__}: {exc}"[:300])
                            continue
                        if resp.status_code >= 500:
                            failures.append(f"{where}: {resp.status_code}")
                        if rule.endpoint == "auth.logout" and session.role is not None:
                            session.sign_in()
    for thread in threading.enumerate():
        if thread.name == "reconcile-button":
            thread.join(timeout=30)
    return sent, failures


@pytest.fixture
def fuzz_app(db_url: str, engine: Engine, fake_stripe: Any, users: dict[str, str],
             monkeypatch: pytest.MonkeyPatch) -> Flask:
    # An unknown email is checked against a dummy hash of full cost (a tenth of a second):
    # the same path with a cheap one, as the users' own hashes are (``fast_hashes``).
    dummy = generate_password_hash("not-a-real-password", method="scrypt:1024:8:1")
    monkeypatch.setattr(webapp.users, "_dummy_hash", lambda: dummy)
    settings = make_settings(db_url, stripe_api_base=fake_stripe.base_url,
                             stripe_webhook_secret="whsec_fuzz_0123456789abcdef")
    return create_app({"TESTING": True}, settings=settings, engine=engine, start_drainer=False)


@pytest.mark.slow  # seconds of wall time: out of `make check`
def test_no_route_answers_5xx_to_hostile_input(fuzz_app: Flask, seed: Any,
                                               engine: Engine) -> None:
    sample = seed_rows(seed, engine)
    sent, failures = fuzz(fuzz_app, sample)
    assert sent > 2000
    assert failures == [], f"{len(failures)} of {sent} requests failed:\n" + "\n".join(
        failures[:60])
