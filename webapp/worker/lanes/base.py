"""The lane lock interface: one call in flight per (Stripe customer, meter) lane, in this
process and across every process. Busy lanes are skipped, never waited on."""

from __future__ import annotations

import hashlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable

from ..shards import ShardView

Lane = tuple[str, str]


def lane_key(lane: Lane, space: str = "") -> int:
    """A signed 64-bit key for a lane (PostgreSQL advisory lock; SQLite byte offset).
    ``space`` keeps outboxes that share a lock namespace apart: on PostgreSQL it is the
    schema, since advisory locks are per database and two outboxes in two schemas of one
    database must never skip each other's lanes."""
    prefix = f"billing-outbox\x1f{space}" if space else "billing-outbox"
    digest = hashlib.blake2b(f"{prefix}\x1f{lane[0]}\x1f{lane[1]}".encode(),
                             digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class LaneLocks(ABC):
    """The lanes this process holds (a set, for its own threads), and a backend that holds
    them for every other process: :meth:`_try` and :meth:`_unlock`. A backend's locks die
    with the process, so a SIGKILLed worker's lanes are free again at once."""

    #: Whether workers split the lanes by shards (PostgreSQL).
    sharded = False

    def __init__(self) -> None:
        self._held: set[Lane] = set()
        self._mutex = threading.Lock()

    def busy(self) -> set[Lane]:
        """The lanes this process holds now."""
        with self._mutex:
            return set(self._held)

    def acquire(self, lanes: Iterable[Lane]) -> set[Lane]:
        """Take every free lane of ``lanes``; return those taken."""
        with self._mutex:
            wanted = [lane for lane in dict.fromkeys(lanes) if lane not in self._held]
            if not wanted:
                return set()
            got = self._try(wanted)
            self._held |= got
            return got

    def release(self, lanes: Iterable[Lane]) -> None:
        """Give back lanes this process holds (others are ignored)."""
        with self._mutex:
            mine = [lane for lane in lanes if lane in self._held]
            if not mine:
                return
            self._held -= set(mine)
            self._unlock(mine)

    def shard_view(self, *, draining: bool = True) -> ShardView:
        """What the next claim should know of the lane shards: nothing, but on PostgreSQL."""
        return ShardView()

    def shards(self) -> set[int]:
        """The shards this worker owns (PostgreSQL; for tests and tools)."""
        return set()

    def close(self) -> None:
        """Give back every lane (and shard), for good."""
        with self._mutex:
            self._held.clear()
            self._close()

    @abstractmethod
    def _try(self, lanes: list[Lane]) -> set[Lane]:
        """Take those of ``lanes`` no other process holds (called holding the mutex)."""

    @abstractmethod
    def _unlock(self, lanes: list[Lane]) -> None:
        """Give ``lanes`` back to the other processes (called holding the mutex)."""

    def _close(self) -> None:  # noqa: B027 - optional: most backends hold nothing more
        """Drop the backend's hold on everything (called holding the mutex)."""
