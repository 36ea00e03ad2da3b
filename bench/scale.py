"""Scale: a year of usage on one PostgreSQL (issue 15). ``python -m bench.run --only scale``
(not part of the default run: the load alone takes several minutes).

**The data.** ``bench/dashboard.py``'s loader with another :class:`~bench.dashboard.Shape`:
10,000,000 outbox rows (500,000 with ``--quick``) created evenly over 400 days, 100,000
tenants with a skewed share (the largest ~2% of the events, the smallest a few dozen a
year), 99,950 of them mapped, 25 with a row and no customer, 25 with none (0.05% of the
events wait ``pending``); ≈ 95% sent, the other statuses as that section spreads them; every
attempt row; audit entries; Stripe's side. Loaded into a schema migrated with every product
index in place (the order the product writes in: ids in creation order), then the first fold
of the rollups (``rollups.fold``, timed) and ``VACUUM (ANALYZE)`` of every table.

**The measures** (each logged as it is taken):

1. table and index size per million events (``pg_relation_size``, ``pg_indexes_size``,
   ``pg_total_relation_size``);
2. every dashboard page and fragment (``dashboard.routes`` with 400-day ranges,
   ``dashboard.measure``): median and p95 of ``max(10, 10 × runs)`` samples after a warm-up;
   floor p95 < 300 ms. A download (a CSV export of a whole set: not a page, its whole time
   grows with the rows asked for) is judged on its first byte, its whole time and rows/s
   reported beside it;
3. ``tenant_usage`` of every tenant for the last 30 days and the last 365, and of the largest
   tenant for the last 365 (median of 3 each), and the ``billing-outbox usage --from --to
   --json`` command once for the year, for every tenant and with ``--tenant``, start-up
   included; floor: every tenant's year < 1 s;
4. drain core throughput (``bench/scale_drain.py``): 60,000 events drained with the table at
   10 million rows against the same in an empty schema; floor ≥ 0.8×;
5. ``billing-outbox tenants import`` of a 100,000-line CSV into an empty schema (all added)
   and again (all unchanged); floor < 60 s;
6. the product's prune (``webapp.outbox.retention.prune``) of the oldest 30 days, with a
   drain running beside it, then a month of new rows (the newest 30 days copied under new
   keys): size after, ``n_dead_tup``, ``last_autovacuum``;
7. the partitioned alternative (``bench/partitioning.py``) on a copy of the same rows.

The schemas are dropped at the end (and the bench database with them, by ``bench.run``).
"""

from __future__ import annotations

import csv
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import create_engine, text

from . import dashboard, scale_drain
from .common import ADMIN_URL, ROOT, BenchDatabase, Figure, Row, verdict

SECTION = "Scale: 10 million rows"
SHAPE = dashboard.Shape(days=400, tenants=100_000, mapped=99_950, named_unmapped=25,
                        unmapped_share=0.0005, skew=3.0, digits=6)
DRAIN_EVENTS = 60_000
DRAIN_RUNS = 3
IMPORT_LINES = 100_000
RETENTION_DAYS = 40
FLOOR_P95_MS = 300.0
SLOW_MS = 2000.0
SLOW_SAMPLES = 2
FLOOR_YEAR_S = 1.0
FLOOR_DRAIN_RATIO = 0.8
FLOOR_IMPORT_S = 60.0
#: The tenant with the most events (dashboard.Shape's skew puts it first).
LARGEST = "tenant-000000"


@dataclass
class ScaleResults:
    events: int
    runs: int
    figures: dict[str, Figure] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)
    table: list[Row] = field(default_factory=list)


def sizes(engine: Any, tables: tuple[str, ...] = ("stripe_usage_outbox",
                                                  "stripe_usage_attempts")) -> dict[str, Any]:
    """Rows and bytes (heap, indexes, total with TOAST) of each table."""
    out: dict[str, Any] = {}
    with engine.connect() as conn:
        for t in tables:
            n, heap, idx, total = conn.execute(text(
                f"SELECT (SELECT count(*) FROM {t}), pg_relation_size('{t}'), "
                f"pg_indexes_size('{t}'), pg_total_relation_size('{t}')")).one()
            out[t] = {"rows": int(n), "heap": int(heap), "indexes": int(idx),
                      "total": int(total)}
    return out


