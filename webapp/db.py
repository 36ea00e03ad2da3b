"""Engine and session factory. Nothing connects at import time."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

#: The execution option that marks a connection as a reader (see :func:`reading`).
READ_ONLY = "billing_outbox_read_only"


def make_engine(url: str, **kwargs: Any) -> Engine:
    """Create an engine tuned for the outbox on SQLite or PostgreSQL.

    SQLite: WAL journal, a busy timeout so concurrent writers wait instead of failing, and
    ``BEGIN IMMEDIATE`` for write transactions so a claim never upgrades a read lock (which
    SQLite answers with "database is locked" at once); readers (:func:`reading`) begin
    deferred, so they never hold the write lock a drain pass waits on.
    """
    # SQL errors name the statement, never its values (a password hash, a customer's data).
    kwargs.setdefault("hide_parameters", True)
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False},
                               **kwargs)
        _tune_sqlite(engine)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    kwargs.setdefault("pool_size", 10)
    kwargs.setdefault("max_overflow", 20)
    return create_engine(url, **kwargs)


def _tune_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy, not pysqlite, decide when transactions begin.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # A reader's snapshot needs no lock: in WAL mode it never blocks a writer.
        deferred = conn.get_execution_options().get(READ_ONLY)
        conn.exec_driver_sql("BEGIN" if deferred else "BEGIN IMMEDIATE")


@contextmanager
def reading(engine: Engine) -> Iterator[Connection]:
    """A connection for reads only: one snapshot for everything read through it (so numbers
    read by separate statements agree), and no lock a writer waits on.

    PostgreSQL: ``REPEATABLE READ, READ ONLY`` (a write through it fails instead of
    happening). SQLite: a deferred ``BEGIN`` (WAL readers never block the writer), instead of
    the ``BEGIN IMMEDIATE`` that every other transaction takes.
    """
    with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            conn = conn.execution_options(isolation_level="REPEATABLE READ",
                                          postgresql_readonly=True)
        else:
            conn = conn.execution_options(**{READ_ONLY: True})
        yield conn


@contextmanager
def exporting(engine: Engine) -> Iterator[Connection]:
    """A reader (:func:`reading`) for an export: queries read whole, a batch at a time,
    through server-side cursors (``stream_results``). On PostgreSQL they are planned to be
    read whole, not for their first tenth (a cursor's default, which may walk the primary key
    past every row that does not match: 8 s instead of 1 for the dead events with one error
    code at 10 million rows), without JIT (compiling took longer than it saved), and times
    come back in UTC as stored, instead of each converted to the server's zone and back."""
    with reading(engine) as conn:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql("SET LOCAL cursor_tuple_fraction = 1")
            conn.exec_driver_sql("SET LOCAL jit = off")
            conn.exec_driver_sql("SET LOCAL TimeZone = 'UTC'")
        yield conn


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions that keep loaded objects usable after commit (views render after commit)."""
    return sessionmaker(engine, expire_on_commit=False)
