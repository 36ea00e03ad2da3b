"""The drainer: claims due events, sends them through the gateway, records what happened.

``Drainer.drain_once`` is one pass (the CLI's ``drain --once``, the in-app scheduler job and
the tests call it directly); ``Drainer.run`` loops until asked to stop. No transaction is open
while Stripe is called.

Guarantees kept here, on top of the claim's:
- one call in flight per (Stripe customer, meter) across every process (``LaneLocks``);
- a call starts only while the claim has longer left than the longest call can take, so an
  expired claim can never overlap a live call for the same event;
- a Stripe outage costs a handful of calls (``CircuitBreaker``), not every event's budget;
- a systemic failure (401/403/404) pauses sending for every worker and changes no event.

Several workers on PostgreSQL split the lanes by shards (``LaneLocks.shard_view``) and each
claims from its own first, so that they do not claim events of each other's lanes only to
release them; a preference of the claim, not a guarantee (the lane locks are that).
"""

from __future__ import annotations

import gc
import hashlib
import logging
import os
import random
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import NamedTuple

from sqlalchemy import Connection, Engine, text

from .config import Settings
from .models import utcnow
from .outbox import store
from .outbox.states import DEAD_PAST_WINDOW, CallResult, Outcome, Policy, past_dedupe_window
from .stripe_gateway import Gateway, MeterEvent, StripeGateway

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Windows: lanes are then per process only
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

Lane = tuple[str, str]
Clock = Callable[[], datetime]


_frozen = False


def freeze_startup_objects() -> None:
    """Take what the process loaded at start-up out of the garbage collector's way; once.

    A drain loop allocates thousands of short-lived tuples per batch, and the objects of the
    batches in flight live long enough to be promoted, so full collections come often; each
    walked every object loaded at start-up (SQLAlchemy's metadata and caches, the SDK, the
    modules), none of which will ever be garbage. ``gc.freeze()`` moves them to a generation
    collections skip. Measured by ``bench/``'s drain: about a fifth of the worker's CPU.
    Called by the ``worker`` command once the app is built, before it starts draining (the
    full collection before the freeze takes a moment).
    """
    global _frozen
    if not _frozen:
        _frozen = True
        gc.collect()
        gc.freeze()


def worker_name() -> str:
    """``host:pid:random``: unique per process, readable in the attempts table."""
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(2).hex()}"


def policy_from(settings: Settings) -> Policy:
    return Policy(max_attempts=settings.max_attempts,
                  initial_backoff_seconds=settings.initial_backoff_seconds,
                  max_backoff_seconds=settings.max_backoff_seconds,
                  dedupe_window_seconds=settings.dedupe_window_seconds)


def gateway_from(settings: Settings) -> Gateway | None:
    """The Stripe gateway, or None without ``STRIPE_API_KEY`` (then nothing is sent)."""
    if not settings.stripe_api_key:
        return None
    return StripeGateway(settings.stripe_api_key, api_base=settings.stripe_api_base,
                         timeout_seconds=settings.stripe_timeout_seconds,
                         default_meter=settings.stripe_meter_event_name,
                         pool_size=settings.concurrency)


# -- per-process helpers ---------------------------------------------------------------------------

class RateLimiter:
    """A token bucket: at most ``rate`` calls per second in this process, in every second.

    The bucket holds one token, so calls are spaced ``1/rate`` apart: a bucket a second deep
    would let a full bucket's burst and a second's refill land in the same second (twice the
    ceiling, which Stripe's per-second limit answers with 429s).
    """

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.capacity = 1.0
        self._tokens = self.capacity
        self._at = time.monotonic()
        self._lock = threading.Lock()

    def acquire(self, stop: threading.Event | None = None) -> bool:
        """Wait for a token; False if ``stop`` was set while waiting."""
        while True:
            with self._lock:
                now = time.monotonic()
                self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.rate)
                self._at = now
                if self._tokens >= 1.0:
                    self._tokens -= 1.0
                    return True
                wait = (1.0 - self._tokens) / self.rate
            if stop is not None:
                if stop.wait(wait):
                    return False
            else:
                time.sleep(wait)


