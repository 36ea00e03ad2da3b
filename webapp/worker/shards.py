"""Lane shards (PostgreSQL): how several workers split the lanes so that, with a backlog, they
claim disjoint lanes instead of claiming each other's and releasing them.

Lanes fall into ``SHARDS`` shards by a hash the claim computes. Each draining worker holds
about its share of them as session advisory locks on its lane-lock connection, and a shared
"presence" lock that counts it. Ownership is only a preference of the claim: the lane locks
still decide who sends.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Callable
from typing import NamedTuple

from sqlalchemy import Connection, text

from ..outbox.claims import SHARDS

log = logging.getLogger(__name__)

_PRESENCE = SHARDS  # the key every draining worker holds shared: how many workers there are
#: How often a worker reads who owns which shard and takes or gives up its share.
REBALANCE_SECONDS = 0.5
#: A worker whose lock connection has run nothing for this long (its drain loop is stuck, or
#: its host is cut off and the server has not noticed yet) is not counted, and the shards it
#: still holds are claimed by the others as if they were theirs.
STALE_OWNER_SECONDS = 60.0
#: A worker short of its share (others have not given theirs up yet) leaves their shards
#: alone this long; after it, it fills its batches from them as if it held its share.
SHORT_OF_SHARE_SECONDS = 5.0


class ShardView(NamedTuple):
    """What a claim should know of the lane shards."""

    #: The shards this worker does not own: a batch is claimed from the others first.
    skip: tuple[int, ...] = ()
    #: Whether to fill a batch that its own shards left short from ``skip``: yes when this
    #: worker holds its share (its shards ran dry), no while it waits for its share.
    fill: bool = True


# Who holds which shard (and the presence key) in this schema's space, and whether the holder
# is live: its lock connection ran something lately (or we may not see when: then it counts).
_SHARD_LOCKS = text("""
SELECT l.objid::bigint AS key, l.pid, l.pid = pg_backend_pid() AS mine,
       a.query_start IS NULL
       OR a.query_start > now() - make_interval(secs => :stale) AS live
