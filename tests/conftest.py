"""Shared fixtures: a fresh database per test on SQLite and on PostgreSQL, the fake Stripe,
settings, the Flask app, and helpers to run real worker processes.

PostgreSQL tests use TEST_DATABASE_URL (default: the local server's ``test`` database), each in
a schema of its own so committed data and real processes never see another test's rows. When
no server answers they skip with the reason, unless REQUIRE_POSTGRES=1, where they fail.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2
import jinja2.bccache
import pytest
from sqlalchemy import Engine, create_engine, text

from webapp.config import Settings
from webapp.db import make_engine

ROOT = Path(__file__).resolve().parent.parent
PG_URL = os.environ.get("TEST_DATABASE_URL",
                        "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REQUIRE_POSTGRES = os.environ.get("REQUIRE_POSTGRES") == "1"
TEST_API_KEY = "sk_test_billingoutbox_0123456789"

_pg_status: dict[str, str | None] = {}


def postgres_unavailable() -> str | None:
    """None when the PostgreSQL server answers, else why not (cached)."""
    if "reason" not in _pg_status:
        try:
            eng = create_engine(PG_URL, connect_args={"connect_timeout": 3})
            with eng.connect() as conn:
                conn.execute(text("SELECT 1"))
            eng.dispose()
            _pg_status["reason"] = None
        except Exception as exc:  # noqa: BLE001
            _pg_status["reason"] = f"PostgreSQL at {PG_URL} unavailable: {type(exc).__name__}"
    return _pg_status["reason"]


def require_postgres() -> None:
    reason = postgres_unavailable()
    if reason is None:
        return
    if REQUIRE_POSTGRES:
        pytest.fail(f"REQUIRE_POSTGRES=1 but {reason}")
    pytest.skip(reason)


def pg_schema_url(schema: str) -> str:
    sep = "&" if "?" in PG_URL else "?"
    return f"{PG_URL}{sep}options={quote(f'-csearch_path={schema}')}"


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One SQLite file migrated by a real upgrade, made on first use; each test gets a copy
    (``support.databases``)."""
    from support.databases import SqliteTemplate

    return SqliteTemplate(tmp_path_factory.mktemp("sqlite-template"))


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Any) -> Iterator[str]:
    """A migrated, empty database on each backend."""
    if request.param == "sqlite":
        yield sqlite_template.copy_to(tmp_path / "outbox.sqlite3")
        return
    yield from _pg_database()


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A migrated, empty PostgreSQL schema (for tests that prove cross-process guarantees)."""
    yield from _pg_database()


@pytest.fixture
def pg(pg_url: str) -> Iterator[Engine]:
    """An engine on ``pg_url``'s schema."""
    eng = make_engine(pg_url)
    yield eng
    eng.dispose()


@pytest.fixture
def sqlite_url(tmp_path: Path, sqlite_template: Any) -> str:
    """A migrated, empty SQLite database: a copy of the session's template file."""
    return str(sqlite_template.copy_to(tmp_path / "outbox.sqlite3"))


def _pg_template() -> Any:
    global _PG_TEMPLATE
    if _PG_TEMPLATE is None:
        from support.databases import PgTemplate

        _PG_TEMPLATE = PgTemplate(PG_URL, pg_schema_url)
    return _PG_TEMPLATE


_PG_TEMPLATE: Any = None


def _pg_database() -> Iterator[str]:
    """A new schema at head (the session's recorded upgrade replayed, ``support.databases``);
    dropped when the generator is closed."""
    require_postgres()
    schema = f"t_{secrets.token_hex(6)}"
    template = _pg_template()
    template.create(schema)
    try:
        yield pg_schema_url(schema)
    finally:
        template.drop(schema)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _PG_TEMPLATE is not None:
        _PG_TEMPLATE.dispose()