class CircuitBreaker:
    """Holds claims back when most recent calls found Stripe unreachable or failing.

    Closed: normal. Open: no claims until the cool-down ends. Half-open: one event is claimed
    as a probe; a definite answer closes the breaker, another failure re-opens it with twice
    the cool-down (up to ``max_cooldown``).
    """

    FAILING = (Outcome.NOT_EXECUTED, Outcome.UNKNOWN)

    def __init__(self, *, window: int = 20, threshold: float = 0.6, min_calls: int = 10,
                 cooldown: float = 2.0, max_cooldown: float = 60.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.window, self.threshold, self.min_calls = window, threshold, min_calls
        self.base_cooldown, self.max_cooldown = cooldown, max_cooldown
        self._recent: deque[bool] = deque(maxlen=window)
        self._failures = 0  # True values in _recent, kept as they come and go
        self._cooldown = cooldown
        self._open_until: float | None = None
        self._monotonic = monotonic
        self._lock = threading.Lock()

    @property
    def state(self) -> str:
        with self._lock:
            if self._open_until is None:
                return "closed"
            return "open" if self._monotonic() < self._open_until else "half_open"

    def allow_batch(self) -> int | None:
        """How many events may be claimed now: None = no limit, 0 = none, 1 = a probe."""
        if self._open_until is None:  # closed: the common case, read without the lock
            return None
        state = self.state
        return None if state == "closed" else (0 if state == "open" else 1)

    def record(self, outcome: Outcome) -> None:
        """Count one call's outcome. While open, any definite answer (Stripe is reachable)
        closes the breaker; a failure after the cool-down (the probe's) re-opens it for twice
        as long."""
        failing = outcome in self.FAILING
        with self._lock:
            if self._open_until is not None:
                now = self._monotonic()
                if not failing:
                    self._open_until, self._cooldown = None, self.base_cooldown
                    self._recent.clear()
                    self._failures = 0
                elif now >= self._open_until:
                    self._cooldown = min(self.max_cooldown, self._cooldown * 2)
                    self._open_until = now + self._cooldown
                return
            recent = self._recent
            if len(recent) == self.window:
                self._failures -= recent[0]  # about to drop out of the window
            recent.append(failing)
            if not failing:
                return
            self._failures += 1
            if (len(recent) >= self.min_calls
                    and self._failures / len(recent) >= self.threshold):
                self._open_until = self._monotonic() + self._cooldown
                log.warning("circuit breaker open: %d of the last %d calls failed; holding "
                            "claims for %.1fs", self._failures, len(recent), self._cooldown)


def lane_key(lane: Lane) -> int:
    """A signed 64-bit advisory-lock key for a lane."""
    digest = hashlib.blake2b(f"billing-outbox\x1f{lane[0]}\x1f{lane[1]}".encode(),
                             digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


# Lane shards (PostgreSQL): ``store.SHARDS`` of them, a lane's computed by the claim. Each
# draining worker owns about its share, so that with a backlog the workers claim disjoint
# lanes instead of claiming each other's and releasing them. Ownership is only a preference
# of the claim: lane locks still decide who sends.
SHARDS = store.SHARDS
_PRESENCE = SHARDS  # the key every draining worker holds shared: how many workers there are
#: How often a worker reads who owns which shard and takes or gives up its share.
REBALANCE_SECONDS = 0.5
#: A worker whose lock connection has run nothing for this long (its drain loop is stuck, or
#: its host is cut off and the server has not noticed yet) is not counted, and the shards it
#: still holds are claimed by the others as if they were theirs.
STALE_OWNER_SECONDS = 60.0
#: With shards, a lane found busy in another process is left out of this process's claims
#: this long, so that a worker whose own shards ran dry does not claim and release the same
#: events of another's lane pass after pass. (Without shards, that would leave every lane to
#: whichever worker took it first.)
BUSY_ELSEWHERE_SECONDS = 1.0
#: A worker short of its share (others have not given theirs up yet) leaves their shards
#: alone this long; after it, it fills its batches from them as if it held its share.
SHORT_OF_SHARE_SECONDS = 5.0


class ShardView(NamedTuple):
    """What a claim should know of the lane shards (``LaneLocks.shard_view``)."""

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
# The server drops a lock connection whose peer stopped answering within about a minute, and
# with it that worker's lanes and shards (the defaults would take over two hours).
_KEEPALIVE = text("SELECT set_config('tcp_keepalives_idle', '30', false), "
                  "set_config('tcp_keepalives_interval', '10', false), "
                  "set_config('tcp_keepalives_count', '3', false)")


def shard_space(schema: str) -> int:
    """The first key of a schema's shard locks (two-int advisory locks): workers of different
    schemas in one database never count each other."""
    digest = hashlib.blake2b(f"billing-outbox shards\x1f{schema}".encode(), digest_size=4)
    return int.from_bytes(digest.digest(), "big") & 0x7FFFFFFF


def _sqlite_lock_path(engine: Engine | None) -> str | None:
    """The lane lock file next to a SQLite database file (None for in-memory databases)."""
    if engine is None or engine.dialect.name != "sqlite":
        return None
    database = engine.url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return os.path.abspath(database) + ".lanes"


class LaneLocks:
    """One call in flight per lane: in this process (a set) and across every process — on
    PostgreSQL with session advisory locks on a dedicated connection, on SQLite with byte-range
    locks (``fcntl``) in a file next to the database. Both die with the process, so a
    SIGKILLed worker's lanes are free again at once. Busy lanes are skipped, never waited on.

    On PostgreSQL, the same connection holds this worker's lane shards (``shard_view``).
    """

    def __init__(self, engine: Engine | None) -> None:
        self._engine = engine if engine is not None and engine.dialect.name == "postgresql" \
            else None
        self._held: set[Lane] = set()
        self._mutex = threading.Lock()
        self._conn: Connection | None = None
        # SQLite: several processes (worker, gunicorn workers) may share one database file.
        self._lock_path = _sqlite_lock_path(engine) if fcntl is not None else None
        self._fd: int | None = None
        self._fd_pid: int | None = None
        # Lane shards (PostgreSQL), all on ``_conn``: the advisory-lock space of this schema,
        # whether this worker is counted as present, the shards it owns, the others (which
        # its claims leave for last), since when it has been short of its share, when the
        # shards were last read.
        self._space: int | None = None
        self._present = False
        self._shards: set[int] = set()
        self._skip: tuple[int, ...] = ()
        self._short_since: float | None = None
        self._stale_seen: set[int] = set()  # a silent owner's shards, as last logged
        self._shards_read = -REBALANCE_SECONDS
        self._rng = random.Random()  # noqa: S311 - spreading shards, not security

    @property
    def sharded(self) -> bool:
        """Whether workers split the lanes by shards (PostgreSQL)."""
        return self._engine is not None

    def busy(self) -> set[Lane]:
        with self._mutex:
            return set(self._held)

    def acquire(self, lanes: Iterable[Lane]) -> set[Lane]:
        """Take every free lane of ``lanes``; return those taken."""
        with self._mutex:
            wanted = [lane for lane in dict.fromkeys(lanes) if lane not in self._held]
            if not wanted:
                return set()
            if self._engine is not None:
                got = self._pg_try(wanted)
            elif self._lock_path is not None:
                got = self._file_try(wanted)
            else:
                got = set(wanted)
            self._held |= got
            return got

    def release(self, lanes: Iterable[Lane]) -> None:
        with self._mutex:
            mine = [lane for lane in lanes if lane in self._held]
            if not mine:
                return
            self._held -= set(mine)
            if self._engine is not None:
                self._pg_unlock(mine)
            elif self._lock_path is not None:
                self._file_unlock(mine)

    def shard_view(self, *, draining: bool = True) -> ShardView:
        """PostgreSQL: the lane shards this worker does not own, for the claim to leave to
        their owners first (and unowned ones to the next rebalance); on the way, take or give
        up shards so this worker owns its share (``SHARDS`` / workers, rounded up), at most
        every ``REBALANCE_SECONDS``.

        A worker that is not draining (``draining=False``: its breaker is open) gives up its
        shards and is no longer counted. A worker that dies loses them with its connection.
        Never raises: without the view, the claim simply prefers nothing.
        """
        if self._engine is None:
            return ShardView()
        with self._mutex:
            if not draining:
                if self._present or self._shards:
                    self._give_up_shards()
                return ShardView()
            now = time.monotonic()
            if now - self._shards_read >= REBALANCE_SECONDS:
                self._shards_read = now
                try:
                    self._rebalance(now)
                except Exception:
                    log.exception("reading the lane shards failed; claiming without them")
                    if self._conn is not None and self._conn.invalidated:
                        self._drop_connection()
                    self._skip, self._short_since = (), None
            short = self._short_since is not None \
                and now - self._short_since < SHORT_OF_SHARE_SECONDS
            return ShardView(self._skip, not short)

    def shards(self) -> set[int]:
        """The shards this worker owns (PostgreSQL; for tests and tools)."""
        with self._mutex:
            return set(self._shards)

    def _rebalance(self, now: float) -> None:
        conn = self._connection()
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
            conn.execute(text("SELECT pg_advisory_unlock(CAST(:space AS integer), s) "
                              "FROM unnest(CAST(:keys AS integer[])) s"),
                         {"space": space, "keys": extra})
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

    def _give_up_shards(self) -> None:
        try:
            conn = self._connection()
            if self._shards and self._space is not None:
                conn.execute(text("SELECT pg_advisory_unlock(CAST(:space AS integer), s) "
                                  "FROM unnest(CAST(:keys AS integer[])) s"),
                             {"space": self._space, "keys": sorted(self._shards)})
                self._shards = set()
            if self._present and self._space is not None:
                conn.execute(text("SELECT pg_advisory_unlock_shared(CAST(:space AS integer), "
                                  "CAST(:key AS integer))"),
                             {"space": self._space, "key": _PRESENCE})
                self._present = False
        except Exception:
            # What is still marked held is given up again next time, or goes with the
            # connection.
            log.exception("giving up the lane shards failed")
            if self._conn is not None and self._conn.invalidated:
                self._drop_connection()
            return
        self._skip, self._short_since, self._shards_read = (), None, -REBALANCE_SECONDS

    def close(self) -> None:
        with self._mutex:
            self._held.clear()
            self._forget_shards()
            if self._conn is not None:
                # Closed, not returned to the pool: a pooled connection would keep this
                # worker's session locks (lanes, shards, its presence) after it is gone.
                self._conn.invalidate()
                self._conn.close()
                self._conn = None
            if self._fd is not None:
                if self._fd_pid == os.getpid():
                    os.close(self._fd)  # releases every lock of this process on the file
                self._fd = None

    # -- SQLite: byte-range locks, one byte per lane at a 62-bit hash of it ------------------
    @staticmethod
    def _offset(lane: Lane) -> int:
        return lane_key(lane) & ((1 << 62) - 1)

    def _lock_fd(self) -> int:
        if self._fd is None or self._fd_pid != os.getpid():  # (re)open after a fork
            assert self._lock_path is not None
            self._fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            self._fd_pid = os.getpid()
        return self._fd

    def _file_try(self, lanes: list[Lane]) -> set[Lane]:
        assert fcntl is not None
        try:
            fd = self._lock_fd()
        except OSError:
            log.exception("lane lock file %s unusable; skipping these lanes for now",
                          self._lock_path)
            return set()
        got: set[Lane] = set()
        for lane in lanes:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, self._offset(lane))
            except OSError:
                continue  # held by another process
            got.add(lane)
        return got

    def _file_unlock(self, lanes: list[Lane]) -> None:
        assert fcntl is not None
        if self._fd is None or self._fd_pid != os.getpid():
            return
        for lane in lanes:
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, self._offset(lane))
            except OSError:
                log.exception("lane unlock failed")

    def _connection(self) -> Connection:
        if self._conn is None or self._conn.closed or self._conn.invalidated:
            assert self._engine is not None
            self._forget_shards()  # held on the connection that is gone, if any
            conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            conn.execute(_KEEPALIVE)
            self._conn = conn
        return self._conn

    def _pg_try(self, lanes: list[Lane]) -> set[Lane]:
        keys = [lane_key(lane) for lane in lanes]
        try:
            rows = self._connection().execute(
                text("SELECT k, pg_try_advisory_lock(k) FROM unnest(CAST(:keys AS bigint[])) k"),
                {"keys": keys}).all()
        except Exception:
            log.exception("lane lock connection failed; skipping these lanes for now")
            self._drop_connection()
            return set()
        taken = {k for k, ok in rows if ok}
        return {lane for lane, k in zip(lanes, keys, strict=True) if k in taken}

    def _pg_unlock(self, lanes: list[Lane]) -> None:
        try:
            self._connection().execute(
                text("SELECT pg_advisory_unlock(k) FROM unnest(CAST(:keys AS bigint[])) k"),
                {"keys": [lane_key(lane) for lane in lanes]})
        except Exception:
            # The locks died with the connection; nothing is left to release.
            log.exception("lane unlock failed; dropping the lock connection")
            self._drop_connection()

    def _forget_shards(self) -> None:
        """The connection is gone, and with it every lock it held."""
        self._present, self._shards, self._skip = False, set(), ()
        self._space, self._short_since = None, None
        self._shards_read = -REBALANCE_SECONDS

    def _drop_connection(self) -> None:
        self._forget_shards()
        if self._conn is not None:
            try:
                self._conn.invalidate()
                self._conn.close()
            except Exception:  # noqa: S110 - the connection is gone either way
                pass
            self._conn = None


