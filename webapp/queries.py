"""The dashboard's read side: one function per page or panel, framework-free.

Every function takes an engine (or a connection) and plain parameters — ``now`` included, so
tests fix the clock — and returns plain data (dataclasses, lists, dicts). SQLAlchemy Core
only, portable to SQLite; the two dialect differences (bucketing a timestamp, a UTC day)
are compiled per dialect below.

Speed, at a million rows of which 95% are sent (the issue's floor):

* Nothing counts the sent rows on a poll. Everything *not* sent is small and read through
  partial indexes (``ix_outbox_unsent`` and friends, migration 0002). Partial-index
  predicates are written as SQL literals (``status NOT IN ('sent', 'processing')``), never
  bound parameters, so PostgreSQL can prove them even in generic plans and SQLite can match
  them at all.
* Events in flight (``processing``) are in none of those indexes but
  ``ix_outbox_processing_deadline`` (migration 0005): a claim then writes three index
  entries, not six. They are few (a batch or two per worker), so a read that counts them
  adds them from that index (:data:`IN_FLIGHT`).
* Sent is final. Sent rows are folded into ``usage_sent_rollup`` (per UTC day of
  occurrence, tenant and meter) with a running total, and calls to Stripe into
  ``attempt_rollup`` (per outcome and latency bucket) for /metrics. A rollup's *mark* says
  what it holds: rows stamped (``sent_at``/``attempted_at``) before its watermark **and**
  with an id up to its id mark. A read adds the rollup to the rows outside it — stamped
  after the watermark, or written after the last fold (a back-fill of history is caught
  this way) — reading the mark in the same snapshot (:func:`reading`), so a fold that
  commits meanwhile is never counted twice nor missed.
* The watermark trails ``now`` by a margin longer than a worker can take between stamping
  a row and committing it (at least 15 minutes, and at least twice the claim timeout);
  folds run at most every :data:`FOLD_EVERY`, from the pages that need them. The one row a
  fold can miss is one already given its id, stamped more than the margin before it
  commits: the engine never holds a stamp that long.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any
from typing import cast as typed

from sqlalchemy import (
    BigInteger,
    Boolean,
    ColumnElement,
    Connection,
    Engine,
    String,
    Table,
    and_,
    case,
    cast,
    delete,
    func,
    literal,
    literal_column,
    or_,
    select,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import FunctionElement

from .models import (
    AttemptRollup,
    AuditEntry,
    AuditEvent,
    DeliveryAttempt,
    OutboxEvent,
    RollupState,
    SentUsageRollup,
    Tenant,
    User,
    UTCDateTime,
)
from .outbox import store
from .outbox.enqueue import MAX_AGE
from .outbox.ops import REQUEUE_AGE_LIMIT
from .outbox.states import ALL_STATUSES, DEAD_EXHAUSTED, DEAD_PAST_WINDOW

T = typed(Table, OutboxEvent.__table__)
ATT = typed(Table, DeliveryAttempt.__table__)
TENANTS = typed(Table, Tenant.__table__)
AUDIT = typed(Table, AuditEntry.__table__)
AUDIT_EVENTS = typed(Table, AuditEvent.__table__)
USERS = typed(Table, User.__table__)
STATE = typed(Table, RollupState.__table__)
SENT_ROLLUP = typed(Table, SentUsageRollup.__table__)
ATT_ROLLUP = typed(Table, AttemptRollup.__table__)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
SENT_USAGE = "sent_usage"
ATTEMPTS = "attempts"
#: Folds run at most this often; the rows past the watermark stay a few minutes' worth.
FOLD_EVERY = timedelta(minutes=5)
#: Upper bounds (ms) of the send-latency histogram's buckets (/metrics shows seconds).
LATENCY_BUCKETS_MS = (25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)
#: Statuses whose events still have to reach Stripe (dead ones only by a person's requeue).
WAITING = ("pending", "processing", "retrying")
UNSENT_OPEN = ("pending", "retrying", "dead")  # and those in flight (IN_FLIGHT)
#: Stripe rejects events older than 35 days; warn this long before.
NEAR_LIMIT = timedelta(days=7)
OLDEST_PENDING_ALERT = timedelta(minutes=15)
MAX_PAGE = 500
#: "Requeue all matching" previews and acts on at most this many events at a time.
MAX_BULK = 10_000


# -- SQL building blocks ---------------------------------------------------------------------------

def sql_str(value: str) -> ColumnElement[Any]:
    """A string constant rendered inline (for partial-index predicates and GROUP BY keys)."""
    if "%" in value:
        raise ValueError("inline constants must not contain %")
    return literal_column("'" + value.replace("'", "''") + "'")


def status_is(status: str) -> ColumnElement[bool]:
    """``status = 'x'`` with the value inline, so a partial index on it can be used."""
    if status not in ALL_STATUSES:
        raise ValueError(f"unknown status {status!r}")
    return T.c.status == sql_str(status)


def status_in(statuses: Sequence[str]) -> ColumnElement[bool]:
    """``status IN ('a', 'b')`` with the values inline."""
    for s in statuses:
        if s not in ALL_STATUSES:
            raise ValueError(f"unknown status {s!r}")
    return T.c.status.in_([sql_str(s) for s in statuses])


#: The predicate of ``ix_outbox_unsent``: neither sent nor in flight. Repeated literally so
#: SQLite matches the index.
IDLE_UNSENT = T.c.status.not_in([sql_str("sent"), sql_str("processing")])
#: Pending or retrying: the predicate of ``ix_outbox_waiting_created``, the complement
#: of the other statuses (so SQLite never takes that index for the claim's).
WAITING_IDLE = T.c.status.not_in([sql_str(s) for s in ("sent", "processing", "dead",
                                                        "resolved")])
#: Events in flight: the predicate of ``ix_outbox_processing_deadline``.
IN_FLIGHT = T.c.status == sql_str("processing")


class ascii_icontains(FunctionElement[bool]):  # noqa: N801 - SQL function style
    """``column`` contains the text, ignoring the case of ASCII letters only, alike on both
    databases: SQLite's LIKE folds ASCII only, and on PostgreSQL the ``"C"`` collation makes
    ILIKE fold ASCII without the locale's per-character lowering (the dead-letter search
    runs it over every dead row: at 20,000 of them, 106 -> 66 ms). ``%``, ``_`` and ``/``
    in the text are literal."""

    type = Boolean()
    inherit_cache = True
    name = "ascii_icontains"

    def __init__(self, column: Any, text: str) -> None:
        escaped = text.replace("/", "//").replace("%", "/%").replace("_", "/_")
        super().__init__(column, literal(f"%{escaped}%", String()))


@compiles(ascii_icontains, "postgresql")
def _ascii_icontains_pg(element: ascii_icontains, compiler: Any, **kw: Any) -> str:
    column, pattern = list(element.clauses)
    return (f'({compiler.process(column, **kw)} COLLATE "C") ILIKE '
            f"{compiler.process(pattern, **kw)} ESCAPE '/'")


@compiles(ascii_icontains, "sqlite")
def _ascii_icontains_sqlite(element: ascii_icontains, compiler: Any, **kw: Any) -> str:
    column, pattern = list(element.clauses)
    return f"{compiler.process(column, **kw)} LIKE {compiler.process(pattern, **kw)} ESCAPE '/'"


class epoch_bucket(FunctionElement[int]):  # noqa: N801 - SQL function style
    """``floor(epoch seconds of a timestamp / N)``: the number of its N-second bucket."""

    type = BigInteger()
    inherit_cache = True
    name = "epoch_bucket"


@compiles(epoch_bucket, "postgresql")
def _epoch_bucket_pg(element: epoch_bucket, compiler: Any, **kw: Any) -> str:
    column, seconds = list(element.clauses)
    # ``seconds`` stays a bound parameter: rendering its value inline would be wrong once the
    # compiled statement is cached and reused with another value.
    return (f"CAST(floor(extract(epoch FROM {compiler.process(column, **kw)}) / "
            f"{compiler.process(seconds, **kw)}) AS BIGINT)")


@compiles(epoch_bucket, "sqlite")
def _epoch_bucket_sqlite(element: epoch_bucket, compiler: Any, **kw: Any) -> str:
    column, seconds = list(element.clauses)
    # Stored as 'YYYY-MM-DD HH:MM:SS.ffffff' in UTC; strftime('%s') is its epoch second.
    return (f"(CAST(strftime('%s', {compiler.process(column, **kw)}) AS INTEGER) / "
            f"{compiler.process(seconds, **kw)})")


class utc_day(FunctionElement[str]):  # noqa: N801 - SQL function style
    """The UTC calendar day of a timestamp as ``YYYY-MM-DD``."""

    type = String(10)
    inherit_cache = True
    name = "utc_day"


@compiles(utc_day, "postgresql")
def _utc_day_pg(element: utc_day, compiler: Any, **kw: Any) -> str:
    (column,) = list(element.clauses)
    return f"to_char({compiler.process(column, **kw)} AT TIME ZONE 'UTC', 'YYYY-MM-DD')"


@compiles(utc_day, "sqlite")
def _utc_day_sqlite(element: utc_day, compiler: Any, **kw: Any) -> str:
    (column,) = list(element.clauses)
    return f"substr({compiler.process(column, **kw)}, 1, 10)"


@contextmanager
def reading(engine: Engine) -> Iterator[Connection]:
    """A connection for one page's reads: a single snapshot, so numbers read by separate
    statements agree (PostgreSQL: REPEATABLE READ; SQLite transactions already are)."""
    with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
        yield conn


def _int_sum(column: Any) -> ColumnElement[int]:
    """``sum`` that is 0 when empty and an integer on both dialects (PostgreSQL: numeric)."""
    return cast(func.coalesce(func.sum(column), 0), BigInteger)


@dataclass(frozen=True)
class Mark:
    """Where a rollup stands: rows stamped before ``at`` whose id is at most ``id`` are in it
    (the id catches rows written later with an old stamp, e.g. history loaded by hand);
    ``events``/``quantity`` total what it holds."""

    at: datetime = EPOCH
    id: int = 0
    events: int = 0
    quantity: int = 0


def _state(conn: Connection, name: str) -> Mark:
    """A rollup's mark, in the caller's snapshot. Read it in the same snapshot as the rows
    past it (see :func:`reading`), so a fold committing in between is seen entirely or not
    at all."""
    row = conn.execute(select(STATE.c.watermark, STATE.c.id_mark, STATE.c.events,
                              STATE.c.quantity).where(STATE.c.name == name)).first()
    if row is None:
        return Mark()
    return Mark(as_utc(row.watermark) or EPOCH, int(row.id_mark), int(row.events),
                int(row.quantity))


def _live_sent(mark: Mark) -> ColumnElement[bool]:
    """Sent events not in the rollup: stamped at or after its watermark, or written after
    its last fold (a small range of ``ix_outbox_sent_at`` OR'ed with one of the primary key)."""
    return and_(status_is("sent"), or_(T.c.sent_at >= mark.at, T.c.id > mark.id))


def _live_attempts(mark: Mark) -> ColumnElement[bool]:
    return or_(ATT.c.attempted_at >= mark.at, ATT.c.id > mark.id)


def _latency_bucket() -> ColumnElement[int]:
    whens: list[tuple[Any, Any]] = [(ATT.c.duration_ms.is_(None), literal_column("-1"))]
    whens += [(ATT.c.duration_ms <= literal_column(str(ms)), literal_column(str(i)))
              for i, ms in enumerate(LATENCY_BUCKETS_MS)]
    return case(*whens, else_=literal_column(str(len(LATENCY_BUCKETS_MS))))


def _insert(conn: Connection, table: Any) -> Any:
    return (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(table)


def as_utc(value: datetime | None) -> datetime | None:
    """Timezone-aware UTC (SQLite hands back naive values from untyped expressions)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# -- rollups ---------------------------------------------------------------------------------------

def fold_margin(claim_timeout_seconds: float) -> timedelta:
    """How far the rollups' watermark trails ``now``: longer than a worker can hold a stamp
    before committing it (its claim), with room to spare."""
    return max(timedelta(minutes=15), timedelta(seconds=2 * claim_timeout_seconds + 60))


def refresh_rollups(engine: Engine, *, now: datetime, margin: timedelta) -> bool:
    """Fold closed stretches of sent events and attempts into the rollups, if they lag by
    more than :data:`FOLD_EVERY`. Cheap when fresh (one small read). Returns whether it
    folded. Concurrent callers are safe: one folds, the others skip it (PostgreSQL) or wait
    for it and then find nothing to do (SQLite serializes writers)."""
    target = (now - margin).replace(second=0, microsecond=0)
    with engine.connect() as conn:
        marks = {name: as_utc(at) for name, at in
                 conn.execute(select(STATE.c.name, STATE.c.watermark)).all()}
    if all(marks.get(n) is not None and target - marks[n] < FOLD_EVERY  # type: ignore[operator]
           for n in (SENT_USAGE, ATTEMPTS)):
        return False
    with engine.begin() as conn:
        for name, fold in ((SENT_USAGE, _fold_sent), (ATTEMPTS, _fold_attempts)):
            mark = _lock_state(conn, name)
            if mark is not None and mark.at < target:
                fold(conn, mark, target)
    return True


def rebuild_rollups(engine: Engine, *, now: datetime, margin: timedelta) -> None:
    """Empty the rollups and fold everything again."""
    with engine.begin() as conn:
        conn.execute(delete(SENT_ROLLUP))
        conn.execute(delete(ATT_ROLLUP))
        conn.execute(update(STATE).values(watermark=EPOCH, id_mark=0, events=0, quantity=0))
    refresh_rollups(engine, now=now, margin=margin)


def _lock_state(conn: Connection, name: str) -> Mark | None:
    """The rollup's mark, locked for this transaction; None if another folder holds it."""
    conn.execute(_insert(conn, STATE).values(name=name, watermark=EPOCH, id_mark=0, events=0,
                                             quantity=0)
                 .on_conflict_do_nothing(index_elements=[STATE.c.name]))
    stmt = select(STATE.c.name).where(STATE.c.name == name)
    if conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update(skip_locked=True)
    if conn.execute(stmt).first() is None:
        return None
    return _state(conn, name)


def _fold_sent(conn: Connection, mark: Mark, high: datetime) -> None:
    """Move the sent rows stamped before ``high`` (and written before this fold) from "live"
    into the rollup. The totals added are the sums of exactly the rows written, so the
    running total always equals the rollup, whatever commits meanwhile."""
    last_id = int(conn.execute(select(func.coalesce(func.max(T.c.id), 0))).scalar_one())
    day = utc_day(T.c.occurred_at)
    inner = select(day.label("day"), T.c.tenant_id, T.c.meter, T.c.quantity).where(
        _live_sent(mark), T.c.sent_at < high, T.c.id <= last_id).subquery()
    groups = conn.execute(
        select(inner.c.day, inner.c.tenant_id, inner.c.meter, func.count().label("events"),
               _int_sum(inner.c.quantity).label("quantity"))
        .group_by(inner.c.day, inner.c.tenant_id, inner.c.meter)).all()
    if groups:
        ins = _insert(conn, SENT_ROLLUP)
        conn.execute(ins.on_conflict_do_update(
            index_elements=[SENT_ROLLUP.c.day, SENT_ROLLUP.c.tenant_id, SENT_ROLLUP.c.meter],
            set_={"events": SENT_ROLLUP.c.events + ins.excluded.events,
                  "quantity": SENT_ROLLUP.c.quantity + ins.excluded.quantity}),
            [dict(g._mapping) for g in groups])
    conn.execute(update(STATE).where(STATE.c.name == SENT_USAGE).values(
        watermark=high, id_mark=last_id,
        events=STATE.c.events + sum(int(g.events) for g in groups),
        quantity=STATE.c.quantity + sum(int(g.quantity) for g in groups)))


def _fold_attempts(conn: Connection, mark: Mark, high: datetime) -> None:
    """The same for calls to Stripe, by outcome and latency bucket."""
    last_id = int(conn.execute(select(func.coalesce(func.max(ATT.c.id), 0))).scalar_one())
    inner = select(ATT.c.outcome, _latency_bucket().label("bucket"), ATT.c.duration_ms).where(
        _live_attempts(mark), ATT.c.attempted_at < high, ATT.c.id <= last_id).subquery()
    groups = conn.execute(
        select(inner.c.outcome, inner.c.bucket, func.count().label("attempts"),
               _int_sum(inner.c.duration_ms).label("duration_ms"))
        .group_by(inner.c.outcome, inner.c.bucket)).all()
    if groups:
        ins = _insert(conn, ATT_ROLLUP)
        conn.execute(ins.on_conflict_do_update(
            index_elements=[ATT_ROLLUP.c.outcome, ATT_ROLLUP.c.bucket],
            set_={"attempts": ATT_ROLLUP.c.attempts + ins.excluded.attempts,
                  "duration_ms": ATT_ROLLUP.c.duration_ms + ins.excluded.duration_ms}),
            [dict(g._mapping) for g in groups])
    conn.execute(update(STATE).where(STATE.c.name == ATTEMPTS).values(
        watermark=high, id_mark=last_id,
        events=STATE.c.events + sum(int(g.attempts) for g in groups)))


def sent_total(conn: Connection) -> int:
    """Every sent event: the folded total plus the rows not folded yet."""
    mark = _state(conn, SENT_USAGE)
    live = conn.execute(select(func.count()).where(_live_sent(mark)))
    return mark.events + int(live.scalar_one())


# -- shared pieces ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class SendingState:
    paused: bool
    reason: str | None
    kind: str | None
    changed_at: datetime | None
    changed_by: str | None


def sending_state(conn: Connection) -> SendingState:
    """Whether sending is paused, why, since when and by whom (one primary-key read)."""
    s = store.pause_state(conn)
    return SendingState(s.paused, s.reason, s.kind, as_utc(s.changed_at), s.changed_by)


def status_counts(conn: Connection) -> dict[str, int]:
    """Events by status. Sent from the rollup; in flight through
    ``ix_outbox_processing_deadline``; the rest through ``ix_outbox_unsent``."""
    counts = dict.fromkeys(ALL_STATUSES, 0)
    for status, n in conn.execute(select(T.c.status, func.count()).where(IDLE_UNSENT)
                                  .group_by(T.c.status)):
        counts[status] = int(n)
    counts["processing"] = int(conn.execute(select(func.count()).where(IN_FLIGHT)).scalar_one())
    counts["sent"] = sent_total(conn)
    return counts


def oldest_waiting(conn: Connection) -> datetime | None:
    """When the oldest event still waiting to be sent (pending, processing, retrying) was
    enqueued (``ix_outbox_waiting_created``, and the few in flight apart)."""
    found = [as_utc(conn.execute(select(func.min(T.c.created_at)).where(where)).scalar())
             for where in (WAITING_IDLE, IN_FLIGHT)]
    return min((at for at in found if at is not None), default=None)


# -- overview --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Bucket:
    start: datetime
    count: int


@dataclass(frozen=True)
class UnmappedTenant:
    tenant_id: str
    events: int
    oldest_occurred_at: datetime | None


@dataclass(frozen=True)
class Alert:
    level: str            # "critical" | "warning" | "info"
    title: str
    detail: str
    link: str | None = None       # a page's endpoint name
    params: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class AttemptRates:
    total: int
    failed: int
    by_outcome: dict[str, int]

    @property
    def failure_rate(self) -> float | None:
        return self.failed / self.total if self.total else None


@dataclass(frozen=True)
class Overview:
    now: datetime
    counts: dict[str, int]
    oldest_waiting_at: datetime | None
    per_minute: list[Bucket]
    per_hour: list[Bucket]
    attempts_hour: AttemptRates
    attempts_day: AttemptRates
    sending: SendingState
    dead_last_day: int
    near_limit: int
    over_limit: int
    unmapped: list[UnmappedTenant]
    alerts: list[Alert] = field(default_factory=list)

    @property
    def oldest_waiting_age(self) -> float | None:
        if self.oldest_waiting_at is None:
            return None
        return max(0.0, (self.now - self.oldest_waiting_at).total_seconds())

    @property
    def waiting(self) -> int:
        return sum(self.counts[s] for s in WAITING)

    @property
    def sent_last_hour(self) -> int:
        return sum(b.count for b in self.per_minute)

    @property
    def sent_last_day(self) -> int:
        return sum(b.count for b in self.per_hour)


def overview(engine: Engine, *, now: datetime, margin: timedelta | None = None,
             stripe_mode: str = "test", oldest_alert: timedelta = OLDEST_PENDING_ALERT
             ) -> Overview:
    """Everything on the overview page, read in one transaction (after folding the rollups
    when ``margin`` is given; see :func:`refresh_rollups`)."""
    if margin is not None:
        refresh_rollups(engine, now=now, margin=margin)
    with reading(engine) as conn:
        counts = status_counts(conn)
        oldest = oldest_waiting(conn)
        per_minute = _sent_buckets(conn, now, 60, 60)
        per_hour = _sent_buckets(conn, now, 3600, 24)
        hour = attempt_rates(conn, since=now - timedelta(hours=1))
        day = attempt_rates(conn, since=now - timedelta(days=1))
        sending = sending_state(conn)
        dead_day = int(conn.execute(select(func.count()).where(
            status_is("dead"), T.c.dead_at >= now - timedelta(days=1))).scalar_one())
        near, over = _age_limits(conn, now)
        unmapped = unmapped_tenants(conn)
    ov = Overview(now, counts, oldest, per_minute, per_hour, hour, day, sending, dead_day,
                  near, over, unmapped)
    ov.alerts.extend(_alerts(ov, stripe_mode, oldest_alert))
    return ov


def _sent_buckets(conn: Connection, now: datetime, seconds: int, count: int) -> list[Bucket]:
    """Sent events per ``seconds``-long bucket, the last ``count`` buckets up to now
    (a range scan of ``ix_outbox_sent_at``), zero-filled."""
    last = math.floor(now.timestamp() / seconds)
    first = last - count + 1
    since = datetime.fromtimestamp(first * seconds, UTC)
    inner = (select(epoch_bucket(T.c.sent_at, literal(seconds)).label("b"))
             .where(status_is("sent"), T.c.sent_at >= since).subquery())
    got = {int(b): int(n) for b, n in conn.execute(
        select(inner.c.b, func.count()).group_by(inner.c.b))}
    return [Bucket(datetime.fromtimestamp(k * seconds, UTC), got.get(k, 0))
            for k in range(first, last + 1)]


def attempt_rates(conn: Connection, *, since: datetime) -> AttemptRates:
    """Calls to Stripe since ``since`` by outcome (``ix_attempts_recent``)."""
    by = {o: int(n) for o, n in conn.execute(
        select(ATT.c.outcome, func.count()).where(ATT.c.attempted_at >= since)
        .group_by(ATT.c.outcome))}
    total = sum(by.values())
    return AttemptRates(total, total - by.get("delivered", 0), by)


def _age_limits(conn: Connection, now: datetime) -> tuple[int, int]:
    """(events within 7 days of Stripe's 35-day limit, events past it) not yet sent."""
    limit = now - MAX_AGE
    parts = [(status_in(UNSENT_OPEN), IDLE_UNSENT), (IN_FLIGHT,)]
    inner = union_all(*[select((T.c.occurred_at < limit).label("past")).where(
        *where, T.c.occurred_at < limit + NEAR_LIMIT) for where in parts]).subquery()
    rows = conn.execute(select(inner.c.past, func.count()).group_by(inner.c.past)).all()
    over = sum(int(n) for past, n in rows if past)
    near = sum(int(n) for past, n in rows if not past)
    return near, over


def unmapped_tenants(conn: Connection, limit: int = 50) -> list[UnmappedTenant]:
    """Tenants with events waiting only because they have no Stripe customer yet."""
    # Per tenant first (a hash of a few hundred groups), then the mapping test once per
    # tenant, not once per waiting event.
    waiting = (select(T.c.tenant_id, func.count().label("n"),
                      func.min(T.c.occurred_at).label("oldest"))
               .where(status_in(("pending", "retrying")), IDLE_UNSENT,
                      T.c.stripe_customer_id.is_(None))
               .group_by(T.c.tenant_id).subquery())
    mapped = (select(TENANTS.c.tenant_id)
              .where(TENANTS.c.tenant_id == waiting.c.tenant_id,
                     TENANTS.c.stripe_customer_id.is_not(None)).exists())
    rows = conn.execute(
        select(waiting.c.tenant_id, waiting.c.n, waiting.c.oldest).where(~mapped)
        .order_by(waiting.c.n.desc(), waiting.c.tenant_id).limit(limit))
    return [UnmappedTenant(t, int(n), as_utc(o)) for t, n, o in rows]


def _alerts(ov: Overview, stripe_mode: str, oldest_alert: timedelta) -> list[Alert]:
    alerts: list[Alert] = []
    if stripe_mode == "none":
        alerts.append(Alert("critical", "Nothing is being sent",
                            "STRIPE_API_KEY is not set: events stay queued until it is."))
    if ov.sending.paused:
        alerts.append(Alert("critical", "Sending is paused",
                            ov.sending.reason or "paused", None))
    if ov.counts["dead"]:
        alerts.append(Alert(
            "critical" if ov.dead_last_day else "warning",
            f"{ov.counts['dead']:,} dead letter{'s' if ov.counts['dead'] != 1 else ''}",
            f"{ov.dead_last_day:,} new in the last 24 h",
            "dead_letters.index"))
    age = ov.oldest_waiting_age
    if age is not None and age > oldest_alert.total_seconds():
        alerts.append(Alert("warning", "Events are waiting too long",
                            f"the oldest waiting event was enqueued {_human(age)} ago "
                            f"(threshold {_human(oldest_alert.total_seconds())})",
                            "dashboard.retries"))
    if ov.over_limit:
        alerts.append(Alert("critical", f"{ov.over_limit:,} events past Stripe's 35-day limit",
                            "Stripe will reject them: bill them by hand and resolve them.",
                            "dead_letters.index", {"age": "near_limit"}))
    if ov.near_limit:
        alerts.append(Alert("warning",
                            f"{ov.near_limit:,} events within 7 days of the 35-day limit",
                            "unsent events that Stripe will reject once 35 days old",
                            "dead_letters.index", {"age": "near_limit"}))
    if ov.unmapped:
        names = ", ".join(u.tenant_id for u in ov.unmapped[:5])
        more = f" and {len(ov.unmapped) - 5} more" if len(ov.unmapped) > 5 else ""
        alerts.append(Alert("warning",
                            f"{len(ov.unmapped)} tenant{'s' if len(ov.unmapped) != 1 else ''} "
                            "without a Stripe customer "
                            f"{'have' if len(ov.unmapped) != 1 else 'has'} waiting events",
                            f"{names}{more}: map them to start sending", "tenants.index"))
    return alerts


def _human(seconds: float) -> str:
    seconds = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


# -- retries ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Histogram:
    """Events by attempt count, each split by a key (outcome class or error code)."""

    label: str
    rows: dict[int, dict[str, int]]     # attempt_count -> key -> events
    keys: list[str]

    @property
    def total(self) -> int:
        return sum(sum(r.values()) for r in self.rows.values())

    @property
    def max_bar(self) -> int:
        return max((sum(r.values()) for r in self.rows.values()), default=0)


@dataclass(frozen=True)
class RetriesPage:
    now: datetime
    split: str
    histograms: list[Histogram]
    retrying: list[dict[str, Any]]
    retrying_total: int


SPLITS = {"outcome": "outcome class", "code": "error code"}
#: The sent histogram looks at this many of the latest sent events (bounded at any volume).
RECENT_SENT = 2000


def retries(engine: Engine, *, now: datetime, split: str = "outcome",
            limit: int = 100) -> RetriesPage:
    """Attempt-count histograms (retrying now, dead now, sent in the last 24 h) and the
    retrying events by next attempt time."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}")
    key = (func.coalesce(T.c.last_outcome, sql_str("none")) if split == "outcome" else
           func.coalesce(T.c.last_error_code, cast(T.c.last_http_status, T.c.last_error_code.type),
                         sql_str("none")))
    recent = (select(T.c.id).where(status_is("sent"), T.c.sent_at.is_not(None))
              .order_by(T.c.sent_at.desc()).limit(RECENT_SENT).scalar_subquery())
    groups = (("Retrying now", (status_is("retrying"), IDLE_UNSENT)),
              ("Dead now", (status_is("dead"), IDLE_UNSENT)),
              (f"Last {RECENT_SENT:,} sent", (T.c.id.in_(recent),)))
    with reading(engine) as conn:
        histograms = [_histogram(conn, label, where, key) for label, where in groups]
        rows = conn.execute(
            select(T.c.id, T.c.tenant_id, T.c.meter, T.c.quantity, T.c.attempt_count,
                   T.c.call_count, T.c.next_attempt_at, T.c.last_outcome, T.c.last_error_code,
                   T.c.last_http_status, T.c.last_error_message, T.c.first_unknown_at,
                   T.c.occurred_at)
            .where(status_in(("pending", "retrying")), T.c.status == "retrying")
            .order_by(T.c.next_attempt_at, T.c.id).limit(limit)).all()
        total = int(conn.execute(select(func.count()).where(status_is("retrying"), IDLE_UNSENT))
                    .scalar_one())
    return RetriesPage(now, split, histograms, [_row(r) for r in rows], total)


def _histogram(conn: Connection, label: str, where: Sequence[Any], key: Any) -> Histogram:
    inner = select(T.c.attempt_count.label("n"), key.label("k")).where(*where).subquery()
    rows: dict[int, dict[str, int]] = defaultdict(dict)
    keys: dict[str, int] = defaultdict(int)
    for n, k, c in conn.execute(select(inner.c.n, inner.c.k, func.count())
                                .group_by(inner.c.n, inner.c.k)):
        rows[int(n)][str(k)] = int(c)
        keys[str(k)] += int(c)
    ordered = sorted(keys, key=lambda k: (-keys[k], k))
    return Histogram(label, dict(sorted(rows.items())), ordered)


def _row(row: Any) -> dict[str, Any]:
    out = dict(row._mapping)
    for k, v in out.items():
        if isinstance(v, datetime):
            out[k] = as_utc(v)
    return out


# -- tenants and usage -----------------------------------------------------------------------------

USAGE_STATUSES = ("sent", "pending", "retrying", "dead", "resolved")


@dataclass
class UsageRow:
    tenant_id: str
    meter: str
    name: str | None = None
    stripe_customer_id: str | None = None
    events: dict[str, int] = field(default_factory=lambda: dict.fromkeys(USAGE_STATUSES, 0))
    quantity: dict[str, int] = field(default_factory=lambda: dict.fromkeys(USAGE_STATUSES, 0))


@dataclass(frozen=True)
class Usage:
    start: date
    end: date            # inclusive
    rows: list[UsageRow]

    def total(self, what: str, status: str) -> int:
        return sum(getattr(r, what)[status] for r in self.rows)


def month_start(now: datetime) -> date:
    return now.astimezone(UTC).date().replace(day=1)


def tenant_usage(engine: Engine, *, start: date, end: date,
                 tenant_id: str | None = None) -> Usage:
    """Usage per tenant and meter for events that *occurred* (Stripe bills by the event's
    timestamp) on UTC days ``start``…``end`` inclusive: events and quantities by status.
    Processing counts as pending. Sent comes from the rollup plus the rows past its
    watermark; the rest through ``ix_outbox_unsent``."""
    if end < start:
        raise ValueError("the period ends before it starts")
    lo = datetime(start.year, start.month, start.day, tzinfo=UTC)
    hi = datetime(end.year, end.month, end.day, tzinfo=UTC) + timedelta(days=1)
    table: dict[tuple[str, str], UsageRow] = {}

    def row(t: str, m: str) -> UsageRow:
        r = table.get((t, m))
        if r is None:
            r = table[(t, m)] = UsageRow(t, m)
        return r

    with reading(engine) as conn:
        mark = _state(conn, SENT_USAGE)
        for t, m, n, q in conn.execute(_sent_usage(mark, lo, hi, start, end, tenant_id)).all():
            r = row(t, m)
            r.events["sent"] += int(n)
            r.quantity["sent"] += int(q)
        span = [T.c.occurred_at >= lo, T.c.occurred_at < hi]
        if tenant_id is not None:
            span.append(T.c.tenant_id == tenant_id)
        for where in ((status_in(("pending", "retrying", "dead", "resolved")), IDLE_UNSENT),
                      (IN_FLIGHT,)):
            for t, m, s, n, q in conn.execute(
                    select(T.c.tenant_id, T.c.meter, T.c.status, func.count(),
                           _int_sum(T.c.quantity))
                    .where(*where, *span).group_by(T.c.tenant_id, T.c.meter, T.c.status)
            ).all():
                status = "pending" if s == "processing" else s
                r = row(t, m)
                r.events[status] += int(n)
                r.quantity[status] += int(q)
        ids = sorted({t for t, _ in table})
        tenants = {t.tenant_id: t for t in conn.execute(
            select(TENANTS.c.tenant_id, TENANTS.c.name, TENANTS.c.stripe_customer_id)
            .where(TENANTS.c.tenant_id.in_(ids)))} if ids else {}
    for (t, _m), r in table.items():
        if t in tenants:
            r.name = tenants[t].name
            r.stripe_customer_id = tenants[t].stripe_customer_id
    return Usage(start, end, sorted(table.values(), key=lambda r: (r.tenant_id, r.meter)))


def _sent_usage(mark: Mark, lo: datetime, hi: datetime, start: date, end: date,
                tenant_id: str | None) -> Any:
    """Folded days plus the rows not folded yet."""
    folded = select(SENT_ROLLUP.c.tenant_id, SENT_ROLLUP.c.meter,
                    SENT_ROLLUP.c.events.label("events"),
                    SENT_ROLLUP.c.quantity.label("quantity")).where(
        SENT_ROLLUP.c.day >= start.isoformat(), SENT_ROLLUP.c.day <= end.isoformat())
    live = select(T.c.tenant_id, T.c.meter, literal_column("1").label("events"),
                  T.c.quantity.label("quantity")).where(
        _live_sent(mark), T.c.occurred_at >= lo, T.c.occurred_at < hi)
    if tenant_id is not None:
        folded = folded.where(SENT_ROLLUP.c.tenant_id == tenant_id)
        live = live.where(T.c.tenant_id == tenant_id)
    both = union_all(folded, live).subquery()
    return (select(both.c.tenant_id, both.c.meter, _int_sum(both.c.events),
                   _int_sum(both.c.quantity))
            .group_by(both.c.tenant_id, both.c.meter))


def tenants_list(conn: Connection) -> list[dict[str, Any]]:
    """Every mapped (or named) tenant."""
    return [_row(r) for r in conn.execute(
        select(TENANTS.c.tenant_id, TENANTS.c.name, TENANTS.c.stripe_customer_id,
               TENANTS.c.updated_at).order_by(TENANTS.c.tenant_id))]


@dataclass(frozen=True)
class TenantsPage:
    usage: Usage
    unmapped: list[UnmappedTenant]


def tenants_page(engine: Engine, *, start: date, end: date, now: datetime | None = None,
                 margin: timedelta | None = None) -> TenantsPage:
    """The tenants page: usage for the period, and the tenants waiting for a customer."""
    if margin is not None and now is not None:
        refresh_rollups(engine, now=now, margin=margin)
    usage = tenant_usage(engine, start=start, end=end)
    with engine.connect() as conn:
        return TenantsPage(usage, unmapped_tenants(conn))


@dataclass(frozen=True)
class Mappings:
    tenants: list[dict[str, Any]]
    unmapped: list[UnmappedTenant]


def mappings(engine: Engine) -> Mappings:
    """Every tenant with its Stripe customer, and the unmapped ones with waiting events."""
    with reading(engine) as conn:
        return Mappings(tenants_list(conn), unmapped_tenants(conn))


# -- keyset pagination -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Cursor:
    """A position in a list ordered by (time, id) descending."""

    at: datetime
    id: int

    def encode(self) -> str:
        return f"{self.at.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%S.%f')}Z~{self.id}"

    @classmethod
    def decode(cls, raw: str) -> Cursor:
        """Raises ValueError on anything malformed."""
        at, _, ident = raw.partition("~")
        parsed = datetime.fromisoformat(at.replace("Z", "+00:00"))
        if parsed.tzinfo is None:
            raise ValueError("cursor time needs a zone")
        return cls(parsed.astimezone(UTC), int(ident))


@dataclass(frozen=True)
class Page:
    rows: list[dict[str, Any]]
    next: Cursor | None          # older rows exist after the last one shown
    prev: Cursor | None          # newer rows exist before the first one shown


def _keyset(conn: Connection, stmt: Any, time_col: Any, id_col: Any, *, after: Cursor | None,
            before: Cursor | None, limit: int, key: str, parts: Sequence[Any] = ()) -> Page:
    """Run ``stmt`` ordered by (time, id) descending, ``limit`` rows after/before a cursor.

    Fetches one row more than shown to know whether another page exists; the boundary row
    is never shown twice nor skipped (ties on time are broken by id). ``parts``: conditions
    that split ``stmt`` into disjoint pieces, each served by an index of its own; each piece
    is paged the same way and the pieces are merged.
    """
    limit = max(1, min(limit, MAX_PAGE))
    pieces = [stmt.where(c) for c in parts] if parts else [stmt]
    newest_first = before is None
    bound: ColumnElement[bool] | None = None
    if before is not None:
        bound = tuple_(time_col, id_col) > tuple_(literal(before.at, UTCDateTime()),
                                                  literal(before.id))
        order = (time_col.asc(), id_col.asc())
    else:
        if after is not None:
            bound = tuple_(time_col, id_col) < tuple_(literal(after.at, UTCDateTime()),
                                                      literal(after.id))
        order = (time_col.desc(), id_col.desc())
    got: list[Any] = []
    for piece in pieces:
        if bound is not None:
            piece = piece.where(bound)
        got += conn.execute(piece.order_by(*order).limit(limit + 1)).all()
    if len(pieces) > 1:
        got.sort(key=lambda r: (as_utc(r._mapping[key]), r._mapping["id"]),
                 reverse=newest_first)
        got = got[:limit + 1]
    if before is not None:
        more_newer = len(got) > limit
        rows = [_row(r) for r in reversed(got[:limit])]
        return Page(rows, _cursor(rows[-1], key) if rows else None,
                    _cursor(rows[0], key) if rows and more_newer else None)
    rows = [_row(r) for r in got[:limit]]
    return Page(rows, _cursor(rows[-1], key) if len(got) > limit else None,
                _cursor(rows[0], key) if rows and after is not None else None)


def _cursor(row: dict[str, Any], key: str) -> Cursor:
    return Cursor(row[key], int(row["id"]))


# -- dead letters ----------------------------------------------------------------------------------

AGES = {
    "": "any age",
    "1h": "dead in the last hour",
    "24h": "dead in the last 24 h",
    "7d": "dead in the last 7 days",
    "gt24h": "dead for over 24 h",
    "gt7d": "dead for over 7 days",
    "near_limit": "occurred over 28 days ago",
}
DEAD_STATUSES = {"dead": "Dead (to act on)", "resolved": "Resolved (history)"}


@dataclass(frozen=True)
class DeadFilters:
    status: str = "dead"
    tenant: str = ""
    meter: str = ""
    code: str = ""
    error_class: str = ""
    age: str = ""
    q: str = ""

    def __post_init__(self) -> None:
        if self.status not in DEAD_STATUSES:
            raise ValueError(f"status must be one of {', '.join(DEAD_STATUSES)}")
        if self.age not in AGES:
            raise ValueError(f"age must be one of {', '.join(a for a in AGES if a)}")
        for name in ("tenant", "meter", "code", "error_class", "q"):
            if len(getattr(self, name)) > 200:
                raise ValueError(f"{name} is too long")

    def params(self) -> dict[str, str]:
        """The non-empty filters, as query-string parameters."""
        return {k: v for k, v in self.__dict__.items() if v and not (k == "status" and
                                                                      v == "dead")}

    def conditions(self, now: datetime) -> list[Any]:
        where: list[Any] = [status_is(self.status), T.c.dead_at.is_not(None)]
        if self.tenant:
            where.append(T.c.tenant_id == self.tenant)
        if self.meter:
            where.append(T.c.meter == self.meter)
        if self.code:
            where.append(T.c.last_error_code == self.code)
        if self.error_class:
            where.append(T.c.last_error_class == self.error_class)
        if self.q:
            where.append(or_(ascii_icontains(T.c.last_error_message, self.q),
                             ascii_icontains(T.c.dead_reason, self.q),
                             T.c.idempotency_key == self.q))
        age = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7)}
        if self.age in age:
            where.append(T.c.dead_at >= now - age[self.age])
        elif self.age == "gt24h":
            where.append(T.c.dead_at < now - timedelta(days=1))
        elif self.age == "gt7d":
            where.append(T.c.dead_at < now - timedelta(days=7))
        elif self.age == "near_limit":
            where.append(T.c.occurred_at < now - (MAX_AGE - NEAR_LIMIT))
        return where


DEAD_COLUMNS = (T.c.id, T.c.tenant_id, T.c.meter, T.c.quantity, T.c.idempotency_key,
                T.c.occurred_at, T.c.status, T.c.attempt_count, T.c.call_count, T.c.last_outcome,
                T.c.last_error_class, T.c.last_error_code, T.c.last_http_status,
                T.c.last_error_message, T.c.dead_reason, T.c.dead_at, T.c.first_unknown_at,
                T.c.resolved_at, T.c.resolved_by, T.c.resolve_reason, T.c.resolve_note)


def requeue_class(row: dict[str, Any], *, now: datetime, window_seconds: float) -> str:
    """How a requeue would treat a dead event: ``ok``; ``force`` (its outcome is unknown past
    Stripe's dedupe window, so only a forced requeue sends it); ``too_old`` (Stripe would
    reject it: resolve it instead). Mirrors ``webapp.outbox.ops.requeue``, which decides."""
    if row["occurred_at"] < now - REQUEUE_AGE_LIMIT:
        return "too_old"
    first = row.get("first_unknown_at")
    if row.get("dead_reason") == DEAD_PAST_WINDOW or (
            first is not None and now - first >= timedelta(seconds=window_seconds)):
        return "force"
    return "ok"


def dead_letters(engine: Engine, filters: DeadFilters, *, now: datetime, window_seconds: float,
                 after: Cursor | None = None, before: Cursor | None = None,
                 limit: int = 50) -> Page:
    """One page of dead (or resolved) events, newest death first, keyset-paginated on
    (dead_at, id) through ``ix_outbox_dead`` / ``ix_outbox_dead_tenant`` /
    ``ix_outbox_resolved``: as fast on page 1,000 as on page 1."""
    stmt = select(*DEAD_COLUMNS).where(*filters.conditions(now))
    with engine.connect() as conn:
        page = _keyset(conn, stmt, T.c.dead_at, T.c.id, after=after, before=before,
                       limit=limit, key="dead_at")
    for r in page.rows:
        r["requeue"] = (requeue_class(r, now=now, window_seconds=window_seconds)
                        if r["status"] == "dead" else None)
        r["near_limit"] = r["occurred_at"] < now - (MAX_AGE - NEAR_LIMIT)
    return page


@dataclass(frozen=True)
class ErrorGroup:
    kind: str
    error_class: str | None
    code: str | None
    http_status: int | None
    events: int
    quantity: int
    tenants: int
    first_dead_at: datetime | None
    last_dead_at: datetime | None


KINDS = {"unknown_past_window": "outcome unknown past the 24 h window",
         "exhausted": "retries exhausted", "permanent": "permanent error"}


def dead_letter_groups(engine: Engine, filters: DeadFilters, *, now: datetime,
                       limit: int = 50) -> list[ErrorGroup]:
    """Dead (or resolved) events matching ``filters``, grouped by error: why they died,
    error class, code and HTTP status. Largest groups first."""
    kind = case((T.c.dead_reason == DEAD_PAST_WINDOW, literal("unknown_past_window")),
                (T.c.dead_reason.startswith(DEAD_EXHAUSTED, autoescape=True),
                 literal("exhausted")), else_=literal("permanent"))
    inner = select(kind.label("kind"), T.c.last_error_class, T.c.last_error_code,
                   T.c.last_http_status, T.c.quantity, T.c.tenant_id, T.c.dead_at).where(
        *filters.conditions(now)).subquery()
    keys = (inner.c.kind, inner.c.last_error_class, inner.c.last_error_code,
            inner.c.last_http_status)
    with engine.connect() as conn:
        rows = conn.execute(
            select(*keys, func.count(), _int_sum(inner.c.quantity),
                   func.count(inner.c.tenant_id.distinct()), func.min(inner.c.dead_at),
                   func.max(inner.c.dead_at))
            .group_by(*keys).order_by(func.count().desc()).limit(limit)).all()
    return [ErrorGroup(k, c, code, h, int(n), int(q), int(t), as_utc(lo), as_utc(hi))
            for k, c, code, h, n, q, t, lo, hi in rows]


@dataclass(frozen=True)
class RequeuePreview:
    """What "requeue all matching" would do, and the exact ids it would act on."""

    matched: int                 # matching dead events looked at (capped at MAX_BULK + 1)
    capped: bool                 # more matched than one bulk action takes
    ok_ids: list[int]
    force_ids: list[int]         # outcome unknown past the 24 h window: only with force
    too_old_ids: list[int]       # past Stripe's 35-day limit: excluded
    near_limit: int              # of ok+force, within 7 days of the limit
    tenants: int
    units: int
    force_units: int


def _requeue_class_sql(now: datetime, window_seconds: float) -> ColumnElement[str]:
    """:func:`requeue_class` as SQL, so a bulk preview reads no timestamps into Python."""
    return case((T.c.occurred_at < now - REQUEUE_AGE_LIMIT, literal("too_old")),
                (or_(T.c.dead_reason == DEAD_PAST_WINDOW,
                     T.c.first_unknown_at <= now - timedelta(seconds=window_seconds)),
                 literal("force")),
                else_=literal("ok"))


def requeue_preview(engine: Engine, filters: DeadFilters, *, now: datetime,
                    window_seconds: float, cap: int = MAX_BULK) -> RequeuePreview:
    """Snapshot the dead events matching ``filters`` (oldest deaths first, at most ``cap``)."""
    if filters.status != "dead":
        raise ValueError("only dead events can be requeued")
    near_cut = now - (MAX_AGE - NEAR_LIMIT)
    stmt = (select(T.c.id, T.c.tenant_id, T.c.quantity,
                   _requeue_class_sql(now, window_seconds), T.c.occurred_at < near_cut)
            .where(*filters.conditions(now)).order_by(T.c.dead_at, T.c.id).limit(cap + 1))
    with engine.connect() as conn:
        rows = conn.execute(stmt).all()
    capped = len(rows) > cap
    ok: list[int] = []
    force: list[int] = []
    old: list[int] = []
    tenants: set[str] = set()
    units = force_units = near = 0
    for ident, tenant, quantity, cls, is_near in rows[:cap]:
        if cls == "too_old":
            old.append(int(ident))
            continue
        (ok if cls == "ok" else force).append(int(ident))
        tenants.add(tenant)
        units += int(quantity)
        if cls == "force":
            force_units += int(quantity)
        near += 1 if is_near else 0
    return RequeuePreview(len(rows), capped, ok, force, old, near, len(tenants), units,
                          force_units)


def classify_for_requeue(engine: Engine, ids: Sequence[int], *, now: datetime,
                         window_seconds: float) -> dict[str, list[int]]:
    """The given events by requeue class (``ok``/``force``/``too_old``/``not_dead``)."""
    out: dict[str, list[int]] = {"ok": [], "force": [], "too_old": [], "not_dead": []}
    with engine.connect() as conn:
        rows = {r.id: _row(r) for r in conn.execute(
            select(T.c.id, T.c.status, T.c.occurred_at, T.c.dead_reason, T.c.first_unknown_at)
            .where(T.c.id.in_(list(ids))))}
    for i in ids:
        r = rows.get(i)
        if r is None or r["status"] != "dead":
            out["not_dead"].append(i)
        else:
            out[requeue_class(r, now=now, window_seconds=window_seconds)].append(i)
    return out


# -- one event -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EventDetail:
    event: dict[str, Any]
    attempts: list[dict[str, Any]]
    audit: list[dict[str, Any]]
    tenant: dict[str, Any] | None


def event_detail(engine: Engine, event_id: int) -> EventDetail | None:
    """Every field of an event, every call made for it, and the audit entries touching it."""
    with engine.connect() as conn:
        row = conn.execute(select(T).where(T.c.id == event_id)).first()
        if row is None:
            return None
        attempts = [_row(r) for r in conn.execute(
            select(ATT).where(ATT.c.event_id == event_id)
            .order_by(ATT.c.attempted_at.desc(), ATT.c.id.desc()))]
        audit = [_row(r) for r in conn.execute(
            select(AUDIT).join(AUDIT_EVENTS, AUDIT_EVENTS.c.audit_id == AUDIT.c.id)
            .where(AUDIT_EVENTS.c.event_id == event_id).order_by(AUDIT.c.id.desc()))]
        tenant = conn.execute(select(TENANTS).where(TENANTS.c.tenant_id == row.tenant_id)).first()
    return EventDetail(_row(row), attempts, audit, _row(tenant) if tenant else None)


@dataclass(frozen=True)
class TenantDetail:
    tenant_id: str
    tenant: dict[str, Any] | None
    usage: Usage
    events: Page
    waiting: int


def tenant_detail(engine: Engine, tenant_id: str, *, start: date, end: date,
                  after: Cursor | None = None, before: Cursor | None = None,
                  limit: int = 50, now: datetime | None = None,
                  margin: timedelta | None = None) -> TenantDetail:
    """A tenant's mapping, its usage for the period by meter, and its events newest first
    (keyset on (created_at, id): through ``ix_outbox_tenant_created`` for events not in
    flight, merged with the few in flight, found through ``ix_outbox_processing_deadline``)."""
    if margin is not None and now is not None:
        refresh_rollups(engine, now=now, margin=margin)
    usage = tenant_usage(engine, start=start, end=end, tenant_id=tenant_id)
    stmt = select(T.c.id, T.c.meter, T.c.quantity, T.c.idempotency_key, T.c.status,
                  T.c.occurred_at, T.c.created_at, T.c.attempt_count, T.c.sent_at,
                  T.c.last_outcome, T.c.last_error_code, T.c.next_attempt_at).where(
        T.c.tenant_id == tenant_id)
    with engine.connect() as conn:
        tenant = conn.execute(select(TENANTS).where(TENANTS.c.tenant_id == tenant_id)).first()
        page = _keyset(conn, stmt, T.c.created_at, T.c.id, after=after, before=before,
                       limit=limit, key="created_at",
                       parts=(T.c.status != sql_str("processing"), status_is("processing")))
        waiting = int(conn.execute(select(func.count()).where(
            status_in(("pending", "retrying")), IDLE_UNSENT, T.c.tenant_id == tenant_id))
            .scalar_one())
    return TenantDetail(tenant_id, _row(tenant) if tenant else None, usage, page, waiting)


# -- audit log -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AuditFilters:
    actor: str = ""
    action: str = ""
    since: date | None = None
    until: date | None = None       # inclusive
    event_id: int | None = None

    def params(self) -> dict[str, str]:
        out = {"actor": self.actor, "action": self.action,
               "since": self.since.isoformat() if self.since else "",
               "until": self.until.isoformat() if self.until else "",
               "event": str(self.event_id) if self.event_id else ""}
        return {k: v for k, v in out.items() if v}

    def conditions(self) -> list[Any]:
        where: list[Any] = []
        if self.actor:
            where.append(AUDIT.c.actor.icontains(self.actor, autoescape=True))
        if self.action:
            where.append(AUDIT.c.action == self.action)
        if self.since:
            where.append(AUDIT.c.at >= datetime(self.since.year, self.since.month,
                                                self.since.day, tzinfo=UTC))
        if self.until:
            where.append(AUDIT.c.at < datetime(self.until.year, self.until.month,
                                               self.until.day, tzinfo=UTC) + timedelta(days=1))
        if self.event_id:
            where.append(AUDIT.c.id.in_(select(AUDIT_EVENTS.c.audit_id)
                                        .where(AUDIT_EVENTS.c.event_id == self.event_id)))
        return where


@dataclass(frozen=True)
class AuditPage:
    rows: list[dict[str, Any]]
    next: int | None       # the id to continue below
    actions: list[str]


def audit_log(engine: Engine, filters: AuditFilters, *, below: int | None = None,
              limit: int = 100) -> AuditPage:
    """Audit entries newest first, keyset on id (ids grow with time)."""
    limit = max(1, min(limit, MAX_PAGE))
    stmt = select(AUDIT).where(*filters.conditions())
    if below is not None:
        stmt = stmt.where(AUDIT.c.id < below)
    with engine.connect() as conn:
        got = [_row(r) for r in conn.execute(stmt.order_by(AUDIT.c.id.desc()).limit(limit + 1))]
        actions = list(conn.execute(select(AUDIT.c.action).distinct().order_by(AUDIT.c.action))
                       .scalars())
    rows = got[:limit]
    return AuditPage(rows, rows[-1]["id"] if len(got) > limit else None, actions)


def audit_rows(engine: Engine, filters: AuditFilters, *, batch: int = 1000
               ) -> Iterator[dict[str, Any]]:
    """Every matching audit entry, oldest first, read in batches (for the CSV export)."""
    last = 0
    while True:
        with engine.connect() as conn:
            rows = [_row(r) for r in conn.execute(
                select(AUDIT).where(*filters.conditions(), AUDIT.c.id > last)
                .order_by(AUDIT.c.id).limit(batch))]
        yield from rows
        if len(rows) < batch:
            return
        last = rows[-1]["id"]


# -- users -----------------------------------------------------------------------------------------

def users_list(engine: Engine) -> list[dict[str, Any]]:
    """Every user (never the password hash)."""
    with engine.connect() as conn:
        return [_row(r) for r in conn.execute(
            select(USERS.c.id, USERS.c.email, USERS.c.role, USERS.c.active, USERS.c.created_at,
                   USERS.c.last_login_at).order_by(USERS.c.email))]


def user_by_id(conn: Connection, user_id: int) -> dict[str, Any] | None:
    row = conn.execute(select(USERS.c.id, USERS.c.email, USERS.c.role, USERS.c.active)
                       .where(USERS.c.id == user_id)).first()
    return dict(row._mapping) if row else None


# -- metrics ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Metrics:
    counts: dict[str, int]
    oldest_waiting_age: float | None
    paused: bool
    attempts: dict[str, int]                 # outcome -> calls, ever
    latency_buckets: list[tuple[float, int]]  # (upper bound in seconds, cumulative calls)
    latency_count: int
    latency_sum_seconds: float
    near_limit: int
    over_limit: int


def metrics(engine: Engine, *, now: datetime, margin: timedelta | None = None) -> Metrics:
    """Aggregates for /metrics: never a row, a tenant or a key."""
    if margin is not None:
        refresh_rollups(engine, now=now, margin=margin)
    with reading(engine) as conn:
        counts = status_counts(conn)
        oldest = oldest_waiting(conn)
        paused = sending_state(conn).paused
        near, over = _age_limits(conn, now)
        live = select(ATT.c.outcome, _latency_bucket().label("bucket"),
                      literal_column("1").label("attempts"),
                      func.coalesce(ATT.c.duration_ms, 0).label("duration_ms")).where(
            _live_attempts(_state(conn, ATTEMPTS)))
        folded = select(ATT_ROLLUP.c.outcome, ATT_ROLLUP.c.bucket, ATT_ROLLUP.c.attempts,
                        ATT_ROLLUP.c.duration_ms)
        both = union_all(folded, live).subquery()
        rows = conn.execute(select(both.c.outcome, both.c.bucket, _int_sum(both.c.attempts),
                                   _int_sum(both.c.duration_ms))
                            .group_by(both.c.outcome, both.c.bucket)).all()
    attempts: dict[str, int] = defaultdict(int)
    per_bucket = [0] * (len(LATENCY_BUCKETS_MS) + 1)
    total_ms = 0
    for outcome, bucket, n, ms in rows:
        attempts[str(outcome)] += int(n)
        if int(bucket) >= 0:
            per_bucket[int(bucket)] += int(n)
            total_ms += int(ms)
    cumulative, running = [], 0
    for i, ms in enumerate(LATENCY_BUCKETS_MS):
        running += per_bucket[i]
        cumulative.append((ms / 1000, running))
    count = running + per_bucket[-1]
    age = None if oldest is None else max(0.0, (now - oldest).total_seconds())
    return Metrics(counts, age, paused, dict(attempts), cumulative, count, total_ms / 1000,
                   near, over)
