"""A page view never writes: a GET of every page and endpoint the app serves, whole and as
its htmx fragment, leaves every table byte-for-byte as it was — on a database where folding
the rollups *would* write, so a reader that folded could not hide — and sends no statement
that writes or takes a write lock (on SQLite, no ``BEGIN IMMEDIATE``: the lock a drain pass
waits on).

Routes come from the app's URL map, so a page added later is covered without editing this.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, event, select, text

from webapp.models import Base

from .conftest import login, seed_every_kind

#: Extra query strings per endpoint: the heavier variants people use.
VARIANTS: dict[str, list[str]] = {
    "tenants.index": ["", "from=2020-01-01&to=2020-12-31"],
    "tenants.export": ["", "from=2020-01-01&to=2020-12-31"],
    "tenants.show": [""],
    "dead_letters.index": ["", "status=resolved", "q=customer&age=7d", "tenant=acme"],
    "dead_letters.groups": [""],
    "dead_letters.requeue_all_preview": [""],
    "dashboard.overview": ["", "range=1h", "range=7d", "range=30d"],
    "dashboard.retries": ["", "split=code"],
    "events.find": ["q=order:1", "q=nothing-here", "", "status=dead&status=pending&due=1",
                    "tenant=acme&age=near&attempts=1-3&before=5", "audit=1",
                    "customer=cus_acme&sent_from=2020-01-01&created_to=2100-01-01"],
    "events.export": ["", "status=dead&tenant=initech", "audit=1"],
    "search.index": ["", "q=acme", "q=cus_acme", "q=order:", "q=key-", "q=req_x",
                     "q=nothing-here"],
    "audit.index": ["", "actor=cli"],
    "rejected.index": ["", "code=meter_event_customer_not_found"],
    "reconciliation.index": ["", "run=1"],
    "reconciliation.resend_confirm": ["", "ids=1"],
}
WRITES = re.compile(r"^\s*(INSERT|UPDATE|DELETE|MERGE|COPY|CREATE|ALTER|DROP|TRUNCATE|"
                    r"BEGIN IMMEDIATE|BEGIN EXCLUSIVE)|\bFOR (NO KEY )?UPDATE\b|"
                    r"\bFOR SHARE\b|pg_advisory", re.IGNORECASE)


def table_fingerprints(engine: Engine) -> dict[str, tuple[int, str]]:
    """Every table's row count and a digest of all its rows, in a stable order."""
    names = [t.name for t in Base.metadata.sorted_tables] + ["alembic_version"]
    out: dict[str, tuple[int, str]] = {}
    with engine.connect() as conn:
        for name in names:
            if conn.dialect.name == "postgresql":
                n, digest = conn.execute(text(
                    f"SELECT count(*), md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), "
                    f"'')) FROM {name} AS t")).one()
                out[name] = (int(n), str(digest))
            else:
                rows = sorted(repr(tuple(r)) for r in conn.exec_driver_sql(
                    f"SELECT * FROM {name}"))  # noqa: S608 - our own table names
                out[name] = (len(rows),
                             hashlib.sha256("|".join(rows).encode()).hexdigest())
    return out


@pytest.fixture
def populated(seed: Any, now: Any) -> dict[str, Any]:
    """A bit of everything, with sent rows and calls old enough that a fold would move them
    into the rollups (so a page that folded would change a table), and a day reconciliation
    found Stripe holding none of (its pages and the preview of sending it again)."""
    return {**seed_every_kind(seed, now), "user_id": 1, "mismatch_id": seed.lost_day(now)}


def get_urls(app: Any, values: dict[str, Any]) -> Iterator[str]:
    """Every GET route of the app with sample values, and its variants."""
    for rule in app.url_map.iter_rules():
        if "GET" not in rule.methods or rule.endpoint == "static":
            continue
        args = {k: values[k] for k in rule.arguments}
        if rule.endpoint == "events.cancel_confirm":
            args["event_id"] = values["sent"]
        path = rule.build(args, append_unknown=False)[1]
        for query in VARIANTS.get(rule.endpoint, [""]):
            yield path + (f"?{query}" if query else "")


def test_a_get_of_every_page_leaves_the_database_unchanged(
        app: Any, engine: Engine, users: dict[str, str], populated: dict[str, Any]) -> None:
    client = app.test_client()
    assert login(client, users["admin"]).status_code == 303  # the log-in itself writes
    before = table_fingerprints(engine)
    statements: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    seen = []
    try:
        for url in get_urls(app, populated):
            for headers in ({}, {"HX-Request": "true"}):
                resp = client.get(url, headers=headers)
                assert resp.status_code in (200, 302, 303), (url, resp.status_code)
                resp.get_data()  # a streamed CSV is read to its end
                seen.append(url)
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert len(seen) >= 2 * 16
    writes = [s for s in statements if WRITES.search(s)]
    assert writes == [], writes[:3]
    assert table_fingerprints(engine) == before


def test_the_fingerprint_sees_a_fold(engine: Engine, populated: dict[str, Any],
                                     now: Any) -> None:
    """The check above can fail: folding the rollups (what pages used to do) changes it."""
    from webapp.outbox import rollups

    before = table_fingerprints(engine)
    assert rollups.fold(engine, now=now, margin=timedelta(minutes=15))
    assert table_fingerprints(engine) != before


def test_reads_begin_deferred_on_sqlite_and_read_only_on_postgres(engine: Engine) -> None:
    """``db.reading``: on SQLite a plain ``BEGIN`` (every other transaction is IMMEDIATE); on
    PostgreSQL a read-only transaction, so a write through it fails instead of happening."""
    from sqlalchemy.exc import DBAPIError

    from webapp.db import reading
    from webapp.outbox.sql import CONTROL

    begun: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.upper().startswith("BEGIN"):
            begun.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        with reading(engine) as conn:
            conn.execute(select(CONTROL.c.name)).all()
        with engine.begin() as conn:
            conn.execute(select(CONTROL.c.name)).all()
    finally:
        event.remove(engine, "before_cursor_execute", record)
    if engine.dialect.name == "sqlite":
        assert begun == ["BEGIN", "BEGIN IMMEDIATE"]
    else:
        with reading(engine) as conn, pytest.raises(DBAPIError, match="read-only"):
            conn.execute(text("DELETE FROM outbox_control"))