# -- the drainer -----------------------------------------------------------------------------------

@dataclass
class DrainSummary:
    """What one pass did; printed as JSON by ``drain --once``."""

    claimed: int = 0
    sent: int = 0
    retrying: int = 0
    dead: int = 0
    released: int = 0
    fenced: int = 0
    rescued: int = 0
    calls: int = 0
    paused: bool = False
    pause_reason: str | None = None
    skipped: str | None = None
    breaker: str = "closed"
    duration_ms: int = 0

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class _LaneResult:
    attempts: list[store.AttemptRecord] = field(default_factory=list)
    release: list[int] = field(default_factory=list)
    release_later: list[int] = field(default_factory=list)
    dead: list[tuple[int, str]] = field(default_factory=list)


@dataclass
class _Pass:
    """One pass between its phases: claimed (``_begin``), sent (``_send``), recorded
    (``_finish``)."""

    summary: DrainSummary
    started: float
    claim: store.Claim | None = None
    probing: bool = False
    results: list[_LaneResult] = field(default_factory=list)
    busy_ids: list[int] = field(default_factory=list)
    aborted: bool = False

    @property
    def events(self) -> int:
        return len(self.claim.events) if self.claim is not None else 0

    def released_any(self) -> bool:
        return bool(self.busy_ids) or any(r.release or r.release_later for r in self.results)