FROM pg_locks AS l
LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted
  AND l.classid = CAST(:space AS oid)
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
""")
_UNLOCK = text("SELECT pg_advisory_unlock(CAST(:space AS integer), s) "
               "FROM unnest(CAST(:keys AS integer[])) s")


def shard_space(schema: str) -> int:
    """The first key of a schema's shard locks (two-int advisory locks): workers of different
    schemas in one database never count each other."""
    digest = hashlib.blake2b(f"billing-outbox shards\x1f{schema}".encode(), digest_size=4)
    return int.from_bytes(digest.digest(), "big") & 0x7FFFFFFF


class ShardOwnership:
    """This worker's shards, held on the lane-lock connection its owner hands in. Not
    thread-safe on its own: the owner calls it holding its lock."""

    def __init__(self, monotonic: Callable[[], float]) -> None:
        self._monotonic = monotonic
        self._space: int | None = None
        self._present = False
        self._shards: set[int] = set()
        self._skip: tuple[int, ...] = ()
        self._short_since: float | None = None
        self._stale_seen: set[int] = set()  # a silent owner's shards, as last logged
        self._read_at = -REBALANCE_SECONDS
        self._rng = random.Random()  # noqa: S311 - spreading shards, not security

    def owned(self) -> set[int]:
        return set(self._shards)

    def view(self, conn: Callable[[], Connection], drop: Callable[[], None], *,
             draining: bool) -> ShardView:
        """The lane shards this worker does not own, for the claim to leave to their owners
        first (and unowned ones to the next rebalance); on the way, take or give up shards so
        this worker owns its share (``SHARDS`` / workers, rounded up), at most every
        ``REBALANCE_SECONDS``.

        A worker that is not draining (its breaker is open) gives up its shards and is no
        longer counted. Never raises: without the view, the claim simply prefers nothing.
        ``drop`` is called when the connection broke (everything held on it is gone).
        """
        if not draining:
            if self._present or self._shards:
                self._give_up(conn, drop)
            return ShardView()
        now = self._monotonic()
        if now - self._read_at >= REBALANCE_SECONDS:
            self._read_at = now
            try:
                self._rebalance(conn(), now)
            except Exception:
                log.exception("reading the lane shards failed; claiming without them")
                drop()
                self._skip, self._short_since = (), None
        short = self._short_since is not None \
            and now - self._short_since < SHORT_OF_SHARE_SECONDS
        return ShardView(self._skip, not short)

    def forget(self) -> None:
        """The connection is gone, and with it every lock it held."""
        self._present, self._shards, self._skip = False, set(), ()
        self._space, self._short_since = None, None
        self._read_at = -REBALANCE_SECONDS

    def _rebalance(self, conn: Connection, now: float) -> None:
        if self._space is None:
            self._space = shard_space(conn.execute(text("SELECT current_schema()")).scalar_one())
        space = self._space
        if not self._present:
            self._present = bool(conn.execute(text(
                "SELECT pg_try_advisory_lock_shared(CAST(:space AS integer), "
                "CAST(:key AS integer))"), {"space": space, "key": _PRESENCE}).scalar_one())
        rows = conn.execute(_SHARD_LOCKS, {"space": space,
                                           "stale": STALE_OWNER_SECONDS}).all()
        # Live workers in pid order; the first SHARDS % n of them own one shard more.
        workers = sorted(pid for key, pid, own, live in rows
                         if key == _PRESENCE and (live or own))
        me = next((pid for key, pid, own, _ in rows if own and key == _PRESENCE), None)
        rank = workers.index(me) if me in workers else len(workers)
        n = max(1, len(workers))
        share = SHARDS // n + (1 if rank < SHARDS % n else 0)
        mine = {key for key, _, own, _ in rows if own and key < SHARDS}
        taken = {key for key, _, own, _ in rows if not own and key < SHARDS}
        stale = {key for key, _, own, live in rows if not own and not live and key < SHARDS}
        if len(mine) > share:
            extra = self._rng.sample(sorted(mine), len(mine) - share)
            conn.execute(_UNLOCK, {"space": space, "keys": extra})
            mine -= set(extra)
        elif len(mine) < share:
            free = [k for k in range(SHARDS) if k not in mine and k not in taken]
            wanted = self._rng.sample(free, min(len(free), share - len(mine)))
            if wanted:
                got = set(conn.execute(text(
                    "SELECT s FROM unnest(CAST(:keys AS integer[])) s "
                    "WHERE pg_try_advisory_lock(CAST(:space AS integer), s)"),
                    {"space": space, "keys": wanted}).scalars())
                mine |= got  # the rest: another worker took them first
        self._shards = mine
        self._skip = tuple(k for k in range(SHARDS) if k not in mine and k not in stale)
        if stale and stale != self._stale_seen:  # once per change, not every half second
            log.warning("lane shards %s are held by a worker that has not been heard from for "
                        "%.0fs; claiming their events as this worker's own", sorted(stale),
                        STALE_OWNER_SECONDS)
        self._stale_seen = stale
        if len(mine) + len(stale) >= share:  # a silent owner's shards count as its own
            self._short_since = None
        elif self._short_since is None:
            self._short_since = now

    def _give_up(self, conn: Callable[[], Connection], drop: Callable[[], None]) -> None:
        try:
            c = conn()
            if self._shards and self._space is not None:
                c.execute(_UNLOCK, {"space": self._space, "keys": sorted(self._shards)})
                self._shards = set()
            if self._present and self._space is not None:
                c.execute(text("SELECT pg_advisory_unlock_shared(CAST(:space AS integer), "
                               "CAST(:key AS integer))"),
                          {"space": self._space, "key": _PRESENCE})
                self._present = False
        except Exception:
            # What is still marked held is given up again next time, or goes with the
            # connection.
            log.exception("giving up the lane shards failed")
            drop()
            return
        self._skip, self._short_since, self._read_at = (), None, -REBALANCE_SECONDS
