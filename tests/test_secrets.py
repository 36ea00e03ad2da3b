"""Secrets: a weak SECRET_KEY stops every command outside debug and the embedded default, with
one line naming it; passwords, hashes, API keys, webhook secrets and tokens never reach a log
line or an error page, whichever logger and handler writes it."""

from __future__ import annotations

import io
import logging
import secrets
from collections.abc import Iterator

import pytest
from conftest import cli, make_settings, worker_env
from sqlalchemy import insert
from sqlalchemy.exc import IntegrityError

from webapp import create_app
from webapp.config import ConfigError, Settings
from webapp.db import make_engine
from webapp.env_values import secret_key_problem
from webapp.logging_setup import REDACTOR, Redactor
from webapp.models import User, utcnow
from webapp.users import hash_password

API_KEY = "sk_live_51HqLyjWDarjtT1zdp7dcXYZabcdefgh"
WEBHOOK = "whsec_Xy12Ab34Cd56Ef78Gh90ijkl"
TOKEN = "metrics-token-abcdefghijkl-0123"
STRONG = secrets.token_urlsafe(48)


@pytest.mark.parametrize(("key", "names"), [
    ("changeme", "too short"),
    ("x" * 48, "one character repeated"),
    ("changeme-changeme-changeme-changeme", "placeholder"),
    ("your-secret-key-goes-here-0123456789", "placeholder"),
    ("abababababababababababababababab", "block of 2 characters repeated"),
    ("abcdefghabcdefghabcdefghabcdefgh", "block of 8 characters repeated"),
    ("aabbccddeeffggaabbccddeeffggabcdefg", "only 7 different characters"),
])
def test_a_weak_secret_key_stops_start_up_naming_it(key: str, names: str,
                                                    tmp_path, monkeypatch) -> None:
    url = f"sqlite:///{tmp_path / 'x.sqlite3'}"
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.delenv("FLASK_DEBUG", raising=False)
    settings = Settings.from_env({"DATABASE_URL": url, "SECRET_KEY": key})
    with pytest.raises(ConfigError, match="SECRET_KEY") as err:
        create_app(settings=settings, start_drainer=False)
    assert names in str(err.value) and "\n" not in str(err.value)
    assert key not in str(err.value)


def test_every_command_refuses_a_weak_key_with_one_line(db_url) -> None:
    for args in (("db", "upgrade"), ("worker",), ("stats", "--json"), ("serve",)):
        result = cli(*args, env=worker_env(db_url, SECRET_KEY="changeme"), timeout=30)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "SECRET_KEY is too short" in lines[0], (args, lines)


def test_debug_and_the_embedded_default_accept_any_key(tmp_path, monkeypatch) -> None:
    url = f"sqlite:///{tmp_path / 'x.sqlite3'}"
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("FLASK_DEBUG", raising=False)
    embedded = Settings.from_env({"SECRET_KEY": "changeme"}).with_overrides(database_url=url)
    assert create_app(settings=embedded, start_drainer=False).secret_key == "changeme"
    debug = Settings.from_env({"DATABASE_URL": url, "SECRET_KEY": "changeme",
                               "FLASK_DEBUG": "1"})
    assert create_app(settings=debug, start_drainer=False).secret_key == "changeme"


def test_a_generated_key_passes() -> None:
    assert all(secret_key_problem(secrets.token_urlsafe(48)) is None for _ in range(200))


# -- redaction ----------------------------------------------------------------------------------

@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """A handler on the root logger and on each logger that does not propagate, added before
    the app is built, as gunicorn's or a host's would be."""
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(logging.Formatter("%(name)s %(message)s"))
    names = ["", "webapp", "gunicorn.error", "gunicorn.access"]
    for name in names:
        logging.getLogger(name).addHandler(handler)
    try:
        yield buf
    finally:
        for name in names:
            logging.getLogger(name).removeHandler(handler)


SLACK_URL = "https://hooks.slack.com/services/T0000/B0000/slackpathkey1234"
NOTIFY_SECRET = "notify-signing-secret-5678"
SMTP_PASSWORD = "smtp-password-9012"