def mb(b: float) -> str:
    return f"{b / 2**20:,.0f} MB"


def size_note(s: dict[str, Any], per: int) -> str:
    """``heap X, indexes Y, total Z per million events``."""
    return ", ".join(f"{t}: {s[t]['rows']:,} rows, heap {mb(s[t]['heap'])}, indexes "
                     f"{mb(s[t]['indexes'])}, total {mb(s[t]['total'])} "
                     f"({mb(s[t]['total'] / per * 1e6)} per million events)" for t in s)


def dead_tuples(engine: Any) -> dict[str, Any]:
    with engine.connect() as conn:
        row = conn.execute(text(
            "SELECT n_live_tup, n_dead_tup, last_autovacuum, last_vacuum, autovacuum_count "
            "FROM pg_stat_user_tables WHERE relname = 'stripe_usage_outbox' "
            "AND schemaname = current_schema()")).one()
    return dict(row._mapping)


def run(db: BenchDatabase, *, events: int, runs: int, log: Any = print,
        partition: bool = True) -> ScaleResults:
    from webapp import create_app, services_of
    from webapp.config import Settings
    from webapp.models import utcnow
    from webapp.outbox import rollups
    from webapp.outbox.deferred import defer_unsendable

    res = ScaleResults(events=events, runs=runs)
    add = res.table.append
    schema, url = db.migrated_schema("scale")
    part: Any = None
    admin = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        log(f"scale: loading {events:,} outbox rows into {schema}")
        times = dashboard.load(url, events, lambda m: log(m.replace("dashboard", "scale")),
                               SHAPE)
        settings = Settings(database_url=url, stripe_api_key="sk_test_x")
        app = create_app({"TESTING": True}, settings=settings, start_drainer=False)
        engine = services_of(app).engine
        margin = rollups.fold_margin(settings.claim_timeout_seconds)
        t0 = time.perf_counter()
        rollups.fold(engine, now=utcnow(), margin=margin)
        fold_s = time.perf_counter() - t0
        # What a daily reconciliation leaves: every customer, meter and day of the last 35
        # compared, so Stripe's column has a figure on every row it reads.
        t0 = time.perf_counter()
        compared = seed_reconciled(engine, utcnow())
        seed_s = time.perf_counter() - t0
        log(f"scale: {compared:,} compared days kept (as a reconciliation keeps them) in "
            f"{seed_s:.0f} s")
        res.raw["reconciled"] = {"days": compared, "seconds": seed_s}
        # The deferrer's first turn, as the worker takes it within a minute of starting.
        t0 = time.perf_counter()
        parked = defer_unsendable(engine, now=utcnow())
        park_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        dashboard.maintain(engine, "VACUUM (ANALYZE)",
                           dashboard.LOADED_TABLES + dashboard.ROLLUP_TABLES
                           + ("reconciled_days", "reconciled_months",
                              "reconciled_meter_days"))
        vacuum_s = time.perf_counter() - t0
        counts = dashboard.table_counts(engine)
        res.raw.update(load_seconds=times, fold_seconds=fold_s, vacuum_seconds=vacuum_s,
                       counts=counts)
        total = counts["stripe_usage_outbox"]
        sent = counts.get("status:sent", 0)
        log(f"scale: loaded {counts}; fold {fold_s:.0f} s, vacuum {vacuum_s:.0f} s; "
            f"{parked:,} unmapped tenants' events put off in {park_s:.1f} s")
        res.raw["parked"] = {"events": parked, "seconds": park_s}
        add(Row(SECTION, f"load: {total:,} outbox rows ({sent / total:.1%} sent), "
                         f"{counts['stripe_usage_attempts']:,} attempts, "
                         f"{counts['tenants_with_events']:,} tenants with events × 2 meters, "
                         f"{SHAPE.days} days (set-based SQL, product indexes in place)",
                f"{sum(times.values()):.0f} s", "", "",
                ", ".join(f"{k} {v:.0f} s" for k, v in times.items())
                + f"; then the first fold {fold_s:.0f} s, VACUUM (ANALYZE) {vacuum_s:.0f} s; "
                f"the deferrer put off {parked:,} events of tenants without a customer in "
                f"{park_s:.1f} s"))
        s = sizes(engine)
        res.raw["sizes"] = s
        log(f"scale: sizes {s}")
        add(Row(SECTION, "table + indexes per million events", mb(
            s["stripe_usage_outbox"]["total"] / total * 1e6) + " outbox, " + mb(
            s["stripe_usage_attempts"]["total"] / total * 1e6) + " attempts", "", "",
            size_note(s, total)))

        if partition:
            from . import partitioning

            part = partitioning.Experiment(db, admin, source=schema, log=log)
            part.prepare()

        pages(res, app, engine, settings, runs, log)
        usage(res, engine, url, runs, log)
        drain(res, db, admin, engine, url, log)
        tenants_import(res, db, log)
        prune(res, admin, engine, url, log)
        if part is not None:
            res.table += part.measure(res.raw)
            res.raw["partition"] = part.raw
        engine.dispose()
    finally:
        if part is not None:
            part.close()
        admin.dispose()
        db.drop_schema(schema)
    return res


