"""Lanes on PostgreSQL: session advisory locks on a connection of their own, which also holds
this worker's lane shards (:mod:`webapp.worker.shards`). The server drops them with the
connection, so a killed worker's lanes are free at once, a cut-off one's within about a
minute (TCP keepalive)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from sqlalchemy import Connection, Engine, text

from ..shards import ShardOwnership, ShardView
from .base import Lane, LaneLocks, lane_key

log = logging.getLogger(__name__)

# The server drops a lock connection whose peer stopped answering within about a minute, and
# with it that worker's lanes and shards (the defaults would take over two hours).
_KEEPALIVE = text("SELECT set_config('tcp_keepalives_idle', '30', false), "
                  "set_config('tcp_keepalives_interval', '10', false), "
                  "set_config('tcp_keepalives_count', '3', false)")
_TRY = text("SELECT k, pg_try_advisory_lock(k) FROM unnest(CAST(:keys AS bigint[])) k")
_UNLOCK = text("SELECT pg_advisory_unlock(k) FROM unnest(CAST(:keys AS bigint[])) k")


class AdvisoryLaneLocks(LaneLocks):
    """Lanes as session advisory locks; shards on the same connection."""

    sharded = True

    def __init__(self, engine: Engine, *,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._engine = engine
        self._conn: Connection | None = None
        self._shards = ShardOwnership(monotonic)
        self._schema: str | None = None

    def shard_view(self, *, draining: bool = True) -> ShardView:
        """See :meth:`ShardOwnership.view`."""
        with self._mutex:
            return self._shards.view(self._connection, self._drop_if_broken, draining=draining)

    def shards(self) -> set[int]:
        with self._mutex:
            return self._shards.owned()

    def _connection(self) -> Connection:
        if self._conn is None or self._conn.closed or self._conn.invalidated:
            self._shards.forget()  # held on the connection that is gone, if any
            conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            conn.execute(_KEEPALIVE)
            self._schema = conn.execute(text("SELECT current_schema()")).scalar_one()
            self._conn = conn
        return self._conn

    def _keys(self, lanes: list[Lane]) -> list[int]:
        """The lanes' lock keys in this connection's schema (read when it was opened).
        ``public`` keeps the keys of versions that did not name the schema, so a rolling
        upgrade of the usual deployment never has two workers in one lane."""
        space = "" if self._schema in (None, "public") else self._schema
        return [lane_key(lane, space) for lane in lanes]

    def _try(self, lanes: list[Lane]) -> set[Lane]:
        try:
            conn = self._connection()
            keys = self._keys(lanes)
            rows = conn.execute(_TRY, {"keys": keys}).all()
        except Exception:
            log.exception("lane lock connection failed; skipping these lanes for now")
            self._drop()
            return set()
        taken = {k for k, ok in rows if ok}
        return {lane for lane, k in zip(lanes, keys, strict=True) if k in taken}

    def _unlock(self, lanes: list[Lane]) -> None:
        try:
            conn = self._connection()
            conn.execute(_UNLOCK, {"keys": self._keys(lanes)})
        except Exception:
            # The locks died with the connection; nothing is left to release.
            log.exception("lane unlock failed; dropping the lock connection")
            self._drop()

    def _close(self) -> None:
        self._shards.forget()
        if self._conn is not None:
            # Closed, not returned to the pool: a pooled connection would keep this worker's
            # session locks (lanes, shards, its presence) after it is gone.
            self._conn.invalidate()
            self._conn.close()
            self._conn = None

    def _drop_if_broken(self) -> None:
        if self._conn is not None and self._conn.invalidated:
            self._drop()

    def _drop(self) -> None:
        self._shards.forget()
        if self._conn is not None:
            try:
                self._conn.invalidate()
                self._conn.close()
            except Exception:  # noqa: S110 - the connection is gone either way
                pass
            self._conn = None
