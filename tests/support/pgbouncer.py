"""Debian's PgBouncer in front of the local PostgreSQL, started by a test: one alias per pool
mode (``tx``: transaction pooling, ``session``: session pooling) onto one database."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from .processes import free_port, terminate, wait_listening

BINARY = "/usr/sbin/pgbouncer"


def available() -> str | None:
    """None when PgBouncer is installed, else why not."""
    return None if Path(BINARY).exists() or shutil.which("pgbouncer") else (
        "PgBouncer is not installed (apt-get install pgbouncer; .ci/run installs it)")


class PgBouncer:
    """``start()`` writes the configuration into ``workdir`` and waits until it answers."""

    def __init__(self, server_url: str, database: str, schema: str, *,
                 pool_size: int = 4) -> None:
        parts = urlsplit(server_url.replace("+psycopg", ""))
        # Its own directory, open to the user it runs as (it refuses to run as root).
        self.workdir = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
        self.workdir.chmod(0o777)
        self.schema = schema
        self.port = free_port()
        self.server = (parts.hostname or "127.0.0.1", parts.port or 5432,
                       parts.username or "postgres")
        self.database = database
        self.pool_size = pool_size
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, alias: str) -> str:
        """A SQLAlchemy URL through the pooler's ``alias`` (``tx`` or ``session``)."""
        return f"postgresql+psycopg://{self.server[2]}@127.0.0.1:{self.port}/{alias}"

    def start(self) -> PgBouncer:
        host, port, user = self.server
        # Each new server connection is put in the test's schema (PgBouncer passes no
        # ``options`` startup parameter on).
        target = (f"host={host} port={port} user={user} dbname={self.database} "
                  f"connect_query='SET search_path = {self.schema}'")
        ini = self.workdir / "pgbouncer.ini"
        ini.write_text(f"""[databases]
tx = {target} pool_mode=transaction
session = {target} pool_mode=session

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = any
admin_users = postgres
pool_mode = transaction
default_pool_size = {self.pool_size}
max_client_conn = 200
server_reset_query =
ignore_startup_parameters = extra_float_digits, options
logfile = {self.workdir / 'pgbouncer.log'}
pidfile = {self.workdir / 'pgbouncer.pid'}
""")
        ini.chmod(0o644)
        as_user = ["-u", "postgres"] if os.geteuid() == 0 else []
        self.proc = subprocess.Popen([BINARY, *as_user, str(ini)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.STDOUT)
        wait_listening(self.proc, self.port, "pgbouncer", self.log)
        return self

    def server_pids(self) -> set[int]:
        """The PostgreSQL process of each server connection the pooler holds (``SHOW SERVERS``
        on its admin console)."""
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={self.port} user={self.server[2]} "
                             "dbname=pgbouncer", autocommit=True) as admin:
            cur = admin.execute("SHOW SERVERS")
            names = [d.name for d in cur.description or ()]
            return {int(row[names.index("remote_pid")]) for row in cur.fetchall()}

    def admin(self, command: str) -> None:
        """One command on the admin console (``PAUSE tx``, ``KILL tx``, ``RESUME tx``…)."""
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={self.port} user={self.server[2]} "
                             "dbname=pgbouncer", autocommit=True) as admin:
            admin.execute(command)

    def advisory_locks(self, engine: Any) -> int:
        """Advisory locks held by the pooler's server connections (read over ``engine``, a
        direct connection); session state there would outlive the client that took it."""
        from sqlalchemy import text

        pids = self.server_pids()
        if not pids:
            return 0
        with engine.connect() as conn:
            return int(conn.execute(text(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = ANY(:p)"),
                {"p": list(pids)}).scalar_one())

    def prepared_per_server(self) -> list[int]:
        """Statements prepared on each of the pooler's server connections (``tx`` alias): as
        many transactions held open at once as the pool has servers, so each reads a
        different one's."""
        import psycopg

        conninfo = f"host=127.0.0.1 port={self.port} user={self.server[2]} dbname=tx"
        held = [psycopg.connect(conninfo, prepare_threshold=None)
                for _ in range(self.pool_size)]
        try:
            pids = {c.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
                    for c in held}
            assert len(pids) == self.pool_size
            return [c.execute("SELECT count(*) FROM pg_prepared_statements")
                    .fetchone()[0] for c in held]  # type: ignore[index]
        finally:
            for c in held:
                c.rollback()  # a client leaving in a transaction would cost the pooler its server
                c.close()

    def log(self) -> str:
        path = self.workdir / "pgbouncer.log"
        return path.read_text() if path.exists() else ""

    def stop(self) -> None:
        terminate(self.proc)
        shutil.rmtree(self.workdir, ignore_errors=True)


@contextmanager
def in_front_of(schema_url: str, *, pool_size: int = 4) -> Iterator[PgBouncer]:
    """A started PgBouncer whose server connections land in the schema of ``schema_url`` (the
    tests' ``pg_url``); a test that needs it fails under ``REQUIRE_POSTGRES=1`` (as in CI)
    when PgBouncer is missing, and is skipped otherwise."""
    import pytest
    from conftest import PG_URL, REQUIRE_POSTGRES

    reason = available()
    if reason is not None:
        if REQUIRE_POSTGRES:
            pytest.fail(f"REQUIRE_POSTGRES=1 but {reason}")
        pytest.skip(reason)
    options = unquote(parse_qs(urlsplit(schema_url).query)["options"][0])
    schema = options.split("search_path=", 1)[1]
    database = urlsplit(PG_URL).path.lstrip("/")
    pooler = PgBouncer(PG_URL, database, schema, pool_size=pool_size).start()
    try:
        yield pooler
    finally:
        pooler.stop()