class _SharedTemplateCode(jinja2.BytecodeCache):
    """Jinja's compiled templates, kept in memory for the whole session. Each test builds its
    own Flask app, whose Jinja environment compiled every template it rendered again (about
    0.1 s a test); with this cache it loads the code compiled by an earlier app. Keyed by
    template name and checked against the source's checksum by Jinja itself, so a changed
    template is compiled afresh; rendering is unchanged."""

    def __init__(self) -> None:
        self._code: dict[str, bytes] = {}

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        code = self._code.get(bucket.key)
        if code is not None:
            bucket.bytecode_from_string(code)

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        self._code[bucket.key] = bucket.bytecode_to_string()


@pytest.fixture(scope="session", autouse=True)
def shared_template_code() -> Iterator[None]:
    from flask import Flask

    cache = _SharedTemplateCode()
    create = Flask.create_jinja_environment

    def create_with_cache(self: Flask) -> Any:
        env = create(self)
        env.bytecode_cache = cache
        return env

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Flask, "create_jinja_environment", create_with_cache)
        yield


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = make_engine(db_url)
    yield eng
    eng.dispose()


@pytest.fixture
def now() -> Any:
    """The current time, once per test."""
    from webapp.models import utcnow

    return utcnow()


@pytest.fixture
def seed(engine: Engine) -> Any:
    """Writes rows straight into the test's database (``support.seed.Seed``)."""
    from support.seed import Seed

    return Seed(engine)


@pytest.fixture
def fake_stripe() -> Iterator[Any]:
    from support.fake_stripe import FakeStripe

    # Streams on a port of their own, as Stripe serves them on a host of its own: a stream
    # request sent to the API's address is answered 404, as api.stripe.com answers it.
    fake = FakeStripe(separate_streams=True).start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def receivers() -> Iterator[dict[str, Any]]:
    """Local notification receivers: HTTP servers for Slack and the webhook, an SMTP server
    for email (``support.receivers``), by channel."""
    from support.receivers import HttpReceiver, SmtpReceiver

    got = {"slack": HttpReceiver().start(), "webhook": HttpReceiver().start(),
           "email": SmtpReceiver().start()}
    try:
        yield got
    finally:
        for r in got.values():
            r.stop()


def make_settings(db_url: str, **overrides: Any) -> Settings:
    base = Settings(database_url=db_url, secret_key="test-secret", testing=True,
                    stripe_api_key=TEST_API_KEY, stripe_timeout_seconds=5.0,
                    stripe_max_requests_per_second=10_000, initial_backoff_seconds=0.05,
                    max_backoff_seconds=1.0, claim_timeout_seconds=30.0,
                    poll_interval_seconds=0.05)
    return base.with_overrides(**overrides)


@pytest.fixture
def settings(db_url: str, fake_stripe: Any) -> Settings:
    return make_settings(db_url, stripe_api_base=fake_stripe.base_url,
                         stripe_meter_events_base=fake_stripe.meter_events_url)