def pages(res: ScaleResults, app: Any, engine: Any, settings: Any, runs: int,
          log: Any) -> None:
    from webapp.models import utcnow
    from webapp.outbox.deferred import defer_unsendable
    from webapp.worker.report_writer import keep_quick_periods

    dashboard.make_users(engine)
    client = dashboard.signed_in_client(app)
    routes = dashboard.routes(engine, settings, SHAPE)
    # The long period's page and CSV read a prepared report: pressed once before sampling
    # (the first sum of the period at this size), and again after (warm).
    prepared = dashboard.prepare_reports(client, routes)
    # The usage reporter (a maintenance service of the worker and the in-app scheduler)
    # keeps the quick periods prepared at this size: run as it would be, before sampling and
    # between rounds when due (its time is not in any sample).
    t0 = time.perf_counter()
    made = keep_quick_periods(engine, now=utcnow())
    reporter_s = time.perf_counter() - t0
    log(f"scale: the usage reporter prepared {len(made)} reports in {reporter_s:.1f} s")
    res.table.append(Row(SECTION, "the usage reporter's run: the quick periods (this month, "
                                  "the last 7 and 30 days, last month) prepared as reports",
                         f"{reporter_s:.1f} s for {len(made)}", "", "",
                         "; ".join(f"{r.start}…{r.end}: {r.rows:,} rows in {r.seconds:.1f} s"
                                   for r in made) + "; again between rounds when 5 minutes "
                         "old (not timed in any sample)"))
    samples = max(10, 10 * runs)
    log(f"scale: sampling {len(routes)} routes {samples} times each")
    def maintenance() -> None:
        keep_quick_periods(engine, now=utcnow())
        defer_unsendable(engine, now=utcnow())

    figs = measure(client, routes, samples, log, between=maintenance)
    worst: list[tuple[float, float, str]] = []
    misses = []
    for r in routes:
        t = figs[dashboard.key(r)]
        med, p95 = t.ms.median, dashboard.p95(t.ms.values)
        worst.append((p95, med, dashboard.key(r)))
        if p95 >= FLOOR_P95_MS:
            misses.append(f"{dashboard.key(r)} p95 {p95:.0f} ms (median {med:.0f})")
        first = "first byte " if r.download else ""
        note = f"{len(t.ms.values)} samples"
        res.table.append(Row(SECTION, f"`GET {dashboard._short(r.path)}` {r.label} ({r.kind})",
                             f"{first}{med:.1f} ms; p95 {p95:.1f} ms",
                             f"p95 < {FLOOR_P95_MS:.0f} ms", verdict(p95 < FLOOR_P95_MS),
                             f"{note}; {t.download_note()}" if r.download else note))
    again = dashboard.prepare_reports(client, routes)
    for period, seconds in prepared.items():
        res.table.append(Row(SECTION, f"\"Prepare the report\" of every tenant, {period} "
                                      "(the button: a POST that sums the period and redirects)",
                             f"{seconds:.2f} s, then {again[period]:.2f} s", "", "",
                             "before sampling, then after; the page, fragment and CSV of "
                             "that period above read the report"))
    res.raw["report_seconds"] = {"before": prepared, "after": again}
    worst.sort(reverse=True)
    res.raw["pages_ms"] = {k: t.ms.values for k, t in figs.items()}
    res.raw["download_total_ms"] = {dashboard.key(r): figs[dashboard.key(r)].total_ms.values
                                    for r in routes if r.download}
    log(f"scale: worst p95 {worst[:5]}")
    res.table.append(Row(
        SECTION, f"every page and fragment ({len(routes)} routes, {samples} samples each)",
        f"worst p95 {worst[0][0]:.0f} ms ({worst[0][2]}), its median {worst[0][1]:.0f} ms",
        f"p95 < {FLOOR_P95_MS:.0f} ms", verdict(not misses),
        "misses: " + ("; ".join(misses) or "none")
        + "; a download (CSV export) is judged on its first byte",
        floor_name=f"scale: every page p95 < {FLOOR_P95_MS:.0f} ms at 10 million rows"))


