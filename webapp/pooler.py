"""Transaction poolers (PgBouncer in transaction mode, the managed hosts' poolers) in front of
PostgreSQL: how the product finds one, and what it changes.

A transaction pooler gives each transaction of a client whichever server connection is free, so
nothing that lives on a session survives from one transaction to the next: a session advisory
lock (the drainer's lanes and shards, ``webapp.worker.lanes.postgres``) is taken on one server
connection and left there for whichever client comes next, and a statement prepared on one
server connection is missing, or another's, on the next. So:

- every command that holds a lane or shard lock refuses to start through one unless
  ``DATABASE_DIRECT_URL`` names a direct (or session-pooled) connection, which the locks then
  use (:func:`session_state_problem`);
- with ``DATABASE_DIRECT_URL`` set, ``DATABASE_URL`` is taken to be pooled, and its
  connections never prepare a statement server-side (:func:`pooled_engine_options`).

Found by asking who answers: one client connection reads its server's process id, a second
client opens a transaction (which holds a server connection for as long as it is open) and
reads its own, then the first asks again. Directly, or through a session pooler, the first
client keeps one server process and the second never has it; through a transaction pooler the
second is handed the server the first just let go (PgBouncer hands out the most recently used
one first), or the first is moved.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy.engine import make_url

from .config import Settings

log = logging.getLogger(__name__)

_PID = "SELECT pg_backend_pid()"
#: Transactions held open by the second client: enough for a pool handing servers out in
#: another order to give it the first client's at least once.
_HOLDERS = 3


def libpq_url(url: str) -> str:
    """A SQLAlchemy ``postgresql+psycopg://`` URL as a libpq connection URI."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def transaction_pooled(url: str, *, connect_timeout: int = 5) -> bool:
    """Whether ``url`` goes through a transaction pooler (see the module's text)."""
    import psycopg

    conninfo = libpq_url(url)
    options: dict[str, Any] = {"connect_timeout": connect_timeout, "prepare_threshold": None}
    holders: list[Any] = []
    with psycopg.connect(conninfo, autocommit=True, **options) as first:
        mine = _pid(first)
        try:
            for _ in range(_HOLDERS):
                holder = psycopg.connect(conninfo, **options)  # in a transaction from its
                holders.append(holder)                        # first statement on
                if _pid(holder) == mine or _pid(first) != mine:
                    return True
        finally:
            for holder in holders:
                holder.close()
    return False


def _pid(conn: Any) -> int:
    row = conn.execute(_PID).fetchone()
    assert row is not None
    return int(row[0])


def session_state_problem(settings: Settings) -> str | None:
    """One line saying why a command that holds lane and shard locks cannot start, or None.

    Asked only of PostgreSQL without ``DATABASE_DIRECT_URL`` (with it, the locks go there)."""
    import psycopg

    if not settings.is_postgres or settings.database_direct_url:
        return None
    try:
        pooled = transaction_pooled(settings.database_url)
    except psycopg.Error as exc:
        # Unreachable now: start as before (the drainer waits for the database) rather than
        # refuse a worker started beside a database that is still coming up.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        log.warning("could not look for a transaction pooler in front of the database (%s); "
                    "starting without the check", first)
        return None
    if not pooled:
        return None
    return ("DATABASE_URL goes through a transaction pooler (PgBouncer in transaction mode or "
            "the like), where the drainer's lane and shard locks would not hold: set "
            "DATABASE_DIRECT_URL to a direct or session-pooled connection to the same database "
            "(docs/deployment.md, Poolers)")


def pooled_engine_options(settings: Settings) -> dict[str, Any]:
    """``make_engine`` options for ``DATABASE_URL``: with ``DATABASE_DIRECT_URL`` set it is
    pooled, so psycopg never prepares a statement server-side there."""
    if settings.is_postgres and settings.database_direct_url:
        return {"connect_args": {"prepare_threshold": None}}
    return {}
