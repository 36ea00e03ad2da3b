"""The migrated databases tests get (``support.databases``: a copied SQLite file, a replayed
recording of the PostgreSQL upgrade) equal what a real Alembic upgrade makes, on both
databases: every table, column, default, index, constraint, sequence, storage option and row.
If a migration changes and the shortcut does not follow, this fails."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import PG_URL, pg_schema_url, require_postgres
from sqlalchemy import Connection, Engine, create_engine, inspect, text

from webapp.db import make_engine, reading
from webapp.migrate import current_revision, head_revision, upgrade


def describe(engine: Engine) -> dict[str, Any]:
    """Everything SQLAlchemy's inspector sees, and every row (the tables are small)."""
    out: dict[str, Any] = {}
    with reading(engine) as conn:
        insp = inspect(conn)
        for table in sorted(insp.get_table_names()):
            out[table] = plain({
                "columns": insp.get_columns(table),
                "primary_key": insp.get_pk_constraint(table),
                "foreign_keys": sorted(insp.get_foreign_keys(table), key=repr),
                "indexes": sorted(insp.get_indexes(table), key=repr),
                "unique": sorted(insp.get_unique_constraints(table), key=repr),
                "checks": sorted(insp.get_check_constraints(table), key=repr),
                "options": insp.get_table_options(table),
                "rows": sorted(map(tuple, conn.execute(text(f'SELECT * FROM "{table}"'))),
                               key=repr),
            })
    return out


def plain(value: Any) -> Any:
    """``value`` with SQL types and clauses as their SQL text, so that two reflections of
    equal schemas compare equal (those objects compare by identity)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in sorted(value.items())}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, str | int | float | bool | type(None)):
        return value
    return f"{type(value).__name__}: {value}"


def describe_sqlite(engine: Engine) -> dict[str, Any]:
    """SQLite's own record of the schema (the CREATE statements as written), and the file's
    settings that a copy could get wrong."""
    with reading(engine) as conn:
        master = sorted(map(tuple, conn.exec_driver_sql(
            "SELECT type, name, tbl_name, sql FROM sqlite_master")))
        pragmas = {p: conn.exec_driver_sql(f"PRAGMA {p}").scalar()
                   for p in ("journal_mode", "user_version", "application_id", "auto_vacuum",
                             "encoding", "page_size", "foreign_keys")}
    return {"master": master, "pragmas": pragmas}


CATALOG = {
    "relations": """
        SELECT c.relname, c.relkind, c.relpersistence, c.reloptions::text, c.relhasindex,
               obj_description(c.oid, 'pg_class')
        FROM pg_class c WHERE c.relnamespace = :ns ORDER BY 1""",
    "columns": """
        SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod),
               a.attnotnull, a.attidentity, a.attgenerated, a.attcollation::regcollation::text,
               pg_get_expr(d.adbin, d.adrelid), col_description(c.oid, a.attnum)
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE c.relnamespace = :ns AND a.attnum > 0 AND NOT a.attisdropped ORDER BY 1, 2""",
    "constraints": """
        SELECT c.relname, k.conname, k.contype, k.condeferrable, k.condeferred,
               k.convalidated, pg_get_constraintdef(k.oid)
        FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
        WHERE k.connamespace = :ns ORDER BY 1, 2""",
    "indexes": """
        SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid), i.indisunique,
               i.indisprimary, i.indisvalid, i.indisready
        FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
        WHERE c.relnamespace = :ns ORDER BY 1""",
    "sequences": """
        SELECT c.relname, s.seqtypid::regtype::text, s.seqstart, s.seqincrement, s.seqmax,
               s.seqmin, s.seqcache, s.seqcycle, pg_sequence_last_value(c.oid),
               (SELECT r.relname || '.' || a.attname FROM pg_depend d
                JOIN pg_class r ON r.oid = d.refobjid
                JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                WHERE d.objid = c.oid AND d.classid = 'pg_class'::regclass
                  AND d.deptype IN ('a', 'i'))
        FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid
        WHERE c.relnamespace = :ns ORDER BY 1""",
    "triggers": """
        SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid)
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        WHERE c.relnamespace = :ns AND NOT t.tgisinternal ORDER BY 1, 2""",
    "views": """
        SELECT c.relname, pg_get_viewdef(c.oid)
        FROM pg_class c WHERE c.relnamespace = :ns AND c.relkind IN ('v', 'm') ORDER BY 1""",
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), md5(p.prosrc),
               p.prosecdef, replace(coalesce(array_to_string(p.proconfig, ','), ''),
                                    (SELECT nspname FROM pg_namespace WHERE oid = :ns),
                                    '<schema>')
        FROM pg_proc p WHERE p.pronamespace = :ns ORDER BY 1, 2""",
    "types": """
        SELECT t.typname, t.typtype FROM pg_type t
        WHERE t.typnamespace = :ns AND t.typtype NOT IN ('c') ORDER BY 1""",
}