def measure(client: Any, routes: list[dashboard.Route], samples: int,
            log: Any, between: Any = None) -> dict[str, dashboard.Timing]:
    """``dashboard.measure`` with one warm-up, except that a route whose warm-up took over
    ``SLOW_MS`` (a download: its whole file) gets ``SLOW_SAMPLES`` samples: at this scale a
    few pages take seconds, and sampling each of them ten times would take longer than
    everything else."""
    slow = set()
    for r in routes:
        if dashboard.sample(client, r).total_ms > SLOW_MS:
            slow.add(dashboard.key(r))
    log(f"scale: {len(slow)} slow routes (warm-up over {SLOW_MS:.0f} ms): {sorted(slow)}")
    timings = {dashboard.key(r): dashboard.Timing() for r in routes}
    for i in range(samples):
        if between is not None:
            between()
        for r in routes:
            if i < SLOW_SAMPLES or dashboard.key(r) not in slow:
                timings[dashboard.key(r)].add(dashboard.sample(client, r))
        log(f"scale: round {i + 1}/{samples}")
    return timings


def usage(res: ScaleResults, engine: Any, url: str, runs: int, log: Any) -> None:
    from webapp.models import utcnow
    from webapp.read.tenants import tenant_usage

    today = utcnow().date()
    for label, days in (("30 days", 30), ("a year (365 days)", 365)):
        start = today - timedelta(days=days - 1)
        f = Figure()
        n = 0
        for _ in range(max(3, runs)):
            t0 = time.perf_counter()
            found = tenant_usage(engine, start=start, end=today)
            f.add(time.perf_counter() - t0)
            n = len(found.rows)
        log(f"scale: tenant_usage {label}: {f.values} s, {n} rows")
        res.figures[f"usage {label}"] = f
        ok = f.median < FLOOR_YEAR_S
        res.table.append(Row(SECTION, f"`tenant_usage` over {label}, every tenant",
                             f"{f.median * 1000:,.0f} ms ({f.lo * 1000:,.0f}–"
                             f"{f.hi * 1000:,.0f})", f"< {FLOOR_YEAR_S:.0f} s", verdict(ok),
                             f"{n:,} (tenant, meter) rows; median of {len(f.values)}",
                             floor_name="scale: usage for a year < 1 s" if days == 365 else ""))
    start = today - timedelta(days=364)
    f = Figure()
    for _ in range(max(3, runs)):
        t0 = time.perf_counter()
        tenant_usage(engine, start=start, end=today, tenant_id=LARGEST)
        f.add(time.perf_counter() - t0)
    log(f"scale: tenant_usage a year, {LARGEST}: {f.values} s")
    res.figures["usage a year, one tenant"] = f
    res.table.append(Row(SECTION, f"`tenant_usage` over a year (365 days), one tenant "
                                  f"({LARGEST}, the largest)",
                         f"{f.median * 1000:,.0f} ms ({f.lo * 1000:,.0f}–{f.hi * 1000:,.0f})",
                         f"< {FLOOR_YEAR_S:.0f} s", verdict(f.median < FLOOR_YEAR_S),
                         f"median of {len(f.values)}"))
    server, least, n = year_parts(engine, start, today, runs)
    log(f"scale: every tenant's year in PostgreSQL alone: {server.values} s; the same {n:,} "
        f"rows already summed, read and built: {least.values} s")
    res.figures["usage a year, in PostgreSQL"] = server
    res.figures["usage a year, rows already summed"] = least
    res.table.append(Row(SECTION, "… every tenant's year: the statement in PostgreSQL alone "
                                  "(EXPLAIN ANALYZE: run whole, no row sent)",
                         f"{server.median * 1000:,.0f} ms ({server.lo * 1000:,.0f}–"
                         f"{server.hi * 1000:,.0f})", "", "", f"median of {len(server.values)}"))
    res.table.append(Row(SECTION, f"… every tenant's year: the least any statement can take, "
                                  f"the same {n:,} rows already summed (a temporary table), "
                                  "read and built as `tenant_usage` builds them",
                         f"{least.median * 1000:,.0f} ms ({least.lo * 1000:,.0f}–"
                         f"{least.hi * 1000:,.0f})", "", "",
                         f"median of {len(least.values)}; nothing summed"))
    env = cli_env(url)
    month = today - timedelta(days=29)
    walls = []
    for _ in range(max(5, runs)):
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "webapp", "usage", "--from",
                              month.isoformat(), "--to", today.isoformat(), "--json"],
                             env=env, cwd=ROOT, capture_output=True, timeout=600)
        walls.append(time.perf_counter() - t0)
    walls.sort()
    log(f"scale: usage CLI month, every tenant: {walls} s, exit {out.returncode}, "
        f"{len(out.stdout):,} bytes")
    res.raw["usage_cli_seconds month"] = walls
    res.table.append(Row(SECTION, "`billing-outbox usage --from … --to … --json` (30 days, "
                                  "every tenant, with Stripe's figure on every row; the whole "
                                  "command)", f"{walls[len(walls) // 2]:.2f} s "
                                  f"({walls[0]:.2f}–{walls[-1]:.2f})", "",
                         "" if out.returncode == 0 else "FAILED",
                         f"{len(out.stdout) / 2**20:.2f} MB of JSON; median of {len(walls)}"))
    for who, extra in (("every tenant", []), (f"{LARGEST}", ["--tenant", LARGEST])):
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "webapp", "usage", "--from",
                              start.isoformat(), "--to", today.isoformat(), "--json", *extra],
                             env=env, cwd=ROOT, capture_output=True, timeout=600)
        wall = time.perf_counter() - t0
        log(f"scale: usage CLI year, {who}: {wall:.2f} s, exit {out.returncode}, "
            f"{len(out.stdout):,} bytes {out.stderr[-300:]!r}")
        res.raw[f"usage_cli_seconds {who}"] = wall
        res.table.append(Row(SECTION, f"`billing-outbox usage --from … --to … --json"
                                      f"{' --tenant ' + LARGEST if extra else ''}` (a year, "
                                      f"{who}; the whole command: start-up, query, JSON)",
                             f"{wall:.2f} s", "", "" if out.returncode == 0 else "FAILED",
                             f"{len(out.stdout) / 2**20:.2f} MB of JSON; run once"))