class Drainer:
    """Wires the outbox core to a gateway. One per process; thread-safe ``drain_once``."""

    def __init__(self, engine: Engine, settings: Settings, gateway: Gateway | None = None, *,
                 clock: Clock = utcnow, worker: str | None = None,
                 breaker: CircuitBreaker | None = None, rng: random.Random | None = None,
                 use_default_gateway: bool = True) -> None:
        self.engine = engine
        self.settings = settings
        self.gateway = gateway if gateway is not None or not use_default_gateway \
            else gateway_from(settings)
        self.clock = clock
        self.worker = worker or worker_name()
        self.policy = policy_from(settings)
        self.lanes = LaneLocks(engine)
        self.limiter = RateLimiter(settings.stripe_max_requests_per_second)
        self.breaker = breaker or CircuitBreaker()
        self.rng = rng or random.Random()  # noqa: S311 - jitter, not security
        self.stopping = threading.Event()
        self._pool: ThreadPoolExecutor | None = None
        self._pass_lock = threading.Lock()
        #: Whether this drainer takes a share of the lane shards (``LaneLocks.shard_view``):
        #: yes for a long-lived one (the worker, the in-app scheduler); the ``drain`` command,
        #: a one-off, claims the oldest due events as they come and leaves the split alone.
        self.shards = True
        self._busy_elsewhere: dict[Lane, float] = {}  # lane -> until when (monotonic)
        self._busy_elsewhere_lock = threading.Lock()
        self._last_rescue = 0.0
        self._last_probe = 0.0
        self.probe_interval_seconds = 30.0
        #: ``run`` overlaps the next claim and the last record with sending (PostgreSQL:
        #: each on its own connection; SQLite would only queue them behind one write lock).
        self.pipelined = engine.dialect.name == "postgresql"
        #: Every finished pass's figures added up (``claimed``, ``sent``, ``released``…).
        self.totals = DrainSummary()
        self.passes = 0
        self._totals_lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Stop claiming; in-flight calls finish, the rest of the batch is released."""
        self.stopping.set()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self.lanes.close()

    def run(self) -> None:
        """Drain until ``request_stop``; sleep ``OUTBOX_POLL_INTERVAL_SECONDS`` when idle."""
        log.info("worker %s started", self.worker)
        try:
            if self.pipelined:
                self._run_pipelined()
                return
            while not self.stopping.is_set():
                try:
                    summary = self.drain_once()
                except Exception:
                    log.exception("drain pass failed; retrying after the poll interval")
                    self.stopping.wait(self.settings.poll_interval_seconds)
                    continue
                full = summary.claimed >= self.settings.batch_size and not summary.released
                if not full:
                    self.stopping.wait(self.settings.poll_interval_seconds)
        finally:
            self.close()
            log.info("worker %s stopped", self.worker)

    def _run_pipelined(self) -> None:
        """``drain_once`` in a loop, with its three phases overlapped across batches: while
        batch N is being sent, batch N+1 is claimed (a claimer thread) and batch N-1's
        outcomes are recorded (a recorder thread), each on a connection of its own.

        The guarantees are the sequential loop's: a batch is sent only after the previous
        one's calls have all returned and its lanes were released, so lanes never overlap;
        every write is still token-guarded; a batch claimed ahead is released untouched when
        the worker stops or its current batch met a systemic answer (an operator's pause takes
        effect at the next claim, as in the sequential loop, so after at most the two batches
        held). Claiming ahead happens only after a full, clean batch (a backlog), never while
        probing or with the breaker not closed.
        """
        poll = self.settings.poll_interval_seconds
        claimer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="outbox-claim")
        recorder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="outbox-record")
        ahead: Future[_Pass] | None = None
        recording: Future[None] | None = None
        try:
            while not self.stopping.is_set():
                with self._pass_lock:
                    try:
                        if ahead is not None:
                            p, ahead = ahead.result(), None
                        else:
                            p = self._begin(force_rescue=False)
                    except Exception:
                        log.exception("drain pass failed; retrying after the poll interval")
                        self.stopping.wait(poll)
                        continue
                    if p.claim is None or not p.claim.events:
                        self.stopping.wait(poll)
                        continue
                    backlog = (p.events >= self.settings.batch_size and not p.probing
                               and self.breaker.allow_batch() is None)
                    if backlog:
                        ahead = claimer.submit(self._begin, force_rescue=False, ahead=True)
                    try:
                        self._send(p)
                    except Exception:
                        log.exception("sending a batch failed; what was sent is recorded, the "
                                      "rest returns to the queue when its claim expires")
                    if p.aborted and ahead is not None:
                        self._release_pass(ahead)  # sending was paused while it was claimed
                        ahead = None
                    if recording is not None:
                        self._await_record(recording)
                    recording = recorder.submit(self._finish, p)
                if ahead is None and (not backlog or p.released_any()):
                    self.stopping.wait(poll)
        finally:
            if ahead is not None:
                self._release_pass(ahead)
            if recording is not None:
                self._await_record(recording)
            claimer.shutdown(wait=True)
            recorder.shutdown(wait=True)

    def _release_pass(self, ahead: Future[_Pass]) -> None:
        """Return a batch claimed ahead to the queue untouched."""
        try:
            p = ahead.result()
        except Exception:
            log.exception("claiming ahead failed")
            return
        if p.claim is not None and p.claim.events:
            store.release(self.engine, p.claim.token, [e.id for e in p.claim.events],
                          now=self.clock())

    @staticmethod
    def _await_record(recording: Future[None]) -> None:
        try:
            recording.result()
        except Exception:
            log.exception("recording a batch failed; its events return to the queue when "
                          "their claim expires")

    # -- maintenance -------------------------------------------------------------------------
    def rescue_once(self) -> int:
        """Return expired claims to the queue; the number returned."""
        count = store.rescue_expired(self.engine, now=self.clock())
        if count:
            log.warning("rescued %d events whose claim expired (a worker died or stalled)", count)
        return count

    def _rescue_if_due(self) -> int:
        interval = max(1.0, self.settings.claim_timeout_seconds / 4)
        if time.monotonic() - self._last_rescue < interval:
            return 0
        self._last_rescue = time.monotonic()
        return self.rescue_once()

    # -- one pass ----------------------------------------------------------------------------
    def drain_once(self, *, force_rescue: bool = False) -> DrainSummary:
        """Claim one batch, send it, record the outcomes. Never raises for Stripe's answers."""
        with self._pass_lock:
            p = self._begin(force_rescue=force_rescue)
            if p.claim is not None and p.claim.events:
                try:
                    self._send(p)
                finally:
                    self._finish(p)
            else:
                self._close(p)
            return p.summary

    def _begin(self, *, force_rescue: bool, ahead: bool = False) -> _Pass:
        """Phase 1: rescue (when due), read the pause switch and the breaker, claim."""
        summary = DrainSummary()
        p = _Pass(summary, started=time.monotonic())
        if self.gateway is None:
            summary.skipped = "STRIPE_API_KEY is not set: nothing is sent"
            return p
        summary.rescued = self.rescue_once() if force_rescue else self._rescue_if_due()
        if self.stopping.is_set():
            summary.skipped = "stopping"
            return p
        with self.engine.connect() as conn:
            pause = store.pause_state(conn)
        limit: int | None = self.settings.batch_size
        if pause.paused:
            summary.paused, summary.pause_reason = True, pause.reason
            due = time.monotonic() - self._last_probe >= self.probe_interval_seconds
            if ahead or pause.kind != "systemic" or not due:
                if self.shards:
                    # Still counted, and holding a share, so that sending resumes without a
                    # scramble for shards.
                    self.lanes.shard_view()
                return p
            self._last_probe = time.monotonic()
            limit, p.probing = 1, True
        allowed = self.breaker.allow_batch()
        if allowed == 0 or (ahead and allowed is not None):
            summary.skipped = "circuit breaker open"
            if allowed == 0:
                self.lanes.shard_view(draining=False)
            return p
        if allowed == 1:
            limit = 1
        assert limit is not None
        # Claimed ahead, while this process still holds the previous batch's lanes: those
        # are free again by the time this batch is sent.
        avoid = self._lanes_busy_elsewhere()
        if not ahead:
            avoid |= self.lanes.busy()
        # A batch comes from this worker's own shards first; a probe or a half-open breaker's
        # single call takes any event.
        skip, fill = self.lanes.shard_view() if limit > 1 and self.shards else ShardView()
        p.claim = store.claim_batch(self.engine, worker=self.worker, limit=limit,
                                    now=self.clock(),
                                    claim_timeout_seconds=self.settings.claim_timeout_seconds,
                                    avoid_lanes=avoid, skip_shards=skip, fill_from_skipped=fill)
        summary.claimed = len(p.claim.events)
        return p

    def _lanes_busy_elsewhere(self) -> set[Lane]:
        """Lanes another process held when this one last tried them, until they are due to be
        tried again (``BUSY_ELSEWHERE_SECONDS``)."""
        with self._busy_elsewhere_lock:
            if not self._busy_elsewhere:
                return set()
            now = time.monotonic()
            for lane in [lane for lane, until in self._busy_elsewhere.items() if until <= now]:
                del self._busy_elsewhere[lane]
            return set(self._busy_elsewhere)

    def _send(self, p: _Pass) -> None:
        """Phase 2: send the claim's events, one call at a time per lane, holding the lanes
        (in this process and, through ``LaneLocks``, in every other) until all returned."""
        assert p.claim is not None
        claim = p.claim
        by_lane: dict[Lane, list[store.ClaimedEvent]] = {}
        for ev in claim.events:
            by_lane.setdefault(ev.lane, []).append(ev)
        held = self.lanes.acquire(by_lane)
        p.busy_ids = [ev.id for lane, evs in by_lane.items() if lane not in held for ev in evs]
        if p.busy_ids and self.lanes.sharded:
            until = time.monotonic() + BUSY_ELSEWHERE_SECONDS
            with self._busy_elsewhere_lock:
                for lane in by_lane:
                    if lane not in held:
                        self._busy_elsewhere[lane] = until
        abort = threading.Event()
        try:
            lanes = [evs for lane, evs in by_lane.items() if lane in held]
            p.results = self._run_lanes(claim, lanes, abort)
        finally:
            p.aborted = abort.is_set()
            self.lanes.release(held)

    def _finish(self, p: _Pass) -> None:
        """Phase 3: record the outcomes (token-guarded), resume after a good probe, log."""
        assert p.claim is not None
        try:
            self._record(p.claim, p.results, p.busy_ids, p.summary)
            if p.probing and p.summary.sent:
                if store.set_paused(self.engine, paused=False, reason=None, kind="systemic",
                                    by=self.worker, now=self.clock(), only_kind="systemic"):
                    log.warning("sending resumed: a probe call to Stripe succeeded")
                p.summary.paused = False
        finally:
            self._close(p)

    def _close(self, p: _Pass) -> None:
        p.summary.duration_ms = int((time.monotonic() - p.started) * 1000)
        p.summary.breaker = self.breaker.state
        with self._totals_lock:
            self.passes += 1
            for name in ("claimed", "sent", "retrying", "dead", "released", "fenced",
                         "rescued", "calls"):
                setattr(self.totals, name, getattr(self.totals, name) + getattr(p.summary, name))
        if p.summary.claimed:
            log.info("drained: %s", p.summary.as_dict())

    def _run_lanes(self, claim: store.Claim, lanes: list[list[store.ClaimedEvent]],
                   abort: threading.Event) -> list[_LaneResult]:
        if len(lanes) <= 1 or self.settings.concurrency == 1:
            return [self._send_lane(claim, evs, abort) for evs in lanes]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.settings.concurrency,
                                            thread_name_prefix="outbox-send")
        futures = [self._pool.submit(self._send_lane, claim, evs, abort) for evs in lanes]
        return [f.result() for f in futures]

    def _send_lane(self, claim: store.Claim, events: list[store.ClaimedEvent],
                   abort: threading.Event) -> _LaneResult:
        """Send one lane's events in order, one call at a time."""
        out = _LaneResult()
        # The last moment a call may start: later, the claim could expire while it runs.
        latest = claim.deadline - timedelta(seconds=self.settings.claim_safety_margin_seconds)
        gateway = self.gateway
        assert gateway is not None
        # Bound once: this loop runs for every event the drainer sends.
        clock, monotonic, call = self.clock, time.monotonic, self._call
        stopping, aborted = self.stopping.is_set, abort.is_set
        breaker, limiter, record = self.breaker, self.limiter, out.attempts.append
        attempt = store.AttemptRecord

        def rest(i: int) -> list[int]:
            return [e.id for e in events[i:]]

        for i, ev in enumerate(events):
            now = clock()
            if stopping() or aborted() or now > latest:
                out.release.extend(rest(i))
                break
            if breaker.allow_batch() == 0:
                out.release_later.extend(rest(i))
                break
            if ev.first_unknown_at is not None and past_dedupe_window(ev.view(), now,
                                                                      self.policy):
                out.dead.append((ev.id, DEAD_PAST_WINDOW))
                log.error("event %d: %s; not resent", ev.id, DEAD_PAST_WINDOW)
                continue
            if not limiter.acquire(self.stopping):
                out.release.extend(rest(i))
                break
            t0 = monotonic()
            result = call(gateway, ev)
            record(attempt(ev, result, now, int((monotonic() - t0) * 1000)))
            breaker.record(result.outcome)
            if result.outcome is Outcome.DELIVERED:
                continue
            log.warning("event %d: %s (HTTP %s, %s %s, request %s)", ev.id,
                        result.outcome.value, result.http_status, result.error_class,
                        result.error_code or "", result.request_id)
            if result.outcome is Outcome.SYSTEMIC:
                abort.set()
                self._pause_systemic(result.http_status, result.error_class, result.message)
                out.release.extend(rest(i + 1))
                break
            if result.outcome in (Outcome.NOT_EXECUTED, Outcome.UNKNOWN):
                # The rest of this lane would meet the same trouble: leave it for later.
                out.release_later.extend(rest(i + 1))
                break
        return out

    @staticmethod
    def _call(gateway: Gateway, ev: store.ClaimedEvent) -> CallResult:
        """One call; an unexpected error counts as "outcome unknown" (it may have left)."""
        try:
            return gateway.send(MeterEvent(ev.meter, ev.stripe_customer_id, ev.quantity,
                                           ev.identifier, ev.occurred_at), ev.idempotency_key)
        except Exception as exc:
            log.exception("event %d: the gateway raised", ev.id)
            return CallResult(Outcome.UNKNOWN, error_class=type(exc).__name__,
                              message=str(exc)[:1000])

    def _pause_systemic(self, status: int | None, error_class: str | None,
                        message: str | None) -> None:
        reason = f"Stripe answered HTTP {status} ({error_class}): {message or ''}".strip()[:500]
        # The next probe from this worker waits a full interval, not its very next pass.
        self._last_probe = time.monotonic()
        if store.set_paused(self.engine, paused=True, reason=reason, kind="systemic",
                            by=self.worker, now=self.clock()):
            log.error("sending paused for every worker: %s", reason)

    def _record(self, claim: store.Claim, results: list[_LaneResult], busy_ids: list[int],
                summary: DrainSummary) -> None:
        attempts = [a for r in results for a in r.attempts]
        release_now = [i for r in results for i in r.release]
        release_later = busy_ids + [i for r in results for i in r.release_later]
        dead = [d for r in results for d in r.dead]
        now = self.clock()
        rec = store.record_outcomes(self.engine, claim, attempts, release_ids=release_now,
                                    dead_without_call=dead, now=now, policy=self.policy,
                                    rng=self.rng)
        if release_later:
            rec.released += store.release(self.engine, claim.token, release_later, now=now,
                                          delay_seconds=self.settings.poll_interval_seconds)
        summary.calls += len(attempts)
        summary.sent += rec.sent
        summary.retrying += rec.retrying
        summary.dead += rec.dead
        summary.released += rec.released
        summary.fenced += rec.fenced
        if rec.fenced:
            log.error("%d outcomes not applied: claim %s had been taken over", rec.fenced,
                      claim.token)
