"""``python -m bench.profile drain|enqueue|worker``: where the time goes, for a missed floor.

* ``drain``: the 1-process drain core of ``bench.drain`` in this process, as sequential
  ``drain_once`` passes (the worker loop overlaps them; sequential ones split cleanly): wall
  time split by SQL statement (SQLAlchemy cursor events) and Python; a pyinstrument profile
  (flat self time and the call tree); ``EXPLAIN (ANALYZE, BUFFERS)`` of the claim and
  completion statements as the drainer sends them; and the table's index and HOT-update
  counts.
* ``enqueue``: pyinstrument of ``bench.enqueue``'s enqueue transaction on PostgreSQL and on
  SQLite.
* ``worker``: py-spy samples of a real ``billing-outbox worker`` during the end-to-end drain
  (fake Stripe, 50 ms), summed by function (self and inclusive) and by package.

Needs the bench tools: ``.venv/bin/pip install pyinstrument py-spy``. Output goes to stdout
and to ``bench/results/profile-<what>-<stamp>.txt``.
"""

from __future__ import annotations

import argparse
import collections
import io
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import redirect_stdout
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import event, text

from .common import METERS, RESULTS_DIR, BenchDatabase, copied_keys, make_template


def _pyinstrument_report(profiler: Any, limit_tree: int = 70) -> str:
    from pyinstrument.renderers import ConsoleRenderer

    session = profiler.last_session
    flat = ConsoleRenderer(flat=True, unicode=False, color=False).render(session)
    tree = ConsoleRenderer(unicode=False, color=False, time="percent_of_total",
                           processor_options={"filter_threshold": 0.02}).render(session)
    flat_lines = [ln for ln in flat.splitlines() if ln.strip()][:32]
    tree_lines = [ln for ln in tree.splitlines() if ln.strip()][:limit_tree]
    return ("pyinstrument, flat (self time):\n" + "\n".join(flat_lines)
            + "\n\npyinstrument, call tree (% of total, frames ≥ 2%):\n" + "\n".join(tree_lines))


# -- drain -----------------------------------------------------------------------------------------