def year_parts(engine: Any, start: Any, end: Any, runs: int) -> tuple[Figure, Figure, int]:
    """Where every tenant's ``tenant_usage`` over ``start``…``end`` goes: the statement in
    PostgreSQL alone (``EXPLAIN ANALYZE`` without per-node timing runs it whole and sends no
    row), and the least any statement giving the same rows can cost: the rows already summed
    (a temporary table made from the statement), read and built into ``UsageRow``s the way
    ``tenant_usage`` builds them. Returns both and the number of rows."""
    from webapp.read.tenants import usage_rows, usage_select
    from webapp.read.usage_sources import many_rows, per_row

    server, least = Figure(), Figure()
    with engine.connect() as conn, conn.begin():
        many_rows(conn)
        stmt = usage_select(conn, per_row(conn, start, end).subquery())
        sql = str(stmt.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))
        for _ in range(max(3, runs)):
            plan = conn.exec_driver_sql("EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) " + sql)
            server.add(plan.scalar_one()[0]["Execution Time"] / 1000)
        conn.exec_driver_sql("CREATE TEMPORARY TABLE year_answer ON COMMIT DROP AS " + sql)
        conn.exec_driver_sql("ANALYZE year_answer")
        n = 0
        for _ in range(max(3, runs)):
            t0 = time.perf_counter()
            n = len(usage_rows(conn.exec_driver_sql(
                'SELECT * FROM year_answer ORDER BY tenant_id COLLATE "C", meter COLLATE "C"')
                .all()))
            least.add(time.perf_counter() - t0)
    return server, least, n


