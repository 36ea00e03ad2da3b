"""SQL building blocks shared by the core and the reads, portable to SQLite and PostgreSQL.

Partial-index predicates are written as SQL literals (``status NOT IN ('sent',
'processing')``), never bound parameters: PostgreSQL can then prove they imply an index's
predicate even in the generic plans of prepared statements, and SQLite matches a partial index
only by the terms of its predicate. The two dialect differences the reads need (bucketing a
timestamp, a UTC day) and a case-folding search are compiled per dialect below.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    Boolean,
    ColumnElement,
    Connection,
    String,
    Table,
    Text,
    any_,
    bindparam,
    case,
    func,
    literal,
    literal_column,
    not_,
    or_,
    select,
    text,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import FunctionElement

from ..models import (
    DEAD_FITS_SQL,
    DEAD_OUTSIZE_SQL,
    IN_FLIGHT_SQL,
    AttemptRollup,
    AuditEntry,
    AuditEvent,
    BillingWatch,
    Control,
    DeliveryAttempt,
    DrainerHeartbeat,
    IngestToken,
    LateLine,
    LateUsage,
    LineEvent,
    NotifyAlert,
    NotifyDelivery,
    OutboxEvent,
    OutboxSetting,
    PrunedUsageRollup,
    ReconciledDay,
    ReconciledMeterDay,
    ReconciledMonth,
    ReconciliationMismatch,
    ReconciliationRun,
    RollupState,
    SentUsageDay,
    SentUsageMonthly,
    SentUsageRollup,
    SentUsageYearly,
    StreamRequest,
    StripeCustomerCheck,
    StripeErrorSample,
    StripeEvent,
    StripeInvoice,
    StripeInvoicePeriod,
    StripeMeter,
    StripeSubscription,
    StripeSubscriptionItem,
    SyncState,
    Tenant,
    UnbilledUsage,
    User,
)
from ..status import NOT_WAITING, PROCESSING, SENT_OR_CLAIMED
from .guards import AnyOf, Condition, Equals, Not, OlderThan, StatusIn
from .states import ALL_STATUSES

T = cast(Table, OutboxEvent.__table__)
#: The identifier Stripe knows an event by: a new one after a rejected event's requeue,
#: else its idempotency key (``OutboxEvent.identifier`` in Python).
SENT_AS = func.coalesce(T.c.stripe_identifier, T.c.idempotency_key).label("sent_as")
ATTEMPTS = cast(Table, DeliveryAttempt.__table__)
TENANTS = cast(Table, Tenant.__table__)
AUDIT = cast(Table, AuditEntry.__table__)
AUDIT_EVENTS = cast(Table, AuditEvent.__table__)
USERS = cast(Table, User.__table__)
CONTROL = cast(Table, Control.__table__)
HEARTBEATS = cast(Table, DrainerHeartbeat.__table__)
ROLLUP_STATE = cast(Table, RollupState.__table__)
SENT_ROLLUP = cast(Table, SentUsageRollup.__table__)
SENT_MONTHLY = cast(Table, SentUsageMonthly.__table__)
SENT_YEARLY = cast(Table, SentUsageYearly.__table__)
SENT_DAY = cast(Table, SentUsageDay.__table__)
PRUNED_ROLLUP = cast(Table, PrunedUsageRollup.__table__)
ATTEMPT_ROLLUP = cast(Table, AttemptRollup.__table__)
STRIPE_METERS = cast(Table, StripeMeter.__table__)
STRIPE_EVENTS = cast(Table, StripeEvent.__table__)
ERROR_SAMPLES = cast(Table, StripeErrorSample.__table__)
STREAM_REQUESTS = cast(Table, StreamRequest.__table__)
CUSTOMER_CHECKS = cast(Table, StripeCustomerCheck.__table__)
SYNC_STATE = cast(Table, SyncState.__table__)
RECON_RUNS = cast(Table, ReconciliationRun.__table__)
RECON_MISMATCHES = cast(Table, ReconciliationMismatch.__table__)
RECON_DAYS = cast(Table, ReconciledDay.__table__)
RECON_MONTHS = cast(Table, ReconciledMonth.__table__)
RECON_METER_DAYS = cast(Table, ReconciledMeterDay.__table__)
SUBSCRIPTION_ITEMS = cast(Table, StripeSubscriptionItem.__table__)
INVOICES = cast(Table, StripeInvoice.__table__)
INVOICE_PERIODS = cast(Table, StripeInvoicePeriod.__table__)
LATE_USAGE = cast(Table, LateUsage.__table__)
LINE_EVENTS = cast(Table, LineEvent.__table__)
LATE_LINES = cast(Table, LateLine.__table__)
SUBSCRIPTIONS = cast(Table, StripeSubscription.__table__)
UNBILLED = cast(Table, UnbilledUsage.__table__)
BILLING_WATCH = cast(Table, BillingWatch.__table__)
NOTIFY_ALERTS = cast(Table, NotifyAlert.__table__)
NOTIFY_DELIVERIES = cast(Table, NotifyDelivery.__table__)
OUTBOX_SETTINGS = cast(Table, OutboxSetting.__table__)
INGEST_TOKENS = cast(Table, IngestToken.__table__)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

#: The rescuer's predicate (``ix_outbox_processing_deadline``), as literal text (the claim's
#: is ``webapp.outbox.sendable.WAITING_SQL``).
PROCESSING_SQL = text(f"stripe_usage_outbox.{IN_FLIGHT_SQL}")


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


#: The predicate of ``ix_outbox_unsent``: neither sent nor in flight.
IDLE_UNSENT = T.c.status.not_in([sql_str(s) for s in SENT_OR_CLAIMED])
#: Pending or retrying: the predicate of ``ix_outbox_waiting_created``, the complement of the
#: other statuses (so SQLite never takes that index for the claim's).
WAITING_IDLE = T.c.status.not_in([sql_str(s) for s in NOT_WAITING])
#: Events in flight: the predicate of ``ix_outbox_processing_deadline``.
IN_FLIGHT_WHERE = T.c.status == sql_str(PROCESSING)


def condition_sql(cond: Condition, columns: Mapping[str, Any], *, now: datetime,
                  window_seconds: float) -> ColumnElement[bool]:
    """A rule's condition (``webapp.outbox.states``) as SQL over ``columns`` (field name ->
    column): the same test :func:`webapp.outbox.guards.holds` makes in Python."""
    if isinstance(cond, StatusIn):
        return cast(ColumnElement[bool], columns["status"].in_(cond.statuses))
    if isinstance(cond, Equals):
        return cast(ColumnElement[bool], columns[cond.field] == cond.value)
    if isinstance(cond, OlderThan):
        age = cond.age if cond.age is not None else timedelta(seconds=window_seconds)
        column = columns[cond.field]
        return cast(ColumnElement[bool], column < now - age if cond.strict
                    else column <= now - age)
    if isinstance(cond, AnyOf):
        return or_(*[condition_sql(p, columns, now=now, window_seconds=window_seconds)
                     for p in cond.parts])
    assert isinstance(cond, Not)
    return not_(condition_sql(cond.part, columns, now=now, window_seconds=window_seconds))


def rule_sql(rule: Sequence[tuple[Condition, str]], otherwise: str,
             columns: Mapping[str, Any], *, now: datetime,
             window_seconds: float) -> ColumnElement[str]:
    """A rule (``(condition, verdict)`` pairs, the first that holds wins) as one SQL CASE."""
    return case(*[(condition_sql(c, columns, now=now, window_seconds=window_seconds),
                   literal(str(verdict))) for c, verdict in rule],
                else_=literal(otherwise))


def id_in(conn: Connection, column: Any, ids: Sequence[int]) -> ColumnElement[bool]:
    """``column = ANY(:ids)`` (one array parameter) on PostgreSQL, ``column IN (SELECT value
    FROM json_each(:ids))`` on SQLite: one bind parameter whatever the number of ids
    (PostgreSQL takes at most 65,535 per statement, SQLite 32,766)."""
    if conn.dialect.name == "postgresql":
        return cast(ColumnElement[bool], column == any_(sql_cast(
            bindparam("ids", bigint_array(ids), type_=Text, unique=True),
            postgresql.ARRAY(BigInteger))))
    return _in_json(column, [int(i) for i in ids])


def text_in(conn: Connection, column: Any, values: Sequence[str]) -> ColumnElement[bool]:
    """``column`` is one of ``values`` (tenant ids, keys…), as one array parameter on
    PostgreSQL and one JSON parameter on SQLite, however many values there are."""
    if conn.dialect.name == "postgresql":
        return cast(ColumnElement[bool], column == any_(
            bindparam("values", list(values), type_=postgresql.ARRAY(Text), unique=True)))
    return _in_json(column, [str(v) for v in values])


def _in_json(column: Any, values: list[Any]) -> ColumnElement[bool]:
    listed: Any = select(literal_column("value")).select_from(
        func.json_each(bindparam("values", json.dumps(values), type_=Text, unique=True)))
    return cast(ColumnElement[bool], column.in_(listed))


def bigint_array(ids: Iterable[int]) -> str:
    """A PostgreSQL array literal of integers, ``{1,2,3}``, for ``CAST(:p AS bigint[])``: a
    quarter of the client CPU psycopg spends adapting a list of a thousand ints element by
    element."""
    return "{" + ",".join([str(int(i)) for i in ids]) + "}"


def insert_for(conn: Connection, table: Table) -> Any:
    """The dialect's INSERT (with ``on_conflict_do_…``) for ``table``."""
    return (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(table)


def int_sum(column: Any) -> ColumnElement[int]:
    """``sum`` that is 0 when empty and an integer on both dialects (PostgreSQL: numeric)."""
    return sql_cast(func.coalesce(func.sum(column), 0), BigInteger)


def as_utc(value: datetime | str | None) -> datetime | None:
    """Timezone-aware UTC (SQLite hands back naive values from untyped expressions)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is UTC:  # what typed columns give back: nothing to do
        return value
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def row_dict(row: Any) -> dict[str, Any]:
    """A result row as a dict, its datetimes timezone-aware UTC."""
    out = dict(row._mapping)
    for k, v in out.items():
        if isinstance(v, datetime):
            out[k] = as_utc(v)
    return out


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


class _dialect_text(FunctionElement[bool]):
    """A boolean SQL term written per dialect (``TEXTS``), rendered word for word."""

    type = Boolean()
    inherit_cache = True
    TEXTS: Mapping[str, str] = {}


class dead_fits(_dialect_text):  # noqa: N801 - SQL function style
    """The dead row's texts fit ``ix_outbox_dead_errors`` (``models.DEAD_FITS_SQL``)."""

    inherit_cache = True
    name = "dead_fits"
    TEXTS = DEAD_FITS_SQL


class dead_outsize(_dialect_text):  # noqa: N801 - SQL function style
    """The dead row's texts are in ``ix_outbox_dead_outsize`` (``models.DEAD_OUTSIZE_SQL``)."""

    inherit_cache = True
    name = "dead_outsize"
    TEXTS = DEAD_OUTSIZE_SQL


@compiles(_dialect_text)
def _dialect_text_sql(element: _dialect_text, compiler: Any, **kw: Any) -> str:
    return element.TEXTS[compiler.dialect.name]


#: A dead (``status = 'dead'``) row is in exactly one of these two pieces, each served by its
#: own index: ``ix_outbox_dead_errors`` (covering, almost every row) and
#: ``ix_outbox_dead_outsize`` (texts too long for an index entry; normally none).
DEAD_PIECES: tuple[ColumnElement[bool], ...] = (dead_fits(), dead_outsize())


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
