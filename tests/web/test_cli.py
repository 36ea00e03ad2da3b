"""``billing-outbox`` as an operator runs it: each command in a process of its own
(``python -m webapp …``), on SQLite and PostgreSQL. Exit 0 on success; otherwise non-zero with
one clear line on stderr.

Setup that is not the subject of a test (mapping a tenant, enqueueing) goes through the Python
API, so the suite spends its subprocesses on the commands under test.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import PG_URL, ROOT, cli, pg_schema_url, require_postgres, worker_env
from sqlalchemy import Engine, create_engine, func, insert, select, text, update
from sqlalchemy.orm import Session

from webapp.db import make_engine
from webapp.models import AuditEntry, OutboxEvent, User, utcnow
from webapp.outbox import enqueue_usage
from webapp.outbox.control import pause_state
from webapp.outbox.operations import set_tenant
from webapp.read.audit import SIGN_IN_ACTIONS
from webapp.read.words import CANCEL_WORDS

T = OutboxEvent.__table__
AUDIT = AuditEntry.__table__
STATUSES = {"pending", "processing", "retrying", "sent", "dead", "resolved", "rejected",
            "cancelled"}


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return result


def one_line_error(result: subprocess.CompletedProcess[str], *needles: str,
                   code: int | None = None) -> str:
    """Assert a refusal: non-zero exit, exactly one line on stderr containing ``needles``."""
    assert result.returncode != 0, (result.stdout, result.stderr)
    if code is not None:
        assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    ok(result)
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture
def env(db_url: str, fake_stripe: Any) -> dict[str, str]:
    return worker_env(db_url, fake_stripe.base_url)


def status_of(engine: Engine, event_id: int) -> str:
    with engine.connect() as conn:
        return conn.execute(select(T.c.status).where(T.c.id == event_id)).scalar_one()


def audit_rows(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return conn.execute(select(AUDIT).where(AUDIT.c.action.not_in(SIGN_IN_ACTIONS))
                            .order_by(AUDIT.c.id)).all()


def add_event(engine: Engine, key: str, *, tenant: str = "acme", quantity: int = 3,
              meter: str = "api_requests") -> int:
    with Session(engine) as db, db.begin():
        return enqueue_usage(db, tenant_id=tenant, quantity=quantity, idempotency_key=key,
                             meter=meter).id


def map_acme(engine: Engine) -> None:
    set_tenant(engine, "acme", stripe_customer_id="cus_acme", name=None, now=utcnow())


# -- db upgrade -----------------------------------------------------------------------------------

@pytest.fixture(params=["sqlite", "postgres"])
def empty_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database with no schema at all."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.sqlite3'}"
        return
    require_postgres()
    schema = f"t_{secrets.token_hex(6)}"
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield pg_schema_url(schema)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def test_db_upgrade_twice(empty_db_url: str) -> None:
    env = worker_env(empty_db_url)
    first = ok(cli("db", "upgrade", env=env))
    second = ok(cli("db", "upgrade", env=env))
    assert "revision" in first.stdout
    assert first.stdout.strip().splitlines()[-1] == second.stdout.strip().splitlines()[-1]
    engine = make_engine(empty_db_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(select(func.count()).select_from(T)).scalar_one() == 0
            assert conn.execute(text("SELECT count(*) FROM alembic_version")).scalar_one() == 1
    finally:
        engine.dispose()


# -- tenants and enqueue --------------------------------------------------------------------------

def test_tenants_set_and_list(env: dict[str, str], engine: Engine) -> None:
    assert ok(cli("tenants", "set", "acme", "--stripe-customer", "cus_acme", "--name", "Acme",
                  env=env)).stdout.strip() == "acme -> cus_acme"
    ok(cli("tenants", "set", "beta", "--stripe-customer", "cus_beta", env=env))
    listed = as_json(cli("tenants", "list", "--json", env=env))
    assert listed == [
        {"tenant_id": "acme", "name": "Acme", "stripe_customer_id": "cus_acme"},
        {"tenant_id": "beta", "name": None, "stripe_customer_id": "cus_beta"},
    ]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM billing_tenants")).scalar_one() == 2


def test_enqueue(env: dict[str, str], engine: Engine) -> None:
    when = (utcnow() - timedelta(hours=1)).replace(microsecond=0)
    first = as_json(cli("enqueue", "--tenant", "acme", "--quantity", "3", "--key", "k1",
                        "--occurred-at", when.isoformat().replace("+00:00", "Z"), env=env))
    assert isinstance(first["id"], int)
    assert first["status"] == "pending" and first["key"] == "k1"
    again = as_json(cli("enqueue", "--tenant", "acme", "--quantity", "3", "--key", "k1",
                        env=env))
    assert again["id"] == first["id"]
    one_line_error(cli("enqueue", "--tenant", "acme", "--quantity", "4", "--key", "k1",
                       env=env), "k1", "quantity", code=1)
    with engine.connect() as conn:
        rows = conn.execute(select(T.c.idempotency_key, T.c.quantity, T.c.meter,
                                   T.c.occurred_at)).all()
    assert [tuple(r) for r in rows] == [("k1", 3, "api_requests", when)]


# -- stats and drain ------------------------------------------------------------------------------

def test_stats_json_has_the_contracts_keys(env: dict[str, str], engine: Engine) -> None:
    add_event(engine, "s1")
    data = as_json(cli("stats", "--json", env=env))
    # the contract's keys (it allows more after them: "…")
    assert {"counts", "oldest_pending_age_seconds", "paused", "pause_reason"} <= set(data)
    assert data["meter_event_api"] == "v1"
    streams = as_json(cli("stats", "--json", env=dict(env, STRIPE_METER_EVENT_API="v2_stream")))
    assert streams["meter_event_api"] == "v2_stream"
    assert set(data["counts"]) == STATUSES
    assert data["counts"] == {s: (1 if s == "pending" else 0) for s in STATUSES}
    assert isinstance(data["oldest_pending_age_seconds"], int | float)
    assert 0 <= data["oldest_pending_age_seconds"] < 60
    assert data["paused"] is False and data["pause_reason"] is None
    # Where calls and streams go: the fake's API, and streams there too unless set apart.
    assert (data["stripe_api_base"], data["stripe_meter_events_base"]) == (
        env["STRIPE_API_BASE"], env["STRIPE_API_BASE"])
    apart = as_json(cli("stats", "--json", env=dict(
        env, STRIPE_METER_EVENTS_BASE="http://127.0.0.1:9/")))
    assert apart["stripe_meter_events_base"] == "http://127.0.0.1:9"
    stock = {k: v for k, v in env.items() if k != "STRIPE_API_BASE"}
    stripes = as_json(cli("stats", "--json", env=stock))
    assert (stripes["stripe_api_base"], stripes["stripe_meter_events_base"]) == (
        "https://api.stripe.com", "https://meter-events.stripe.com")


#: Runs ``billing-outbox`` with its arguments, then names on stderr every module it loaded.
LOADED = ("import atexit, json, sys\n"
          "atexit.register(lambda: print(json.dumps(sorted(sys.modules)), file=sys.stderr))\n"
          "from webapp.main import main\n"
          "main(sys.argv[1:])\n")


def test_reading_commands_load_neither_the_sdk_nor_alembic_nor_the_pages(
        env: dict[str, str], engine: Engine) -> None:
    """``stats`` and ``usage`` read the database and print: the Stripe SDK, Alembic, the
    worker and the dashboard's pages (most of a command's start-up once) stay unloaded, with
    an API key set too; the commands themselves are all there."""
    add_event(engine, "quick")
    for args in (("stats", "--json"), ("usage", "--json", "--tenant", "acme"), ("--help",)):
        result = ok(subprocess.run([sys.executable, "-c", LOADED, *args], env=env,
                                   capture_output=True, text=True, timeout=60, cwd=ROOT))
        loaded = set(json.loads(result.stderr.strip().splitlines()[-1]))
        assert not loaded & {"stripe", "requests", "alembic", "webapp.migrate",
                             "webapp.worker", "webapp.web.dashboard", "webapp.web.tenants"}, args
        assert {"webapp.web.cli.tenants", "webapp.web.cli.stripe_calls"} <= loaded, args


def test_drain_once_sends_and_prints_a_summary(env: dict[str, str], engine: Engine,
                                               fake_stripe: Any) -> None:
    map_acme(engine)
    ids = [add_event(engine, f"d{i}", quantity=i + 1) for i in range(3)]
    summary = as_json(cli("drain", "--once", env=env))
    assert summary["claimed"] == 3 and summary["sent"] == 3 and summary["calls"] == 3
    assert summary["paused"] is False
    assert fake_stripe.accept_count() == 3
    accepted = fake_stripe.accepted()
    assert {k: (v.customer, v.value) for k, v in accepted.items()} == {
        "d0": ("cus_acme", "1"), "d1": ("cus_acme", "2"), "d2": ("cus_acme", "3")}
    assert all(status_of(engine, i) == "sent" for i in ids)


def test_drain_without_api_key_sends_nothing(db_url: str, engine: Engine,
                                             fake_stripe: Any) -> None:
    map_acme(engine)
    event_id = add_event(engine, "nokey")
    env = worker_env(db_url, fake_stripe.base_url)
    del env["STRIPE_API_KEY"]
    summary = as_json(cli("drain", "--once", env=env))
    assert summary["sent"] == 0 and summary["claimed"] == 0
    assert "STRIPE_API_KEY" in (summary["skipped"] or "")
    assert fake_stripe.calls() == 0
    assert status_of(engine, event_id) == "pending"


# -- dead letters ---------------------------------------------------------------------------------

def test_requeue_and_resolve_dead_events(env: dict[str, str], engine: Engine,
                                         fake_stripe: Any) -> None:
    map_acme(engine)
    # Two events Stripe refused for good (a permanent 400 each), one sent.
    to_requeue = add_event(engine, "dead-1")
    to_resolve = add_event(engine, "dead-2")
    sent = add_event(engine, "fine")
    with engine.begin() as conn:
        conn.execute(update(T).where(T.c.id.in_([to_requeue, to_resolve])).values(
            status="dead", dead_reason="Invalid value", dead_at=utcnow(), attempt_count=1,
            call_count=1, last_outcome="permanent"))
    summary = as_json(cli("drain", "--once", env=env))
    assert summary["sent"] == 1
    assert [status_of(engine, i) for i in (to_requeue, to_resolve, sent)] == [
        "dead", "dead", "sent"]

    out = ok(cli("requeue", str(to_requeue), env=env))
    assert "requeued 1" in out.stdout
    assert status_of(engine, to_requeue) == "pending"
    with engine.connect() as conn:
        row = conn.execute(select(T.c.attempt_count, T.c.key_generation, T.c.dead_reason)
                           .where(T.c.id == to_requeue)).one()
    assert (row.attempt_count, row.key_generation, row.dead_reason) == (0, 1, None)
    # the requeued event goes through
    assert as_json(cli("drain", "--once", env=env))["sent"] == 1
    assert status_of(engine, to_requeue) == "sent"

    assert status_of(engine, to_resolve) == "dead"
    ok(cli("resolve", str(to_resolve), "--reason", "billed_manually", "--note",
           "invoiced by hand", env=env))
    with engine.connect() as conn:
        r = conn.execute(select(T).where(T.c.id == to_resolve)).one()
    assert (r.status, r.resolve_reason, r.resolve_note) == (
        "resolved", "billed_manually", "invoiced by hand")
    assert r.resolved_by.startswith("cli:")

    audits = audit_rows(engine)
    assert [(a.action, a.event_ids, a.reason_code) for a in audits] == [
        ("requeue", str(to_requeue), None),
        ("resolve", str(to_resolve), "billed_manually")]
    assert all(a.actor.startswith("cli:") for a in audits)
    assert audits[1].note == "invoiced by hand"

    # a sent event cannot be requeued, and nothing changes
    one_line_error(cli("requeue", str(sent), env=env), str(sent), "sent", code=1)
    assert status_of(engine, sent) == "sent"
    assert len(audit_rows(engine)) == 2
    assert fake_stripe.accept_count() == 2


# -- pause and resume -----------------------------------------------------------------------------

def test_pause_and_resume(env: dict[str, str], engine: Engine, fake_stripe: Any) -> None:
    map_acme(engine)
    event_id = add_event(engine, "p1")
    ok(cli("pause", "--reason", "x", env=env))
    stats = as_json(cli("stats", "--json", env=env))
    assert stats["paused"] is True and stats["pause_reason"] == "x"
    summary = as_json(cli("drain", "--once", env=env))
    assert summary["paused"] is True and summary["sent"] == 0 and summary["claimed"] == 0
    assert fake_stripe.calls() == 0
    assert status_of(engine, event_id) == "pending"
    ok(cli("resume", env=env))
    with engine.connect() as conn:
        assert pause_state(conn).paused is False
    audits = audit_rows(engine)
    assert [(a.action, a.note) for a in audits] == [("pause", "x"), ("resume", None)]
    assert all(a.actor.startswith("cli:") for a in audits)


# -- users ----------------------------------------------------------------------------------------

def test_users_create(env: dict[str, str], engine: Engine) -> None:
    password = "violet tractor lemonade 42"
    out = ok(cli("users", "create", "A@B.co", "--role", "admin", "--password-stdin", env=env,
                 input=password + "\n"))
    assert "a@b.co" in out.stdout
    with engine.connect() as conn:
        user = conn.execute(select(User.__table__)).one()
    assert (user.email, user.role, user.active) == ("a@b.co", "admin", True)
    assert password not in user.password_hash
    from werkzeug.security import check_password_hash

    assert check_password_hash(user.password_hash, password)
    one_line_error(cli("users", "create", "a@b.co", "--role", "viewer", "--password-stdin",
                       env=env, input=password + "\n"), "already exists", code=1)


# -- configuration errors (the backend does not matter: nothing connects) -------------------------

@pytest.mark.parametrize(("extra", "name"), [
    ({"DATABASE_URL": "mysql://x"}, "DATABASE_URL"),
    ({"OUTBOX_BATCH_SIZE": "abc"}, "OUTBOX_BATCH_SIZE"),
    ({"STRIPE_TIMEOUT_SECONDS": "10", "OUTBOX_CLAIM_TIMEOUT_SECONDS": "20"},
     "OUTBOX_CLAIM_TIMEOUT_SECONDS"),
], ids=["database-url-scheme", "batch-size", "claim-timeout-too-short"])
def test_bad_configuration_is_one_line_naming_the_variable(sqlite_url: str,
                                                           extra: dict[str, str],
                                                           name: str) -> None:
    env = worker_env(sqlite_url, **extra)
    line = one_line_error(cli("stats", "--json", env=env), name, code=2)
    assert line.startswith("billing-outbox: ")


# -- refusals that never reach the database (one backend is enough) -------------------------------

@pytest.fixture
def sqlite_env(sqlite_url: str) -> dict[str, str]:
    return worker_env(sqlite_url)


@pytest.mark.parametrize(("args", "needles", "code"), [
    (("stats", "--json"), ("db upgrade",), 1),  # replaced below by an unmigrated database
    (("enqueue", "--tenant", "acme", "--quantity", "abc", "--key", "k"), ("quantity",), None),
    (("enqueue", "--tenant", "acme", "--quantity", "0", "--key", "k"), ("quantity",), 1),
    (("enqueue", "--tenant", "acme", "--quantity", "1", "--key", "k",
      "--occurred-at", "2026-01-01T00:00:00"), ("time zone",), None),
    (("resolve", "1", "--reason", "billed_manually"), ("--note",), None),
    (("resolve", "1", "--reason", "because", "--note", "x"), ("--reason",), None),
    (("requeue", "999999"), ("no such event",), 1),
    (("users", "create", "e@f.co", "--role", "root", "--password-stdin"), ("--role",), None),
    (("reconcile", "resend", "--tenant", "acme", "--meter", "api_requests", "--day",
      "2026-01-31"), ("No event of tenant acme for api_requests on 2026-01-31",), 1),
    (("reconcile", "resend", "--tenant", "acme", "--meter", "api_requests", "--day",
      "31/01/2026"), ("--day",), None),
], ids=["schema-missing", "quantity-not-int", "quantity-zero", "naive-time",
        "resolve-no-note", "resolve-bad-reason", "requeue-unknown-id", "bad-role",
        "resend-nothing-sent", "resend-bad-day"])
def test_refusals_are_one_line(sqlite_env: dict[str, str], tmp_path: Path, args: tuple[str, ...],
                               needles: tuple[str, ...], code: int | None) -> None:
    env = sqlite_env
    if args == ("stats", "--json"):
        env = worker_env(f"sqlite:///{tmp_path / 'never-migrated.sqlite3'}")
    result = cli(*args, env=env, input="a long enough password\n")
    one_line_error(result, *needles, code=code)
    if args[0] in ("enqueue", "resolve", "requeue", "tenants", "users", "reconcile") and \
            env is sqlite_env:
        engine = make_engine(env["DATABASE_URL"])
        try:
            with engine.connect() as conn:
                for table in ("stripe_usage_outbox", "audit_log", "billing_tenants", "users"):
                    assert conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one() == 0
        finally:
            engine.dispose()


def test_usage_equals_counting_rows_with_a_pair_for_every_status(
        env: dict[str, str], engine: Engine, seed: Any) -> None:
    """``usage --json`` (the contract's shape) gives, per tenant and meter, the events and
    units of each status that occurred in the period, as a plain count of the rows does:
    sent ones read from the rollup (folded) and past it alike, in-flight ones apart."""
    from webapp.outbox import rollups
    from webapp.outbox.states import ALL_STATUSES

    now = utcnow()
    old = now - timedelta(days=3)
    seed.tenant("acme", "cus_acme")
    for status, tenant, qty in (("sent", "acme", 5), ("pending", "acme", 2),
                                ("retrying", "globex", 3), ("dead", "acme", 7),
                                ("resolved", "globex", 1), ("cancelled", "acme", 4),
                                ("rejected", "acme", 6)):
        seed.event(status=status, tenant_id=tenant, quantity=qty, occurred_at=old, now=old)
    seed.event(status="processing", quantity=9, occurred_at=old,
               processing_deadline_at=now + timedelta(minutes=1), claim_token="t",
               claimed_by="h:1:ab")
    seed.event(status="sent", quantity=100, occurred_at=now - timedelta(days=40))  # outside
    assert rollups.fold(engine, now=now, margin=rollups.fold_margin(30)) is True
    seed.event(status="sent", quantity=8, occurred_at=old, sent_at=now)  # past the rollup
    start, end = (old - timedelta(days=1)).date(), now.date()

    out = cli("usage", "--json", "--from", start.isoformat(), "--to", end.isoformat(), env=env)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert (data["from"], data["to"]) == (start.isoformat(), end.isoformat())
    got = {(r["tenant_id"], r["meter"]): r for r in data["rows"]}
    T = OutboxEvent.__table__
    lo = datetime.combine(start, datetime.min.time(), tzinfo=UTC)
    hi = datetime.combine(end + timedelta(days=1), datetime.min.time(), tzinfo=UTC)
    with engine.connect() as conn:
        counted = conn.execute(select(T.c.tenant_id, T.c.meter, T.c.status, func.count(),
                                      func.sum(T.c.quantity))
                               .where(T.c.occurred_at >= lo, T.c.occurred_at < hi)
                               .group_by(T.c.tenant_id, T.c.meter, T.c.status)).all()
    expected: dict[tuple[str, str], dict[str, int]] = {}
    for tenant, meter, status, n, q in counted:
        row = expected.setdefault((tenant, meter), {})
        row[f"{status}_events"], row[f"{status}_units"] = int(n), int(q)
    assert set(got) == set(expected)
    for key, row in got.items():
        assert {f"{s}_{w}" for s in ALL_STATUSES for w in ("events", "units")} <= set(row)
        for name, value in row.items():
            if name.endswith(("_events", "_units")) and name.rsplit("_", 1)[0] in ALL_STATUSES:
                assert value == expected[key].get(name, 0), (key, name)
        # Stripe's figure beside ours: none compared yet here (no reconciliation ran).
        assert (row["stripe_units"], row["compared_at"], row["compared_days"]) == (None, None, 0)
    assert got[("acme", "api_requests")]["sent_units"] == 13  # folded 5 + live 8
    assert got[("acme", "api_requests")]["stripe_customer_id"] == "cus_acme"
    assert got[("acme", "api_requests")]["processing_events"] == 1
    # Written a row at a time, the document is byte for byte json.dumps of the whole one.
    from webapp.read.tenants import USAGE_STATUSES, tenant_usage

    whole = tenant_usage(engine, start=start, end=end, in_flight_apart=True)
    pairs = [(s, w, f) for s in (*USAGE_STATUSES, "processing")
             for w, f in (("events", "events"), ("units", "quantity"))]
    assert len(whole.rows) == 2 and out.stdout == json.dumps({
        "from": start.isoformat(), "to": end.isoformat(),
        "rows": [{"tenant_id": r.tenant_id, "stripe_customer_id": r.stripe_customer_id,
                  "meter": r.meter, **{f"{s}_{w}": getattr(r, f)[s] for s, w, f in pairs},
                  "stripe_units": None, "compared_units": None, "compared_days": 0,
                  "compared_at": None}
                 for r in whole.rows]}) + "\n"
    empty = cli("usage", "--json", "--from", "2020-01-01", "--to", "2020-01-02", env=env)
    assert empty.stdout == '{"from": "2020-01-01", "to": "2020-01-02", "rows": []}\n'
    text = cli("usage", "--from", start.isoformat(), "--to", end.isoformat(), env=env)
    assert text.returncode == 0 and len(text.stdout.splitlines()) == 2 + len(whole.rows)
    assert "acme\tapi_requests\t2/13\t" in text.stdout

    month = json.loads(cli("usage", "--json", "--tenant", "globex", env=env).stdout)
    assert month["from"] == now.date().replace(day=1).isoformat()  # this month by default
    assert {r["tenant_id"] for r in month["rows"]} <= {"globex"}
    for bad in (["--from", "2026-13-01"], ["--from", "2026-12-02", "--to", "2026-12-01"]):
        refused = cli("usage", *bad, env=env)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr


def test_usage_json_of_more_rows_than_one_write_is_one_document(
        env: dict[str, str], engine: Engine) -> None:
    """``usage --json`` writes its rows a thousand at a time: across the writes the document
    is still byte for byte ``json.dumps`` of the whole one, every row once, in order."""
    from webapp.web.cli.tenants import ROWS_PER_WRITE

    when = utcnow() - timedelta(days=2)
    n = ROWS_PER_WRITE * 2 + 1
    rows = [dict(tenant_id=f"t{i:05d}", meter="api_requests", quantity=i + 1,
                 idempotency_key=f"batch-{i}", occurred_at=when, status="sent", attempt_count=1,
                 call_count=1, next_attempt_at=when, key_generation=0, sent_at=when,
                 created_at=when, updated_at=when) for i in range(n)]
    with engine.begin() as conn:
        conn.execute(insert(OutboxEvent.__table__), rows)
    day = when.date().isoformat()
    out = cli("usage", "--json", "--from", day, "--to", day, env=env)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [(r["tenant_id"], r["sent_units"]) for r in data["rows"]] == [
        (f"t{i:05d}", i + 1) for i in range(n)]
    assert out.stdout == json.dumps(data) + "\n"


def test_usage_on_a_database_that_fails_the_query_writes_no_half_document(
        tmp_path: Path) -> None:
    """The rows are streamed, but the query runs before the first byte is written: a schema
    that is missing gives the one-line error and an empty standard output, not the start of
    a JSON document."""
    env = worker_env(f"sqlite:///{tmp_path / 'never-migrated.sqlite3'}")
    out = cli("usage", "--json", env=env)
    assert out.returncode == 1 and out.stdout == ""
    assert "billing-outbox db upgrade" in out.stderr.strip().splitlines()[-1]


def test_prune_as_the_contract_says(env: dict[str, str], engine: Engine, seed: Any) -> None:
    """``prune [--dry-run] [--json] [--as-of]``: terminal rows past OUTBOX_RETENTION_DAYS go,
    dead and rejected ones are counted as kept, usage stays the same, a future ``--as-of``
    only previews, and a retention below 36 days stops the command with one line."""
    from webapp.outbox import rollups

    now = utcnow()
    old = now - timedelta(days=45)
    for status in ("sent", "resolved", "cancelled", "dead", "rejected", "sent"):
        seed.event(status=status, quantity=3, now=old)
    seed.event(status="sent", quantity=2, now=now - timedelta(days=20))
    seed.event(status="pending", now=now)
    rollups.fold(engine, now=now, margin=rollups.fold_margin(30))
    period = ["--from", (old - timedelta(days=1)).date().isoformat(), "--to",
              now.date().isoformat()]
    usage_before = json.loads(cli("usage", "--json", *period, env=env).stdout)

    preview = cli("prune", "--dry-run", "--json", env=env)
    assert preview.returncode == 0, preview.stderr
    data = json.loads(preview.stdout)
    assert (data["pruned"], data["kept_dead"], data["dry_run"]) == (4, 1, True)
    assert datetime.fromisoformat(data["as_of"]) <= utcnow()
    ahead = json.loads(cli("prune", "--dry-run", "--json", "--as-of",
                           (now + timedelta(days=25)).isoformat(), env=env).stdout)
    assert ahead["pruned"] == 5           # the 20-day-old one too, 25 days from now
    refused = cli("prune", "--as-of", (now + timedelta(days=25)).isoformat(), env=env)
    assert refused.returncode == 2 and "--dry-run" in refused.stderr
    assert refused.stderr.count("\n") == 1, refused.stderr

    done = cli("prune", env=env)
    assert done.returncode == 0, done.stderr
    assert "removed 4 events (2 sent, 1 resolved, 1 cancelled)" in done.stdout
    assert "kept 1 dead and 1 rejected" in done.stdout
    again = json.loads(cli("prune", "--json", env=env).stdout)
    assert again["pruned"] == 0
    assert json.loads(cli("usage", "--json", *period, env=env).stdout) == usage_before
    with engine.connect() as conn:
        audit = conn.execute(select(AuditEntry.__table__.c.action, AuditEntry.__table__.c.note)
                             .where(AuditEntry.__table__.c.action == "prune")).all()
    assert len(audit) == 1 and "removed 4 events" in audit[0].note

    short = cli("prune", env=dict(env, OUTBOX_RETENTION_DAYS="30"))
    assert short.returncode == 2 and short.stderr.count("\n") == 1, short.stderr
    assert "OUTBOX_RETENTION_DAYS must be at least 36" in short.stderr


def test_cancel_help_says_what_stripe_does_and_promises_no_more(tmp_path: Path) -> None:
    helped = ok(cli("cancel", "--help", env=worker_env(f"sqlite:///{tmp_path}/help.db")))
    words = " ".join(helped.stdout.split())
    for line in CANCEL_WORDS:
        assert line in words, line
    assert "not be billed" not in words and "not be on the invoice" not in words