def seed_reconciled(engine: Any, now: Any) -> int:
    """Keep, as a daily reconciliation does, a comparison of every customer, meter and UTC
    day of the last 35 with sent usage (Stripe agreeing), its months and its meters' days
    added up; how many days. Set-based, from the daily sent rollup."""
    first = (now - timedelta(days=35)).date().isoformat()
    with engine.begin() as conn:
        n = conn.execute(text(
            "INSERT INTO reconciled_days (stripe_customer_id, meter, day, formula, ours, "
            "stripe, compared_at, run_id) SELECT stripe_customer_id, meter, day, 'sum', "
            "sum(quantity), sum(quantity), :now, 0 FROM usage_sent_rollup WHERE day >= :first "
            "AND stripe_customer_id <> '' GROUP BY stripe_customer_id, meter, day"),
            {"now": now, "first": first}).rowcount
        conn.execute(text(
            "INSERT INTO reconciled_months (stripe_customer_id, meter, month, ours, stripe, "
            "days, compared_at) SELECT stripe_customer_id, meter, substr(day, 1, 7), sum(ours), "
            "sum(stripe), count(*), max(compared_at) FROM reconciled_days "
            "GROUP BY stripe_customer_id, meter, substr(day, 1, 7)"))
        conn.execute(text(
            "INSERT INTO reconciled_meter_days (meter, day, ours, stripe, customer_days, "
            "compared_at) SELECT meter, day, sum(ours), sum(stripe), count(*), "
            "max(compared_at) FROM reconciled_days GROUP BY meter, day"))
    return int(n or 0)


def cli_env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OUTBOX_", "STRIPE_", "DATABASE_URL", "DRAINER_"))}
    env.update(DATABASE_URL=url, SECRET_KEY=secrets.token_urlsafe(48),
               STRIPE_API_KEY="sk_test_x")
    return env


def drain(res: ScaleResults, db: BenchDatabase, admin: Any, engine: Any, url: str,
          log: Any) -> None:
    from webapp.db import make_engine
    from webapp.models import utcnow

    figs: dict[str, list[dict[str, Any]]] = {"empty": [], "full": [], "empty warm-up": [],
                                             "full warm-up": []}
    empty_schema, empty_url = db.migrated_schema("drain_empty")
    try:
        empty = make_engine(empty_url)
        scale_drain.map_drain_tenants(empty, SHAPE.digits)
        # Alternate, so a burst of load elsewhere does not fall on one side only. The first
        # pair warms the caches and is not counted: the first pass over the 10 M table's
        # indexes after the load ran at 0.39-0.58x in every run so far, the next ones at
        # 0.79-0.97x; the floor is about the drain's steady rate. The cold pass is reported.
        for i in range(-1, DRAIN_RUNS):
            for side, eng, u in (("empty", empty, empty_url), ("full", engine, url)):
                mark, keys = scale_drain.insert_batch(eng, DRAIN_EVENTS, SHAPE.digits,
                                                      utcnow(), f"{side}{i}")
                fig = scale_drain.drain_batch(u, admin, mark, keys)
                log(f"scale: drain {side} #{i}{' (warm-up, not counted)' if i < 0 else ''}: "
                    f"{fig}")
                figs[side if i >= 0 else f"{side} warm-up"].append(fig)
        empty.dispose()
    finally:
        db.drop_schema(empty_schema)
    res.raw["drain"] = figs
    e = statistics.median(f["rate"] for f in figs["empty"])
    full = statistics.median(f["rate"] for f in figs["full"])
    ratios = [b["rate"] / a["rate"] for a, b in zip(figs["empty"], figs["full"], strict=True)]
    ratio = statistics.median(ratios)
    cold = figs["full warm-up"][0]["rate"] / figs["empty warm-up"][0]["rate"]
    res.raw["drain_empty_rate"] = e
    res.table.append(Row(
        SECTION, f"drain core: {DRAIN_EVENTS:,} events, no-op gateway, batch 1000, 1 process: "
                 "table at 10 million rows vs an empty table",
        f"{full:,.0f} /s vs {e:,.0f} /s: {ratio:.2f}× "
        f"(runs {', '.join(f'{r:.2f}' for r in ratios)})",
        f"≥ {FLOOR_DRAIN_RATIO}×", verdict(ratio >= FLOOR_DRAIN_RATIO),
        "longest pass (claim + calls + outcomes of 1,000) "
        f"{max(f['max_pass_ms'] for f in figs['full'])} ms at 10M, "
        f"{max(f['max_pass_ms'] for f in figs['empty'])} ms empty; {DRAIN_RUNS} runs each, "
        "alternated, after a pair not counted (the first, cold pass over the 10 M table's "
        f"indexes: {cold:.2f}×, {figs['full warm-up'][0]['rate']:,.0f} /s vs "
        f"{figs['empty warm-up'][0]['rate']:,.0f} /s)",
        floor_name="scale: drain at 10M ≥ 0.8× the empty table"))


