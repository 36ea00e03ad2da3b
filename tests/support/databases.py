"""Migrated test databases without running the migrations for every test.

A fresh database per test stays the rule; only how it reaches the newest revision changes.
The Alembic upgrade runs once per test session (per xdist worker), and each test gets a copy:

- **SQLite**: the template is a file migrated by :func:`webapp.migrate.upgrade`; each test gets
  a byte-for-byte copy of it (WAL checkpointed first, so the main file holds everything).
- **PostgreSQL**: the upgrade runs once into a template schema while every statement it sends
  is recorded (the reads it makes to look around, ``SELECT …``, left out; parameters rendered
  as literals by psycopg itself). Each test's schema is created and brought to head by
  replaying that script in one round trip: the same DDL and rows the migrations wrote, in the
  same order, without Alembic's start-up, reflection and a round trip per statement.

``tests/support/test_databases.py`` proves that a schema made this way equals one made by a
real upgrade (tables, columns, indexes, constraints, sequences, storage options, rows), on
both databases, so the shortcut cannot drift from the migrations.
"""

from __future__ import annotations

import shutil
import sqlite3
import threading
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text

from webapp.db import make_engine
from webapp.migrate import upgrade

_lock = threading.Lock()


# -- SQLite -------------------------------------------------------------------------------------

class SqliteTemplate:
    """One migrated SQLite file; :meth:`copy_to` gives each test its own copy."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._path: Path | None = None

    def path(self) -> Path:
        with _lock:
            if self._path is None:
                self._path = migrate_sqlite_file(self.directory / "template.sqlite3")
            return self._path

    def copy_to(self, dest: Path) -> str:
        shutil.copyfile(self.path(), dest)
        return f"sqlite:///{dest}"


def migrate_sqlite_file(path: Path) -> Path:
    """A real upgrade of a new file at ``path``, then a checkpoint so that the file alone is
    the whole database (no ``-wal`` or ``-shm`` beside it)."""
    engine = make_engine(f"sqlite:///{path}")
    try:
        upgrade(engine)
    finally:
        engine.dispose()
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    for suffix in ("-wal", "-shm"):
        side = Path(f"{path}{suffix}")
        if side.exists() and side.stat().st_size:
            raise RuntimeError(f"{side} still holds data after the checkpoint")
        side.unlink(missing_ok=True)
    return path


# -- PostgreSQL ---------------------------------------------------------------------------------

def record_upgrade(url: str) -> str:
    """Run a real upgrade on the (empty) schema ``url`` points at and return every statement
    it sent that changes something, as one SQL script with literal values."""
    import psycopg

    engine = make_engine(url)
    statements: list[str] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
                executemany: bool) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            return  # Alembic and the dialect looking around (has_table, the version read)
        mogrify = psycopg.ClientCursor(cursor.connection).mogrify
        if executemany:
            rendered = [mogrify(statement, p) for p in parameters]
        elif parameters:
            rendered = [mogrify(statement, parameters)]
        else:
            rendered = [statement]
        statements.extend(s.strip().rstrip(";") for s in rendered)

    event.listen(engine, "before_cursor_execute", capture)
    try:
        upgrade(engine)
    finally:
        event.remove(engine, "before_cursor_execute", capture)
        engine.dispose()
    if not statements:
        raise RuntimeError("the upgrade sent no statements: was the schema not empty?")
    return ";\n".join(statements) + ";\n"


class PgTemplate:
    """Fresh PostgreSQL schemas at head: :meth:`create` makes one from the recorded upgrade,
    :meth:`drop` removes it. The recording is made once, on first use."""

    def __init__(self, admin_url: str, schema_url: Any) -> None:
        self.admin_url = admin_url
        self.schema_url = schema_url  # schema name -> URL whose search_path is that schema
        self._admin: Engine | None = None
        self._script: str | None = None
        #: The schema the script was recorded in: named in it where the migrations pin a
        #: function's search_path, and replaced by each new schema's name.
        self._recorded_in = ""

    def admin(self) -> Engine:
        with _lock:
            if self._admin is None:
                self._admin = create_engine(self.admin_url, isolation_level="AUTOCOMMIT",
                                            pool_size=1, max_overflow=4)
            return self._admin

    def script(self) -> str:
        if self._script is None:
            with _lock:
                if self._script is None:
                    self._script = self._record()
        return self._script

    def _record(self) -> str:
        import secrets

        schema = f"t_tmpl_{secrets.token_hex(6)}"
        self._recorded_in = schema
        admin = create_engine(self.admin_url, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.execute(text(f'CREATE SCHEMA "{schema}"'))
            try:
                return record_upgrade(self.schema_url(schema))
            finally:
                with admin.connect() as conn:
                    conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        finally:
            admin.dispose()

    def create(self, schema: str, migrated: bool = True) -> None:
        """Create ``schema``, at head unless ``migrated`` is False (then empty), in one round
        trip and one transaction."""
        sql = f'BEGIN;\nCREATE SCHEMA "{schema}";\n'
        if migrated:
            sql += (f"SELECT pg_catalog.set_config('search_path', '\"{schema}\"', true);\n"
                    + self.script().replace(f'"{self._recorded_in}"', f'"{schema}"'))
        sql += "COMMIT;\n"
        with self.admin().connect() as conn:
            # The driver's own execute with no parameters: the simple query protocol, which
            # takes many statements at once (and leaves "%" in literals alone).
            conn.connection.driver_connection.execute(sql)  # type: ignore[union-attr]

    def drop(self, schema: str) -> None:
        with self.admin().connect() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))

    def dispose(self) -> None:
        if self._admin is not None:
            self._admin.dispose()
            self._admin = None
