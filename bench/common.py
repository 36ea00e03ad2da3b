"""What every benchmark shares: a throw-away PostgreSQL database with one schema per run,
event population through the real ``enqueue_usage``, figures (median, min–max), verdicts,
and a few /proc readers for child processes.

Nothing here changes product code or product data: each ``python -m bench.run`` creates a
database of its own (``bench_outbox_<pid>``) and drops it when it ends.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import statistics
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "bench" / "results"

#: An existing database on the server, used only to create and drop the bench database.
ADMIN_URL = os.environ.get("BENCH_ADMIN_URL") or os.environ.get(
    "TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")

TEST_API_KEY = "sk_test_x"
METERS = ("api_requests", "tokens")


class BenchFailure(RuntimeError):
    """A run broke a guarantee (an event lost or handed over twice, a lane overlap, a worker
    that did not exit cleanly): the figures of such a run are worthless, so the suite stops."""


# -- figures -----------------------------------------------------------------------------------

@dataclass
class Figure:
    """One measured quantity over several runs."""

    values: list[float] = field(default_factory=list)

    def add(self, value: float) -> None:
        self.values.append(float(value))

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def lo(self) -> float:
        return min(self.values)

    @property
    def hi(self) -> float:
        return max(self.values)

    def fmt(self, digits: int = 0, unit: str = "") -> str:
        """``12,345 (12,001–12,900)``; a single run shows no range."""
        med = _num(self.median, digits)
        if len(self.values) < 2:
            return f"{med}{unit}"
        return f"{med}{unit} ({_num(self.lo, digits)}–{_num(self.hi, digits)})"


@dataclass
class SectionResults:
    """What one bench section measured: named figures over its runs, and the raw records."""

    events: int
    runs: int
    figures: dict[str, Figure] = field(default_factory=dict)
    raw: list[dict[str, Any]] = field(default_factory=list)

    def fig(self, name: str) -> Figure:
        return self.figures.setdefault(name, Figure())


def _num(x: float, digits: int) -> str:
    return f"{x:,.{digits}f}"


@dataclass
class Row:
    """One line of the results table."""

    section: str
    what: str
    figure: str
    floor: str = ""
    verdict: str = ""
    note: str = ""
    #: Set on the one row that decides a floor of issue 5: its name in the floors summary.
    floor_name: str = ""


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


# -- the database ------------------------------------------------------------------------------

class BenchDatabase:
    """A database created for one bench invocation; ``schema()`` gives a fresh, migrated
    search_path per run, so no run sees another's rows, dead tuples or sequences."""

    def __init__(self) -> None:
        self.name = f"bench_outbox_{os.getpid()}_{secrets.token_hex(3)}"
        self._admin = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
        base = make_url(ADMIN_URL)
        self.url = base.set(database=self.name).render_as_string(hide_password=False)
        self._schemas: list[str] = []
        self._engine: Any = None

    # lifecycle
    def create(self) -> BenchDatabase:
        with self._admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{self.name}"'))
        self._engine = create_engine(self.url, isolation_level="AUTOCOMMIT")
        return self

    def drop(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
        with self._admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))
        self._admin.dispose()

    def server_version(self) -> str:
        with self._admin.connect() as conn:
            return str(conn.execute(text("SHOW server_version")).scalar_one()).split()[0]

    # schemas
    def new_schema(self, prefix: str) -> str:
        name = f"{prefix}_{secrets.token_hex(4)}"
        assert self._engine is not None
        with self._engine.connect() as conn:
            conn.execute(text(f'CREATE SCHEMA "{name}"'))
        self._schemas.append(name)
        return name

    def drop_schema(self, name: str) -> None:
        assert self._engine is not None
        with self._engine.connect() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))

    def schema_url(self, schema: str) -> str:
        """The SQLAlchemy URL (psycopg 3) whose connections see only ``schema``."""
        return f"{self.url}?options={quote(f'-csearch_path={schema}')}"

    def libpq_dsn(self, schema: str) -> str:
        """The same, as a libpq conninfo string (for pgqueuer's psycopg driver)."""
        u = make_url(self.url)
        parts = [f"host={u.host or '127.0.0.1'}", f"port={u.port or 5432}",
                 f"user={u.username or 'postgres'}", f"dbname={self.name}",
                 f"options='-csearch_path={schema}'"]
        if u.password:
            parts.append(f"password={u.password}")
        return " ".join(parts)

    def migrated_schema(self, prefix: str) -> tuple[str, str]:
        """A new schema migrated to the product's newest revision: (schema, url)."""
        from webapp.db import make_engine
        from webapp.migrate import upgrade

        schema = self.new_schema(prefix)
        url = self.schema_url(schema)
        engine = make_engine(url)
        try:
            upgrade(engine)
        finally:
            engine.dispose()
        return schema, url

    @contextmanager
    def outbox_schema(self, prefix: str, template: str | None = None,
                      copies: int = 1, limit: int | None = None) -> Iterator[str]:
        """A fresh migrated schema; yields its URL. With ``template``, the template's tenants
        and events (made by the real ``enqueue_usage``) are copied in first, ``copies`` times
        (copy ``c > 0`` gets the identifier suffix ``:c``) or only its first ``limit`` events,
        then the table is analyzed."""
        schema, url = self.migrated_schema(prefix)
        try:
            if template is not None:
                self.copy_events(template, schema, copies, limit)
            yield url
        finally:
            self.drop_schema(schema)

    def copy_events(self, source: str, target: str, copies: int = 1,
                    limit: int | None = None) -> int:
        """Copy tenants and events from schema ``source`` into ``target``; return the count."""
        assert self._engine is not None
        with self._engine.begin() as conn:
            cols = [r[0] for r in conn.execute(text(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = :s "
                "AND table_name = 'stripe_usage_outbox' ORDER BY ordinal_position"),
                {"s": source})]
            conn.execute(text(f'INSERT INTO "{target}".billing_tenants '
                              f'SELECT * FROM "{source}".billing_tenants'))
            others = [c for c in cols if c not in ("id", "idempotency_key")]
            col_list = ", ".join(others)
            conn.execute(text(
                f'INSERT INTO "{target}".stripe_usage_outbox (idempotency_key, {col_list}) '
                f"SELECT CASE WHEN g = 0 THEN idempotency_key "
                f"ELSE idempotency_key || ':' || g END, {col_list} "
                f'FROM (SELECT * FROM "{source}".stripe_usage_outbox ORDER BY id '
                f"LIMIT :limit) src, generate_series(0, :n - 1) g "
                f"ORDER BY g, id"), {"n": copies, "limit": limit})
            count = conn.execute(text(
                f'SELECT count(*) FROM "{target}".stripe_usage_outbox')).scalar_one()
        with self._engine.connect() as conn:
            conn.execute(text(f'ANALYZE "{target}".stripe_usage_outbox'))
            conn.execute(text(f'ANALYZE "{target}".billing_tenants'))
        return int(count)