def tenants_import(res: ScaleResults, db: BenchDatabase, log: Any) -> None:
    schema, url = db.migrated_schema("import")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "tenants.csv")
            with open(path, "w", newline="") as fh:
                w = csv.writer(fh)
                w.writerow(["tenant_id", "stripe_customer_id", "name"])
                for i in range(IMPORT_LINES):
                    w.writerow([f"acct-{i:06d}", f"cus_Imp{i:08d}", f"Customer {i}"])
            walls = []
            for label in ("into an empty mapping (all added)", "again (all unchanged)"):
                t0 = time.perf_counter()
                # Without a key: this times the import itself, not Stripe answering 100,000
                # customer lookups (with a key each new customer is asked about once).
                env = {k: v for k, v in cli_env(url).items() if k != "STRIPE_API_KEY"}
                out = subprocess.run([sys.executable, "-m", "webapp", "tenants", "import",
                                      path], env=env, cwd=ROOT, capture_output=True,
                                     text=True, timeout=900)
                wall = time.perf_counter() - t0
                walls.append(wall)
                log(f"scale: tenants import {label}: {wall:.1f} s: {out.stdout.strip()} "
                    f"{out.stderr[-300:]}")
                ok = out.returncode == 0 and wall < FLOOR_IMPORT_S
                res.table.append(Row(
                    SECTION, f"`billing-outbox tenants import` of {IMPORT_LINES:,} lines, "
                             f"{label}", f"{wall:.1f} s", f"< {FLOOR_IMPORT_S:.0f} s",
                    verdict(ok), out.stdout.strip().replace("|", "/")[:200]
                    if out.returncode == 0 else f"exit {out.returncode}: {out.stderr[-200:]}",
                    floor_name="scale: tenants import of 100,000 lines < 60 s"
                    if len(walls) == 1 else ""))
            res.raw["import_seconds"] = walls
    finally:
        db.drop_schema(schema)


