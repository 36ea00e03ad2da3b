"""Enqueue overhead: what ``enqueue_usage`` adds to the caller's transaction.

Each transaction is the contract's request path: ``with Session(engine) as db, db.begin():``,
add a ``usage_log`` row, flush (its id), then

* **bare**: nothing more — the transaction the application would run without billing;
* **enqueue_usage**: the real ``enqueue_usage(db, …, idempotency_key=f"usage_log:{id}",
  occurred_at=log.created_at)`` (one ``INSERT … ON CONFLICT DO NOTHING RETURNING``);
* **seed savepoint**: the article's enqueue, implemented here (not in product code): the same
  outbox row added inside ``db.begin_nested()`` with ``IntegrityError`` → look the row up.

The three are interleaved in blocks of ``BLOCK`` transactions (the order rotating), in a fresh
schema (PostgreSQL) or a fresh file (SQLite, the product's WAL engine) per run; the ratio of
each run is its enqueue time over its bare time. The engine is ``webapp.db.make_engine`` with
``pool_pre_ping=False``: the ping would add one round trip to every transaction and flatter the
ratio.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import BigInteger, DateTime, Integer, String, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Session, mapped_column

from .common import BenchDatabase, BenchFailure, Row, SectionResults, verdict

BLOCK = 250
#: ``enqueue_usage`` against the bare work transaction on PostgreSQL (issue 32: back where it
#: was before the dashboard's indexes; 1.5× until then).
FLOOR_RATIO = 1.3
#: ``billing_outbox_enqueue`` against the bare INSERT of the same row (issue 32).
FLOOR_SQL_FUNCTION = 1.3


class _Base(DeclarativeBase):
    pass


class UsageLog(_Base):
    """The application's own work row."""

    __tablename__ = "usage_log"
    id = mapped_column(BigInteger().with_variant(Integer(), "sqlite"), primary_key=True,
                       autoincrement=True)
    tenant_id = mapped_column(String(100), nullable=False)
    quantity = mapped_column(Integer, nullable=False)
    created_at = mapped_column(DateTime(timezone=True), nullable=False)


def _work(db: Session, i: int) -> Any:
    from webapp.models import utcnow

    log = UsageLog(tenant_id=f"tenant-{i % 20:03d}", quantity=1 + i % 7, created_at=utcnow())
    db.add(log)
    db.flush()
    return log


def tx_bare(engine: Any, i: int) -> None:
    with Session(engine) as db, db.begin():
        _work(db, i)


def tx_enqueue(engine: Any, i: int) -> None:
    from webapp.outbox import enqueue_usage

    with Session(engine) as db, db.begin():
        log = _work(db, i)
        enqueue_usage(db, tenant_id=log.tenant_id, quantity=log.quantity,
                      idempotency_key=f"usage_log:{log.id}", occurred_at=log.created_at)


def tx_seed(engine: Any, i: int) -> None:
    """The article's savepoint + IntegrityError enqueue, writing the same outbox row."""
    from webapp.models import OutboxEvent, utcnow

    with Session(engine) as db, db.begin():
        log = _work(db, i)
        key = f"usage_log:{log.id}"
        now = utcnow()
        row = OutboxEvent(tenant_id=log.tenant_id, meter="api_requests", quantity=log.quantity,
                          idempotency_key=key, occurred_at=log.created_at, status="pending",
                          attempt_count=0, call_count=0, key_generation=0, next_attempt_at=now,
                          created_at=now, updated_at=now)
        try:
            with db.begin_nested():
                db.add(row)
                db.flush()
        except IntegrityError:  # the same usage tried to enqueue a second time
            existing = db.scalars(select(OutboxEvent)
                                  .where(OutboxEvent.idempotency_key == key)).first()
            assert existing is not None


VARIANTS: dict[str, Callable[[Any, int], None]] = {
    "bare": tx_bare, "enqueue": tx_enqueue, "seed": tx_seed}