def secret_settings(db_url: str) -> Settings:
    from webapp.config import notify_settings

    notify = notify_settings({"NOTIFY_SLACK_WEBHOOK_URL": SLACK_URL,
                              "NOTIFY_WEBHOOK_URL": "https://hooks.example.com/in",
                              "NOTIFY_WEBHOOK_SECRET": NOTIFY_SECRET,
                              "NOTIFY_SMTP_URL": f"smtp://bot:{SMTP_PASSWORD}@mail.example.com",
                              "NOTIFY_EMAIL_FROM": "a@example.com",
                              "NOTIFY_EMAIL_TO": "b@example.com"})
    return make_settings(db_url, secret_key=STRONG, stripe_api_key=API_KEY,
                         stripe_webhook_secret=WEBHOOK, metrics_token=TOKEN, notify=notify)


def test_every_handler_of_every_logger_carries_the_redactor(db_url, engine, captured) -> None:
    create_app({"TESTING": True}, settings=secret_settings(db_url), engine=engine,
               start_drainer=False)
    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    handlers = [(lg.name, h) for lg in loggers for h in lg.handlers]
    assert len(handlers) >= 4
    for name, handler in handlers:
        assert REDACTOR in handler.filters, (name, handler)


def test_no_secret_reaches_a_log_line(db_url, engine, captured) -> None:
    create_app({"TESTING": True}, settings=secret_settings(db_url), engine=engine,
               start_drainer=False)
    pw_hash = hash_password("amber-falcon-orchard-71")
    leaks = [API_KEY, WEBHOOK, TOKEN, STRONG, pw_hash, "amber-falcon-orchard-71",
             "rk_test_" + "Q" * 24, "Bearer abc.def.ghi", SLACK_URL, NOTIFY_SECRET,
             SMTP_PASSWORD]
    for name in ("webapp.worker", "werkzeug", "sqlalchemy.engine", "gunicorn.error",
                 "apscheduler", "stripe", "some.library"):
        log = logging.getLogger(name)
        log.error("calling with key %s and %s", API_KEY, "rk_test_" + "Q" * 24)
        log.warning("form: password=amber-falcon-orchard-71&email=a@b.co")
        log.warning({"password": "amber-falcon-orchard-71", "hash": pw_hash})
        log.warning("Authorization: Bearer abc.def.ghi; webhook %s; token %s", WEBHOOK, TOKEN)
        log.warning("session key %s", STRONG)
        log.warning("posting to %s signed with %s; mail as %s", SLACK_URL, NOTIFY_SECRET,
                    SMTP_PASSWORD)
        try:
            raise RuntimeError(f"insert failed for hash {pw_hash}")
        except RuntimeError:
            log.exception("a failure path")
    text = captured.getvalue()
    assert text.count("[redacted]") >= 7 * 10
    for leak in leaks:
        assert leak not in text, leak


def test_a_duplicate_user_error_names_no_hash(db_url, engine) -> None:
    """The failure path that once logged a hash: SQL errors carry no parameter values."""
    row = {"email": "a@example.com", "password_hash": hash_password("amber-falcon-orchard-71"),
           "role": "admin", "active": True, "created_at": utcnow()}
    with engine.begin() as conn:
        conn.execute(insert(User.__table__).values(**row))
    with pytest.raises(IntegrityError) as err, engine.begin() as conn:
        conn.execute(insert(User.__table__).values(**row))
    assert row["password_hash"] not in str(err.value)
    assert "hidden due to hide_parameters" in str(err.value)


def test_an_error_page_shows_no_secret_and_its_log_line_is_redacted(db_url, engine,
                                                                   captured) -> None:
    app = create_app({}, settings=secret_settings(db_url).with_overrides(testing=False),
                     engine=make_engine(db_url), start_drainer=False)

    @app.get("/explode")
    def explode() -> str:
        raise RuntimeError(f"Stripe said no to {API_KEY} with whsec {WEBHOOK}")

    resp = app.test_client().get("/explode")
    body = resp.get_data(as_text=True)
    assert resp.status_code == 500 and API_KEY not in body and WEBHOOK not in body
    assert "unhandled error on GET /explode" in captured.getvalue()
    assert API_KEY not in captured.getvalue() and WEBHOOK not in captured.getvalue()


def test_redact_keeps_what_is_not_secret() -> None:
    line = "event 42 sent to cus_ABC123 req_XYZ meter api_requests in 120 ms"
    assert Redactor.redact(line) == line