def prune(res: ScaleResults, admin: Any, engine: Any, url: str, log: Any) -> None:
    """The product's prune of the oldest 30 days, a drain beside it; then a month of churn."""
    from webapp.models import utcnow
    from webapp.outbox import retention

    with engine.connect() as conn:
        start = conn.execute(text("SELECT min(created_at) FROM stripe_usage_outbox")).scalar_one()
        month = conn.execute(text(
            "SELECT count(*) FROM stripe_usage_outbox WHERE updated_at < :t"),
            {"t": start + timedelta(days=30)}).scalar_one()
    as_of = start + timedelta(days=30 + RETENTION_DAYS)
    mark, keys = scale_drain.insert_batch(engine, DRAIN_EVENTS, SHAPE.digits, utcnow(), "prune")

    def op() -> Any:
        return retention.prune(engine, now=as_of, retention_days=RETENTION_DAYS,
                               batch_size=retention.BATCH_SIZE, dry_run=False)

    fig = scale_drain.drain_batch(url, admin, mark, keys, during=op, lead=0.3)
    result = fig.pop("op_result")
    pruned = int(getattr(result, "pruned", 0) or 0)
    secs = fig["op_seconds"]
    log(f"scale: prune: {pruned:,} rows of {month:,} changed in the oldest 30 days, "
        f"{secs:.1f} s; drain beside it {fig}")
    res.raw["prune"] = {"pruned": pruned, "rows_in_month": month, **fig}
    empty_rate = res.raw.get("drain_empty_rate") or 0
    res.table.append(Row(
        SECTION, "prune of the oldest 30 days (`retention.prune`, batch "
                 f"{retention.BATCH_SIZE:,}, retention {RETENTION_DAYS} days)",
        f"{secs:.1f} s for {pruned:,} rows: {pruned / max(secs, 1e-9):,.0f} rows/s",
        "", "FAILED" if fig["op_error"] else "",
        f"{month:,} rows last changed in those 30 days (dead and rejected ones stay); "
        + (fig["op_error"] or "")))
    res.table.append(Row(
        SECTION, f"drain core while the prune runs ({DRAIN_EVENTS:,} events)",
        f"{fig['rate']:,.0f} /s ({fig['rate'] / empty_rate:.2f}× the empty table)"
        if empty_rate else f"{fig['rate']:,.0f} /s", "", "",
        f"{fig['overlap']:.0%} of the drain overlapped the prune; longest pass "
        f"{fig['max_pass_ms']} ms (median {fig['median_pass_ms']} ms); oldest worker "
        f"transaction seen {fig['max_xact_ms']:.0f} ms; lock waits in "
        f"{fig['lock_wait_samples']} of {fig['samples']} samples"))
    churn(res, engine, "delete", log)


CHURN_COPY = """
INSERT INTO stripe_usage_outbox ({cols}, idempotency_key)
SELECT {cols}, idempotency_key || '/churn'
FROM stripe_usage_outbox
WHERE created_at >= (SELECT max(created_at) FROM stripe_usage_outbox
                     WHERE idempotency_key NOT LIKE 'drain-bench:%') - interval '30 days'
  AND idempotency_key NOT LIKE 'drain-bench:%' AND status <> 'processing'
ORDER BY id
"""


def churn_columns(engine: Any) -> str:
    with engine.connect() as conn:
        cols = [r[0] for r in conn.execute(text(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = "
            "current_schema() AND table_name = 'stripe_usage_outbox' "
            "ORDER BY ordinal_position"))]
    return ", ".join(c for c in cols if c not in ("id", "idempotency_key",
                                                  "stripe_identifier"))


def churn(res: ScaleResults, engine: Any, design: str, log: Any) -> dict[str, Any]:
    """A month of new rows (the newest 30 days again, new keys) after the month's removal:
    sizes and dead tuples right after, before any VACUUM."""
    t0 = time.perf_counter()
    with engine.begin() as conn:
        n = conn.execute(text(CHURN_COPY.format(cols=churn_columns(engine)))).rowcount
    secs = time.perf_counter() - t0
    with engine.connect() as conn:
        conn.execute(text("ANALYZE stripe_usage_outbox"))
        conn.commit()
    s = sizes(engine, ("stripe_usage_outbox",))["stripe_usage_outbox"]
    dead = dead_tuples(engine) if design == "delete" else {}
    out = {"inserted": n, "seconds": secs, "size": s, "stats": dead}
    log(f"scale: churn ({design}): {out}")
    res.raw[f"churn_{design}"] = out
    if design == "delete":
        res.table.append(Row(
            SECTION, "delete design after a month of churn (a month pruned, "
                     f"{n:,} new rows)", f"outbox {mb(s['total'])} (heap {mb(s['heap'])}, "
                                        f"indexes {mb(s['indexes'])})", "", "",
            f"n_dead_tup {dead['n_dead_tup']:,}, n_live_tup {dead['n_live_tup']:,}, "
            f"last_autovacuum {dead['last_autovacuum'] or 'never'} (autovacuum "
            "is off on this cluster), inserted in " f"{secs:.0f} s"))
    return out