def measure(engine: Any, n: int) -> dict[str, float]:
    """Seconds per variant for ``n`` transactions each, interleaved in blocks."""
    spent = dict.fromkeys(VARIANTS, 0.0)
    names = list(VARIANTS)
    # Warm up (statement caches, connection) outside the clock.
    for name in names:
        for i in range(20):
            VARIANTS[name](engine, 10_000_000 + i)
    counter = 0
    for b in range(0, n, BLOCK):
        size = min(BLOCK, n - b)
        k = (b // BLOCK) % len(names)
        for name in names[k:] + names[:k]:
            fn = VARIANTS[name]
            t0 = time.perf_counter()
            for _ in range(size):
                fn(engine, counter)
                counter += 1
            spent[name] += time.perf_counter() - t0
    return spent


def _check(engine: Any, n: int, label: str) -> None:
    from sqlalchemy import func

    from webapp.models import OutboxEvent

    with Session(engine) as db:
        logs = db.scalar(select(func.count()).select_from(UsageLog))
        events = db.scalar(select(func.count()).select_from(OutboxEvent))
    warm = 20 * len(VARIANTS)
    if logs != 3 * n + warm or events != 2 * n + 2 * 20:
        raise BenchFailure(f"enqueue ({label}): expected {3 * n + warm} usage_log rows and "
                           f"{2 * n + 40} outbox rows, found {logs} and {events}")


#: The indexes the claim itself needs; every other index of the outbox serves a read.
CLAIM_INDEXES = ("pk_stripe_usage_outbox", "uq_stripe_usage_outbox_idempotency_key",
                 "ix_outbox_claimable")


def _drop_read_indexes(engine: Any) -> int:
    """Drop every outbox index but the claim's; return how many are left."""
    from sqlalchemy import text

    with engine.begin() as conn:
        names = list(conn.scalars(text(
            "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() "
            "AND tablename = 'stripe_usage_outbox'")))
        for name in names:
            if name not in CLAIM_INDEXES:
                conn.execute(text(f'DROP INDEX "{name}"'))
        return len(list(conn.scalars(text(
            "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() "
            "AND tablename = 'stripe_usage_outbox'"))))


def run_postgres(db: BenchDatabase, n: int, *, claim_indexes_only: bool = False
                 ) -> dict[str, float]:
    """The three contenders on PostgreSQL. ``claim_indexes_only``: on a table left with the
    claim's indexes alone, no read index at all: the ratio no design of the read side can
    beat while the event is one row of this table."""
    from webapp.db import make_engine

    with db.outbox_schema("enq") as url:
        engine = make_engine(url, pool_pre_ping=False)
        try:
            if claim_indexes_only and _drop_read_indexes(engine) != len(CLAIM_INDEXES):
                raise BenchFailure("enqueue: the claim's indexes are not all there")
            _Base.metadata.create_all(engine)
            spent = measure(engine, n)
            _check(engine, n, "PostgreSQL")
        finally:
            engine.dispose()
    return spent


def run_sqlite(n: int) -> dict[str, float]:
    from webapp.db import make_engine
    from webapp.migrate import upgrade

    with tempfile.TemporaryDirectory(prefix="bench-sqlite-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'outbox.sqlite3'}"
        engine = make_engine(url)
        try:
            upgrade(engine)
            _Base.metadata.create_all(engine)
            spent = measure(engine, n)
            _check(engine, n, "SQLite")
        finally:
            engine.dispose()
    return spent


_BARE_INSERT = (
    "INSERT INTO stripe_usage_outbox (tenant_id, meter, quantity, idempotency_key, occurred_at, "
    "next_attempt_at, created_at, updated_at, status, attempt_count, call_count, key_generation) "
    "VALUES (%s, 'api_requests', %s, %s, %s, %s, %s, %s, 'pending', 0, 0, 0) "
    "ON CONFLICT (idempotency_key) DO NOTHING RETURNING id")
_FUNCTION = "SELECT billing_outbox_enqueue(%s, %s, %s, NULL, NULL)"


def run_sql_function(db: BenchDatabase, n: int) -> dict[str, float]:
    """Seconds for ``n`` one-event transactions each way, straight through psycopg as a
    producer in another language would send them: the bare INSERT of the outbox row, and
    ``billing_outbox_enqueue`` (default meter, time now), interleaved in blocks."""
    from datetime import UTC, datetime

    from sqlalchemy import func

    from webapp.db import make_engine
    from webapp.models import OutboxEvent

    with db.outbox_schema("enqfn") as url:
        engine = make_engine(url, pool_pre_ping=False)
        try:
            raw = engine.raw_connection()
            conn = raw.driver_connection
            assert conn is not None

            def bare(i: int) -> None:
                now = datetime.now(UTC)
                with conn.cursor() as cur:
                    cur.execute(_BARE_INSERT, (f"tenant-{i % 20:03d}", 1 + i % 7, f"b:{i}",
                                               now, now, now, now))
                    cur.fetchone()
                conn.commit()

            def function(i: int) -> None:
                with conn.cursor() as cur:
                    cur.execute(_FUNCTION, (f"tenant-{i % 20:03d}", 1 + i % 7, f"f:{i}"))
                    cur.fetchone()
                conn.commit()

            ways = {"insert": bare, "function": function}
            for fn in ways.values():
                for i in range(20):
                    fn(10_000_000 + i)
            spent = dict.fromkeys(ways, 0.0)
            names = list(ways)
            for b in range(0, n, BLOCK):
                k = (b // BLOCK) % len(names)
                for name in names[k:] + names[:k]:
                    t0 = time.perf_counter()
                    for i in range(b, min(b + BLOCK, n)):
                        ways[name](i)
                    spent[name] += time.perf_counter() - t0
            raw.close()
            with Session(engine) as check:
                events = check.scalar(select(func.count()).select_from(OutboxEvent))
            if events != 2 * n + 40:
                raise BenchFailure(f"enqueue (SQL function): expected {2 * n + 40} outbox "
                                   f"rows, found {events}")
        finally:
            engine.dispose()
    return spent


class EnqueueResults(SectionResults):
    """The enqueue section's figures (``events``: transactions per contender and run)."""


def run(db: BenchDatabase, *, n: int, runs: int, log: Any = print) -> EnqueueResults:
    res = EnqueueResults(events=n, runs=runs)
    for i in range(runs):
        r = {"postgres": run_postgres(db, n), "sqlite": run_sqlite(n),
             "claim_only": run_postgres(db, n, claim_indexes_only=True)}
        fn = run_sql_function(db, n)
        res.raw.append({**r, "sql_function": fn})
        res.fig("sql_insert_ms").add(fn["insert"] / n * 1000)
        res.fig("sql_function_ms").add(fn["function"] / n * 1000)
        res.fig("sql_function_ratio").add(fn["function"] / fn["insert"])
        log(f"enqueue run {i + 1}/{runs} SQL: bare INSERT {fn['insert'] / n * 1000:.3f} ms/tx, "
            f"billing_outbox_enqueue {fn['function'] / fn['insert']:.2f}×")
        for backend, spent in r.items():
            if backend == "claim_only":
                res.fig("claim_only_ratio").add(spent["enqueue"] / spent["bare"])
                log(f"enqueue run {i + 1}/{runs} claim's indexes only: enqueue_usage "
                    f"{spent['enqueue'] / spent['bare']:.2f}×")
                continue
            for name, secs in spent.items():
                res.fig(f"{backend}_{name}_ms").add(secs / n * 1000)
            res.fig(f"{backend}_ratio").add(spent["enqueue"] / spent["bare"])
            res.fig(f"{backend}_seed_ratio").add(spent["seed"] / spent["bare"])
            res.fig(f"{backend}_enqueue_vs_seed").add(spent["enqueue"] / spent["seed"])
            log(f"enqueue run {i + 1}/{runs} {backend}: bare {spent['bare'] / n * 1000:.3f} "
                f"ms/tx, enqueue_usage {spent['enqueue'] / spent['bare']:.2f}×, seed "
                f"{spent['seed'] / spent['bare']:.2f}×")
    return res


def rows(res: EnqueueResults) -> list[Row]:
    s = "Enqueue overhead"
    f = res.fig
    out = []
    for backend, label in (("postgres", "PostgreSQL"), ("sqlite", "SQLite")):
        pg = backend == "postgres"
        out += [
            Row(s, f"{label}: bare transaction ({res.events:,} tx: usage_log insert + commit)",
                f(f"{backend}_bare_ms").fmt(3, " ms/tx")),
            Row(s, f"{label}: with enqueue_usage", f(f"{backend}_enqueue_ms").fmt(3, " ms/tx")),
            Row(s, f"{label}: ratio enqueue_usage / bare", f(f"{backend}_ratio").fmt(2, "×"),
                f"≤ {FLOOR_RATIO:g}×" if pg else "",
                verdict(f(f"{backend}_ratio").median <= FLOOR_RATIO) if pg else "",
                floor_name=f"enqueue ≤ {FLOOR_RATIO:g}× the bare transaction on PostgreSQL"
                if pg else ""),
            Row(s, f"{label}: ratio seed savepoint + IntegrityError / bare",
                f(f"{backend}_seed_ratio").fmt(2, "×")),
        ]
        if pg:
            out.append(Row(
                s, "PostgreSQL: ratio enqueue_usage / bare with the claim's three indexes "
                   "only (no read index: what no read-side design can beat)",
                f("claim_only_ratio").fmt(2, "×")))
    out += [
        Row(s, f"PostgreSQL, another language's producer ({res.events:,} one-event "
               "transactions through psycopg): the bare INSERT of the outbox row",
            f("sql_insert_ms").fmt(3, " ms/tx")),
        Row(s, "PostgreSQL: billing_outbox_enqueue (every check, the default meter read)",
            f("sql_function_ms").fmt(3, " ms/tx")),
        Row(s, "PostgreSQL: ratio billing_outbox_enqueue / bare INSERT",
            f("sql_function_ratio").fmt(2, "×"), f"≤ {FLOOR_SQL_FUNCTION:g}×",
            verdict(f("sql_function_ratio").median <= FLOOR_SQL_FUNCTION),
            floor_name=f"billing_outbox_enqueue ≤ {FLOOR_SQL_FUNCTION:g}× a bare INSERT"),
    ]
    return out