def profile_drain(db: BenchDatabase, events: int) -> None:
    from pyinstrument import Profiler

    from webapp.db import make_engine
    from webapp.worker import Drainer

    from .drain import TENANTS, NoopGateway, drain_settings

    template, keys = make_template(db, events, TENANTS, ("api_requests",))
    try:
        # 1. SQL vs Python.
        with db.outbox_schema("prof", template) as url:
            engine = make_engine(url)
            spent: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
            captured: dict[str, tuple[str, Any]] = {}

            @event.listens_for(engine, "before_cursor_execute")
            def _before(conn: Any, cursor: Any, stmt: str, params: Any, ctx: Any,
                        many: bool) -> None:
                conn.info["t0"] = time.perf_counter()
                kind = _kind(stmt)
                if kind in ("claim", "complete") and kind not in captured and not many:
                    captured[kind] = (stmt, params)

            @event.listens_for(engine, "after_cursor_execute")
            def _after(conn: Any, cursor: Any, stmt: str, params: Any, ctx: Any,
                       many: bool) -> None:
                rec = spent[_kind(stmt)]
                rec[0] += 1
                rec[1] += time.perf_counter() - conn.info["t0"]

            gateway = NoopGateway()
            drainer = Drainer(engine, drain_settings(url), gateway, check_meters=False)
            t0 = time.perf_counter()
            while drainer.drain_once().claimed:
                pass
            wall = time.perf_counter() - t0
            sql = sum(v[1] for v in spent.values())
            print(f"drain of {len(gateway.seen):,} events in one process: {wall:.2f} s "
                  f"= {len(gateway.seen) / wall:,.0f} events/s")
            print(f"  SQL (client-side wall, send to result): {sql:.2f} s "
                  f"({sql / wall:.0%}); Python and the rest: {wall - sql:.2f} s "
                  f"({(wall - sql) / wall:.0%})")
            for kind, (count, secs) in sorted(spent.items(), key=lambda kv: -kv[1][1]):
                print(f"  {secs:7.3f} s {secs / wall:5.0%}  {count:5d}×  {kind}")
            with engine.connect() as conn:
                upd, hot = conn.execute(text(
                    "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                    "WHERE relname = 'stripe_usage_outbox' "
                    "AND schemaname = current_schema()")).one()
                indexes = conn.execute(text(
                    "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = "
                    "'stripe_usage_outbox' AND schemaname = current_schema()")).all()
                att_idx = conn.execute(text(
                    "SELECT count(*) FROM pg_indexes WHERE tablename = "
                    "'stripe_usage_attempts' AND schemaname = current_schema()")).scalar()
            print(f"\nrow updates on stripe_usage_outbox: {upd:,}, of which HOT: {hot:,} "
                  "(statistics may lag a little)")
            print(f"indexes on stripe_usage_outbox ({len(indexes)}), each written by every "
                  f"non-HOT update:")
            for name, definition in indexes:
                print(f"  {name}: {definition.split(' USING ')[1]}")
            print(f"indexes on stripe_usage_attempts: {att_idx} (one row inserted per event)")
            drainer.close()
            engine.dispose()

        # 2. EXPLAIN of the statements as sent, on a fresh copy with 3 batches drained.
        with db.outbox_schema("prof", template) as url:
            engine = make_engine(url)
            captured.clear()
            listener = _capture_into(captured)
            event.listen(engine, "before_cursor_execute", listener)
            drainer = Drainer(engine, drain_settings(url), NoopGateway(),
                              check_meters=False)
            for _ in range(3):
                captured.pop("claim", None)
                captured.pop("complete", None)
                drainer.drain_once()
            captured.pop("claim", None)
            captured.pop("complete", None)
            event.remove(engine, "before_cursor_execute", listener)
            # Capture the 4th batch's statements, then EXPLAIN them in a rolled-back
            # transaction (the completion first needs the claim it completes).
            event.listen(engine, "before_cursor_execute", listener)
            drainer.drain_once()
            event.remove(engine, "before_cursor_execute", listener)
            raw = engine.raw_connection()
            try:
                cur = raw.cursor()
                for kind in ("claim", "complete"):
                    if kind not in captured:
                        continue
                    stmt, params = captured[kind]
                    if kind == "complete":
                        # Put the batch back in 'processing' under its token to replay it.
                        cur.execute("UPDATE stripe_usage_outbox SET status = 'processing', "
                                    "claim_token = %(t)s WHERE id = ANY(%(ids)s)",
                                    {"t": params["claim_token_1"],
                                     "ids": [v for k, v in params.items()
                                             if k.startswith("id_1")]})
                    cur.execute("EXPLAIN (ANALYZE, BUFFERS, WAL) " + stmt, params)
                    print(f"\nEXPLAIN (ANALYZE, BUFFERS, WAL) of the {kind} statement "
                          "(batch 4):")
                    print("  " + " ".join(stmt.split())[:400] + " …")
                    for (line,) in cur.fetchall():
                        print("    " + line)
                # The drainer writes one attempts row per event by binary COPY; the
                # same 1,000 rows in one statement show what each row costs the server,
                # index maintenance included.
                cur.execute(
                    "EXPLAIN (ANALYZE, WAL) INSERT INTO stripe_usage_attempts (event_id, "
                    "attempted_at, duration_ms, worker, claim_token, idempotency_key, outcome, "
                    "counted, http_status, applied) SELECT id, now(), 0, 'bench', claim_token, "
                    "idempotency_key, 'delivered', true, 200, true FROM stripe_usage_outbox "
                    "WHERE status = 'processing'")
                print("\nEXPLAIN (ANALYZE, WAL) of 1,000 attempts rows inserted in one "
                      "statement (the drainer uses one binary COPY of 1,000 rows):")
                for (line,) in cur.fetchall():
                    print("    " + line)
                raw.rollback()
            finally:
                raw.close()
            drainer.close()
            engine.dispose()

        # 3. pyinstrument.
        with db.outbox_schema("prof", template) as url:
            engine = make_engine(url)
            drainer = Drainer(engine, drain_settings(url), NoopGateway(),
                              check_meters=False)
            profiler = Profiler(interval=0.0005)
            profiler.start()
            while drainer.drain_once().claimed:
                pass
            profiler.stop()
            print()
            print(_pyinstrument_report(profiler))
            drainer.close()
            engine.dispose()
    finally:
        db.drop_schema(template)