def describe_pg(conn: Connection, schema: str) -> dict[str, Any]:
    """PostgreSQL's catalog for ``schema``, with the schema's name written as ``<schema>``."""
    ns = conn.execute(text("SELECT oid FROM pg_namespace WHERE nspname = :s"),
                      {"s": schema}).scalar_one()
    # Every name qualified, visible or not, so both schemas read alike.
    conn.execute(text("SELECT set_config('search_path', 'pg_catalog', true)"))
    out = {}
    for name, sql in CATALOG.items():
        rows = conn.execute(text(sql), {"ns": ns}).all()
        out[name] = [tuple(str(v).replace(schema, "<schema>") if isinstance(v, str) else v
                           for v in row) for row in rows]
    return out


@pytest.fixture
def upgraded_sqlite(tmp_path: Path) -> Iterator[Engine]:
    """A SQLite database made the long way: a new file, then a real upgrade."""
    engine = make_engine(f"sqlite:///{tmp_path / 'upgraded.sqlite3'}")
    upgrade(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def upgraded_pg() -> Iterator[tuple[Engine, str]]:
    """A PostgreSQL schema made the long way: an empty schema, then a real upgrade."""
    require_postgres()
    schema = f"t_{secrets.token_hex(6)}"
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    engine = make_engine(pg_schema_url(schema))
    try:
        upgrade(engine)
        yield engine, schema
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def _assert_at_head_and_not_empty(engine: Engine, described: dict[str, Any]) -> None:
    assert current_revision(engine) == head_revision(engine)
    assert {"alembic_version", "stripe_usage_outbox", "users"} <= set(described)
    assert described["rollup_state"]["rows"], "the rows a migration writes are there too"


def test_the_sqlite_template_equals_a_real_upgrade(sqlite_url: str,
                                                    upgraded_sqlite: Engine) -> None:
    copied = make_engine(sqlite_url)
    try:
        made, real = describe(copied), describe(upgraded_sqlite)
        _assert_at_head_and_not_empty(copied, made)
        assert made == real
        assert describe_sqlite(copied) == describe_sqlite(upgraded_sqlite)
    finally:
        copied.dispose()


def test_the_postgres_template_equals_a_real_upgrade(pg_url: str,
                                                      upgraded_pg: tuple[Engine, str]) -> None:
    real_engine, real_schema = upgraded_pg
    replayed = make_engine(pg_url)
    try:
        made, real = describe(replayed), describe(real_engine)
        _assert_at_head_and_not_empty(replayed, made)
        assert made == real
        with reading(replayed) as conn:
            schema = conn.execute(text("SELECT current_schema()")).scalar_one()
            assert schema != real_schema
            made_catalog = describe_pg(conn, schema)
            real_catalog = describe_pg(conn, real_schema)
        assert made_catalog["indexes"] and made_catalog["sequences"]
        assert made_catalog == real_catalog
    finally:
        replayed.dispose()


def test_schemas_made_from_the_recording_are_independent(pg_url: str) -> None:
    """The replayed schema is a real one: a second schema made the same way is independent
    (rows and sequences of one are not seen by the other)."""
    from conftest import _pg_database

    other_gen = _pg_database()
    other_url = next(other_gen)
    a, b = make_engine(pg_url), make_engine(other_url)
    try:
        with a.begin() as conn:
            conn.execute(text("INSERT INTO billing_tenants (tenant_id, created_at, updated_at) "
                              "VALUES ('acme', now(), now())"))
        with b.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM billing_tenants")).scalar_one() == 0
    finally:
        a.dispose()
        b.dispose()
        other_gen.close()