# -- populating --------------------------------------------------------------------------------

def tenant_ids(n: int) -> list[str]:
    return [f"tenant-{i:03d}" for i in range(n)]


def customer_of(tenant: str) -> str:
    return "cus_" + tenant.replace("-", "")


def map_tenants(engine: Any, tenants: Sequence[str]) -> None:
    """Map each tenant to a Stripe customer with the product's own operation."""
    from webapp.models import utcnow
    from webapp.outbox.operations import set_tenant

    now = utcnow()
    for t in tenants:
        set_tenant(engine, t, stripe_customer_id=customer_of(t), name=t, now=now)


def event_key(i: int) -> str:
    return f"usage_log:{i}"


def enqueue_events(engine: Any, n: int, tenants: Sequence[str],
                   meters: Sequence[str] = ("api_requests",), chunk: int = 1000) -> list[str]:
    """Enqueue ``n`` events with the real ``enqueue_usage``, committed in transactions of
    ``chunk``; tenants and meters round-robin. Returns the identifiers."""
    from webapp.outbox import enqueue_usage

    keys: list[str] = []
    nt, nm = len(tenants), len(meters)
    for start in range(0, n, chunk):
        with Session(engine) as db, db.begin():
            for i in range(start, min(n, start + chunk)):
                key = event_key(i)
                enqueue_usage(db, tenant_id=tenants[i % nt], quantity=1 + i % 7,
                              idempotency_key=key, meter=meters[(i // nt) % nm])
                keys.append(key)
    return keys


def check_exactly_once(label: str, handed: Iterable[str], expected: Iterable[str]) -> None:
    """Raise ``BenchFailure`` unless every expected identifier was handed over exactly once
    and nothing else was."""
    counts = Counter(handed)
    want = set(expected)
    twice = [k for k, c in counts.items() if c > 1]
    missing = want - counts.keys()
    extra = counts.keys() - want
    if twice or missing or extra:
        raise BenchFailure(
            f"{label}: not exactly once: {len(twice)} handed over more than once "
            f"(e.g. {twice[:3]}), {len(missing)} never (e.g. {sorted(missing)[:3]}), "
            f"{len(extra)} unexpected (e.g. {sorted(extra)[:3]})")


def check_all_sent(label: str, engine: Any, n: int) -> None:
    """Raise unless the outbox holds exactly ``n`` rows, all ``sent``, one attempt each."""
    with engine.connect() as conn:
        by_status = dict(conn.execute(text(
            "SELECT status, count(*) FROM stripe_usage_outbox GROUP BY status")).all())
        attempts = conn.execute(text("SELECT count(*) FROM stripe_usage_attempts")).scalar_one()
    if by_status != {"sent": n} or attempts != n:
        raise BenchFailure(f"{label}: expected {n} sent rows and {n} attempts, found "
                           f"{by_status} and {attempts} attempts")


# -- processes ---------------------------------------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (threads included), from /proc."""
    with open(f"/proc/{pid}/stat") as fh:
        raw = fh.read()
    fields = raw[raw.rindex(")") + 2:].split()
    # fields[0] is the state (field 3); utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_status_kb(pid: int, key: str) -> int:
    """A ``kB`` value of /proc/<pid>/status, e.g. VmHWM (peak RSS) or VmRSS."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def wait_until(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise BenchFailure(f"timed out after {timeout:.0f}s waiting for {what}")


def seconds(td: timedelta) -> float:
    return td.total_seconds()


def nproc() -> int:
    return len(os.sched_getaffinity(0))


def copied_keys(keys: Sequence[str], copies: int) -> list[str]:
    """The identifiers ``BenchDatabase.copy_events`` gives ``copies`` copies of ``keys``."""
    return [k if c == 0 else f"{k}:{c}" for c in range(copies) for k in keys]


_TEMPLATES: dict[tuple[str, int, int, tuple[str, ...]], tuple[str, list[str]]] = {}


def make_template(db: BenchDatabase, n: int, n_tenants: int,
                  meters: Sequence[str]) -> tuple[str, list[str]]:
    """A schema holding ``n`` events enqueued by the real ``enqueue_usage`` (committed) for
    ``n_tenants`` mapped tenants; runs copy from it. Returns (schema, identifiers). Made once
    per bench database and shape; it goes when the database is dropped."""
    from webapp.db import make_engine

    key = (db.name, n, n_tenants, tuple(meters))
    if key in _TEMPLATES:
        return _TEMPLATES[key]
    schema, url = db.migrated_schema("tmpl")
    engine = make_engine(url)
    try:
        tenants = tenant_ids(n_tenants)
        map_tenants(engine, tenants)
        keys = enqueue_events(engine, n, tenants, meters)
    finally:
        engine.dispose()
    _TEMPLATES[key] = (schema, keys)
    return schema, keys


def machine_cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user
    return total - idle, total


def busy_fraction(before: tuple[float, float], after: tuple[float, float]) -> float:
    """Share of all CPUs' time spent busy between two ``machine_cpu_times`` readings."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total > 0 else 0.0


def self_cpu_seconds() -> float:
    """User + system CPU seconds of this process, all threads."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def backend_cpu(tag: str) -> dict[int, float]:
    """CPU seconds of each PostgreSQL backend whose application_name is ``tag``, read from
    /proc (the server runs on this machine): what a client cost the database server."""
    engine = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            pids = [r[0] for r in conn.execute(text(
                "SELECT pid FROM pg_stat_activity WHERE application_name = :t"), {"t": tag})]
    finally:
        engine.dispose()
    out = {}
    for pid in pids:
        with contextlib.suppress(OSError):  # gone, or the server is not local
            out[pid] = proc_cpu_seconds(pid)
    return out


def backend_cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def sources_digest() -> str:
    """A digest of the product's Python sources (``webapp/``): compared at the start and end
    of a run, it tells whether the code under test changed while it was measured."""
    import hashlib

    h = hashlib.sha256()
    for path in sorted((ROOT / "webapp").rglob("*.py")):
        h.update(str(path.relative_to(ROOT)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:12]