def _capture_into(captured: dict[str, tuple[str, Any]]) -> Callable[..., None]:
    def listener(conn: Any, cursor: Any, stmt: str, params: Any, ctx: Any, many: bool) -> None:
        kind = _kind(stmt)
        if kind in ("claim", "complete") and not many and kind not in captured:
            captured[kind] = (stmt, params)
    return listener


def _kind(stmt: str) -> str:
    s = " ".join(stmt.split())
    if s.startswith("WITH picked"):
        return "claim"
    if s.startswith("UPDATE stripe_usage_outbox SET status=%(status)s::VARCHAR, sent_at"):
        return "complete"
    if s.startswith("INSERT INTO stripe_usage_attempts"):
        return "insert attempts"
    if "pg_try_advisory_lock" in s:
        return "lane locks: try"
    if "pg_advisory_unlock" in s:
        return "lane locks: unlock"
    if s.startswith("SELECT outbox_control"):
        return "pause state"
    if s.startswith("UPDATE stripe_usage_outbox") and "processing_deadline_at <" in s:
        return "rescue expired"
    if s.startswith("UPDATE stripe_usage_outbox"):
        return "complete" if "sent_at" in s else "update (other)"
    return s[:60]


# -- enqueue ---------------------------------------------------------------------------------------

def profile_enqueue(db: BenchDatabase, n: int) -> None:
    from pyinstrument import Profiler

    from webapp.db import make_engine
    from webapp.migrate import upgrade

    from .enqueue import _Base, tx_bare, tx_enqueue

    def run(engine: Any, label: str) -> None:
        _Base.metadata.create_all(engine)
        for i in range(50):
            tx_bare(engine, i)
            tx_enqueue(engine, 100 + i)
        t0 = time.perf_counter()
        for i in range(n):
            tx_bare(engine, 10_000 + i)
        bare = time.perf_counter() - t0
        profiler = Profiler(interval=0.0002)
        profiler.start()
        t0 = time.perf_counter()
        for i in range(n):
            tx_enqueue(engine, 100_000 + i)
        with_enqueue = time.perf_counter() - t0
        profiler.stop()
        print(f"\n=== {label}: {n:,} transactions: bare {bare / n * 1000:.3f} ms/tx, with "
              f"enqueue_usage {with_enqueue / n * 1000:.3f} ms/tx "
              f"(×{with_enqueue / bare:.2f}; the profile below includes its own overhead)")
        print(_pyinstrument_report(profiler, limit_tree=60))

    with db.outbox_schema("prof") as url:
        engine = make_engine(url, pool_pre_ping=False)
        try:
            run(engine, "PostgreSQL")
        finally:
            engine.dispose()
    with tempfile.TemporaryDirectory(prefix="bench-sqlite-") as tmp:
        engine = make_engine(f"sqlite:///{Path(tmp) / 'outbox.sqlite3'}")
        try:
            upgrade(engine)
            run(engine, "SQLite")
        finally:
            engine.dispose()


# -- worker ----------------------------------------------------------------------------------------