def worker_env(db_url: str, api_base: str | None = None, meter_events_base: str | None = None,
               **extra: str) -> dict[str, str]:
    """The environment of a real ``billing-outbox`` process in tests."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "STRIPE_"))}
    env.update(DATABASE_URL=db_url, SECRET_KEY=secrets.token_urlsafe(48),
               STRIPE_API_KEY=TEST_API_KEY,
               STRIPE_TIMEOUT_SECONDS="5", STRIPE_MAX_REQUESTS_PER_SECOND="10000",
               OUTBOX_INITIAL_BACKOFF_SECONDS="0.05", OUTBOX_MAX_BACKOFF_SECONDS="1",
               OUTBOX_CLAIM_TIMEOUT_SECONDS="30", OUTBOX_POLL_INTERVAL_SECONDS="0.05",
               PYTHONUNBUFFERED="1")
    if api_base:
        env["STRIPE_API_BASE"] = api_base
    if meter_events_base:
        env["STRIPE_METER_EVENTS_BASE"] = meter_events_base
    env.update(extra)
    return env


def cli(*args: str, env: dict[str, str], input: str | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``billing-outbox`` as a user would, in a process of its own."""
    return subprocess.run([sys.executable, "-m", "webapp", *args], env=env, input=input,
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def start_worker(env: dict[str, str], log_path: Path | None = None) -> subprocess.Popen[bytes]:
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen([sys.executable, "-m", "webapp", "worker"], env=env, cwd=ROOT,
                            stdout=out, stderr=subprocess.STDOUT)


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 40) -> int | None:
    """SIGTERM, then wait for a clean exit; killed if it does not come. The exit code (a
    killed process's is negative)."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    return proc.returncode


def wait_for(predicate: Any, timeout: float, interval: float = 0.1, message: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message or predicate}")


#: What a test, a fixture it uses or a helper of its module calls when it starts a process of
#: its own (a worker, the CLI, gunicorn, a served stack, a tool).
PROCESS_CALLS = re.compile(r"\b(start_worker|cli|Popen|run_process|served_stack|serve)\(|"
                           r"\bsubprocess\.|\bmultiprocessing\b|\bsupport\.served\b|"
                           r"\bsupport\.processes\b")
#: What reaches the PostgreSQL server without the ``pg`` fixtures.
POSTGRES_CALLS = re.compile(r"\b(require_postgres|pg_schema_url|_pg_database|pg_engine)\(")
_module_helpers: dict[str, tuple[frozenset[str], frozenset[str]]] = {}


def _source(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def _helpers(module: Any) -> tuple[frozenset[str], frozenset[str]]:
    """The names of a test module's own functions that start a process, and those that reach
    PostgreSQL, directly or through one another (to a fixed point)."""
    name = getattr(module, "__name__", "")
    if name not in _module_helpers:
        tree = ast.parse(_source(module) or "")
        bodies = {f.name: ast.get_source_segment(_source(module), f) or ""
                  for f in tree.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}
        found = []
        for pattern in (PROCESS_CALLS, POSTGRES_CALLS):
            names = {n for n, body in bodies.items() if pattern.search(body)}
            while names:
                calls = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\(")
                more = {n for n, body in bodies.items()
                        if n not in names and calls.search(body)}
                if not more:
                    break
                names |= more
            found.append(frozenset(names))
        _module_helpers[name] = (found[0], found[1])
    return _module_helpers[name]


def _uses(text: str, pattern: re.Pattern[str], helpers: frozenset[str]) -> bool:
    if pattern.search(text):
        return True
    return any(re.search(rf"\b{re.escape(h)}\(", text) for h in helpers)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Markers derived, never applied by hand: ``browser`` (tests/browser), ``postgres`` (the
    PostgreSQL fixtures, the ``postgres`` side of ``db_url``, or a schema of its own),
    ``process`` (a worker, the CLI or a server started as a process, by the test, a fixture it
    uses, or a helper of its module), ``slow`` (browser and process tests, and those marked
    so). ``make check`` selects on them."""
    for item in items:
        if not isinstance(item, pytest.Function):
            continue
        module = item.module
        proc_helpers, pg_helpers = _helpers(module)
        texts = [_source(item.function)]
        defs = getattr(item, "_fixtureinfo", None)
        for name in item.fixturenames:
            for fixturedef in (defs.name2fixturedefs.get(name, ()) if defs else ()):
                # The module's or a folder's own fixtures; this file's are known by name
                # (``pg``, ``pg_url``, the ``postgres`` side of ``db_url``).
                if getattr(fixturedef, "baseid", "") not in ("", "tests"):
                    texts.append(_source(fixturedef.func))
        text = "\n".join(texts)
        params = getattr(item, "callspec", None)
        on_pg = (bool({"pg", "pg_url"} & set(item.fixturenames))
                 or (params is not None and params.params.get("db_url") == "postgres")
                 or _uses(text, POSTGRES_CALLS, pg_helpers))
        browser = "tests/browser/" in item.path.as_posix()
        process = browser or _uses(text, PROCESS_CALLS, proc_helpers)
        if on_pg:
            item.add_marker(pytest.mark.postgres)
        if browser:
            item.add_marker(pytest.mark.browser)
        if process:
            item.add_marker(pytest.mark.process)
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Captured output and logs that hold a lone surrogate (the poisoned-answer tests send
    one) shown escaped: a parallel run's workers send reports as UTF-8, which has none."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    report.sections = [(title, _printable(text)) for title, text in report.sections]


def _printable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
