"""Debian's PgBouncer in front of the local PostgreSQL, started by a test: one alias per pool
mode (``tx``: transaction pooling, ``session``: session pooling) onto one database."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

BINARY = "/usr/sbin/pgbouncer"


def available() -> str | None:
    """None when PgBouncer is installed, else why not."""
    return None if Path(BINARY).exists() or shutil.which("pgbouncer") else (
        "PgBouncer is not installed (apt-get install pgbouncer; .ci/run installs it)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgBouncer:
    """``start()`` writes the configuration into ``workdir`` and waits until it answers."""

    def __init__(self, server_url: str, database: str, schema: str, *,
                 pool_size: int = 4) -> None:
        parts = urlsplit(server_url.replace("+psycopg", ""))
        # Its own directory, open to the user it runs as (it refuses to run as root).
        self.workdir = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
        self.workdir.chmod(0o777)
        self.schema = schema
        self.port = _free_port()
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
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited: {self.log()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("pgbouncer did not listen within 15 s")

    def server_pids(self) -> set[int]:
        """The PostgreSQL process of each server connection the pooler holds (``SHOW SERVERS``
        on its admin console)."""
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={self.port} user={self.server[2]} "
                             "dbname=pgbouncer", autocommit=True) as admin:
            cur = admin.execute("SHOW SERVERS")
            names = [d.name for d in cur.description or ()]
            return {int(row[names.index("remote_pid")]) for row in cur.fetchall()}

    def log(self) -> str:
        path = self.workdir / "pgbouncer.log"
        return path.read_text() if path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        shutil.rmtree(self.workdir, ignore_errors=True)