def profile_worker(db: BenchDatabase, events: int, concurrency: int) -> None:
    from . import e2e

    template, keys = make_template(db, events, e2e.TENANTS, METERS)
    expected = copied_keys(keys, 1)
    out = Path(tempfile.mkdtemp(prefix="bench-pyspy-")) / "worker.raw"
    spy: list[subprocess.Popen[bytes]] = []

    def attach(pid: int) -> Callable[[], None]:
        spy.append(subprocess.Popen(
            [str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(pid),
             "--format", "raw", "--rate", "250", "--gil", "--nonblocking", "--output",
             str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        time.sleep(0.5)

        def detach() -> None:
            spy[0].send_signal(signal.SIGINT)
            spy[0].wait(timeout=60)
        return detach

    try:
        with e2e.fake_stripe(e2e.LATENCY) as fake, db.outbox_schema("prof", template) as url:
            env = e2e.worker_env(url, fake.base_url, OUTBOX_CONCURRENCY=str(concurrency),
                                 OUTBOX_BATCH_SIZE=str(e2e.BATCH),
                                 STRIPE_MAX_REQUESTS_PER_SECOND=str(e2e.MAX_RPS))
            r = e2e.drain_with_worker(url, fake, expected, env=env, label="profile",
                                      attach=attach)
    finally:
        db.drop_schema(template)
    print(f"worker, OUTBOX_CONCURRENCY={concurrency}, {events:,} events at "
          f"{e2e.LATENCY * 1000:.0f} ms: {r['rate']:,.0f} events/s, "
          f"{r['cpu_per_1000']:.2f} CPU s per 1,000 events, peak RSS {r['hwm_mb']:.0f} MB")
    if not out.exists():
        err = spy[0].stderr.read().decode() if spy and spy[0].stderr else ""
        print(f"py-spy wrote nothing: {err}")
        return
    print(_summarize_pyspy(out.read_text()))


_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^():]+)(?::\d+)?\)$")


def _summarize_pyspy(raw: str, top: int = 30) -> str:
    self_t: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    pkg: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        count = int(count_s)
        frames = [_frame_name(f) for f in stack.split(";")]
        total += count
        self_t[frames[-1]] += count
        for f in set(frames):
            incl[f] += count
        pkg[_package(stack.split(";")[-1])] += count
    if not total:
        return "py-spy: no samples"
    buf = io.StringIO()
    with redirect_stdout(buf):
        print(f"\npy-spy --gil: {total:,} samples of the thread holding the GIL (CPU in Python)")
        print("\nself time by package (the frame executing when sampled):")
        for name, c in pkg.most_common(15):
            print(f"  {c / total:6.1%}  {name}")
        print(f"\ntop {top} functions by self time:")
        for name, c in self_t.most_common(top):
            print(f"  {c / total:6.1%}  {name}")
        print(f"\ntop {top} functions by inclusive time:")
        for name, c in incl.most_common(top):
            print(f"  {c / total:6.1%}  {name}")
    return buf.getvalue()


def _frame_name(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    return f"{m.group('func')} ({m.group('file')})"


def _package(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    path = m.group("file") if m else frame
    for marker in ("site-packages/", "lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
    head = path.split("/")[0]
    if head.endswith(".py"):
        head = head[:-3]
    return head or path


# -- entry point -----------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("drain", "enqueue", "worker"))
    p.add_argument("--events", type=int, default=None)
    p.add_argument("--concurrency", type=int, default=64)
    args = p.parse_args(argv)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    db = BenchDatabase().create()
    try:
        with redirect_stdout(buf):
            if args.what == "drain":
                profile_drain(db, args.events or 20_000)
            elif args.what == "enqueue":
                profile_enqueue(db, args.events or 2_000)
            else:
                profile_worker(db, args.events or 10_000, args.concurrency)
    finally:
        db.drop()
        text_out = buf.getvalue()
        print(text_out, end="")
        path = RESULTS_DIR / f"profile-{args.what}-{stamp}.txt"
        path.write_text(text_out)
        print(f"(written to {path})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
