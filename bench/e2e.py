"""End to end through the real SDK: one ``billing-outbox worker`` process (``python -m webapp
worker``) sends to the project's fake Stripe, itself a separate process
(``python -m tests.support.fake_stripe``) answering each call after a fixed latency.

Per run: a fresh schema gets 200 tenants × 2 meters and 10,000 events (enqueued once by the
real ``enqueue_usage`` and copied per run; a setting whose ceiling, concurrency / latency, is
under the floor drains the first quarter: see ``SLOW_SHARE``); sending is paused
(``operations.pause``, the CLI's ``pause``) while the worker starts, so start-up is neither
timed nor charged; then sending is resumed and the worker drains.

* events/s = events / (last ``sent_at`` − first ``first_attempt_at``), both written by the
  worker: from its first claim to its last recorded outcome;
* lane overlaps = the fake's count of calls that started while another call of the same
  (customer, meter) was in flight;
* CPU s per 1,000 events = the worker's utime + stime (/proc/<pid>/stat, all threads) from the
  resume to the last ``sent``, per 1,000 events.

Every run checks that the fake accepted each identifier exactly once, that it saw exactly one
call per event, that every row is ``sent``, and that the worker exits 0 on SIGTERM.
"""

from __future__ import annotations

import ast
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import text

from .common import (
    METERS,
    RESULTS_DIR,
    ROOT,
    TEST_API_KEY,
    BenchDatabase,
    BenchFailure,
    Row,
    SectionResults,
    busy_fraction,
    check_exactly_once,
    copied_keys,
    machine_cpu_times,
    make_template,
    proc_cpu_seconds,
    proc_status_kb,
    verdict,
    wait_until,
)

TENANTS = 200
LATENCY = 0.05
BATCH = 500
CONCURRENCIES = (8, 32, 64)
#: Several workers on one database: this many processes at ``FLEET_CONCURRENCY`` each, beside
#: one process at the same setting in the same run (the lanes are split by shards).
FLEET_PROCESSES = 2
FLEET_CONCURRENCY = 32
#: A setting whose ceiling (concurrency / latency) is below the floor drains only this share of
#: the events: its rate is fixed by Little's law (8 / 0.05 s = 160/s) and 10,000 events would
#: spend a fifth of the 15-minute budget to show the same figure.
SLOW_SHARE = 4
MAX_RPS = 1000
FLOOR_RATE = 500
#: ``STRIPE_METER_EVENT_API=v2_stream`` rows, beside v1's in the same run against the same fake:
#: one worker and ``FLEET_PROCESSES``, at this concurrency, with the batch size the mode gives by
#: default (2,000 events) and its live-mode default request rate set by hand (a test-mode key's
#: default stays within the sandbox's 25 requests/s).
STREAM_CONCURRENCY = 8
STREAM_REQUESTS_PER_SECOND = 100
STREAM_FLOOR_RATE = 5000


# -- the fake Stripe, as a process of its own ------------------------------------------------------

class FakeStripeProcess:
    def __init__(self, latency: float, meters: Sequence[str] = METERS) -> None:
        self.latency = latency
        self.meters = meters
        self.proc: subprocess.Popen[str] | None = None
        self.base_url = ""
        self.meter_events_url = ""

    def start(self) -> FakeStripeProcess:
        # Streams on a port of their own, as Stripe serves them on a host of its own: the
        # v2_stream rows then prove STRIPE_METER_EVENTS_BASE is where they go.
        args = [sys.executable, "-m", "tests.support.fake_stripe", "--port", "0",
                "--latency", str(self.latency), "--separate-streams"]
        for m in self.meters:
            args += ["--meter", m]
        self.proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith("READY "):
            self.stop()
            raise BenchFailure(f"fake Stripe did not start: {line!r}")
        self.base_url, self.meter_events_url = line.split()[1:3]
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def _call(self, method: str, name: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body or {}).encode() if method == "POST" else None
        req = urllib.request.Request(f"{self.base_url}/_fake/{name}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:  # loopback control endpoint
            return json.loads(resp.read())

    def reset(self) -> None:
        self._call("POST", "reset")

    def state(self) -> dict[str, Any]:
        return self._call("GET", "state")  # type: ignore[no-any-return]


@contextmanager
def fake_stripe(latency: float) -> Iterator[FakeStripeProcess]:
    fake = FakeStripeProcess(latency).start()
    try:
        yield fake
    finally:
        fake.stop()


# -- one worker drain ------------------------------------------------------------------------------

def worker_env(url: str, api_base: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OUTBOX_", "STRIPE_", "DATABASE_", "DRAINER_"))}
    env.update(DATABASE_URL=url, SECRET_KEY=secrets.token_urlsafe(48), STRIPE_API_KEY=TEST_API_KEY,
               STRIPE_API_BASE=api_base, PYTHONUNBUFFERED="1",
               # the drained: lines, read back for the releases
               LOG_LEVEL="INFO", LOG_FORMAT="text")
    env.update(extra)
    return env


WORKER = [sys.executable, "-m", "webapp", "worker"]          # billing-outbox worker
NOOP_WORKER = [sys.executable, "-m", "bench.noop_worker"]    # the same, no-op gateway


def drain_with_worker(url: str, fake: FakeStripeProcess | None, expected: list[str], *,
                      env: dict[str, str], label: str, command: list[str] = WORKER,
                      attach: Callable[[int], Callable[[], None]] | None = None,
                      processes: int = 1, stream: bool = False) -> dict[str, Any]:
    """Pause, start ``processes`` workers, resume, wait until every event is sent, stop them.
    Returns rate, CPU (all workers), peak RSS (the largest), events released (claimed, then
    put back because another process held their lane) and the fake's counters; raises
    ``BenchFailure`` on any broken guarantee. Without ``fake``, ``command`` is
    ``NOOP_WORKER`` (one process) and the identifiers it was handed are checked instead of
    the fake's. ``attach(pid)`` (a profiler) is called at the resume; the function it
    returns, once every event is sent. ``stream``: the workers send v2 stream requests (no v1
    call is expected, and no identifier may reach the stream twice)."""
    from webapp.db import make_engine
    from webapp.models import utcnow
    from webapp.outbox import operations

    n = len(expected)
    engine = make_engine(url)
    logs = RESULTS_DIR / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stem = f"worker-{label}-{os.getpid()}-{int(time.time() * 1000)}"
    log_paths = [logs / f"{stem}-{i}.log" for i in range(processes)]
    log_path = log_paths[0]
    seen_path = log_path.with_suffix(".seen")
    env = dict(env, BENCH_SEEN_PATH=str(seen_path))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        if fake is not None:
            fake.reset()
        operations.pause(engine, actor="bench", reason="bench: worker starting", now=utcnow())
        for path in log_paths:
            with open(path, "wb") as out:
                procs.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=out,
                                              stderr=subprocess.STDOUT))
        for proc, path in zip(procs, log_paths, strict=True):
            wait_until(lambda p=proc, lp=path: p.poll() is not None
                       or b"started" in lp.read_bytes(), 60,
                       f"the worker to start (log: {path})")
            if proc.poll() is not None:
                raise BenchFailure(f"worker exited with {proc.returncode} at start; see {path}")
        time.sleep(0.5 if processes == 1 else 3.0)  # paused passes (several: a shard split)
        proc = procs[0]
        detach = attach(proc.pid) if attach is not None else None
        cpu0 = sum(proc_cpu_seconds(p.pid) for p in procs)
        fake_cpu0 = proc_cpu_seconds(fake.pid) if fake is not None else 0.0
        machine0 = machine_cpu_times()
        operations.resume(engine, actor="bench", now=utcnow())

        def progress() -> bool:
            for p, lp in zip(procs, log_paths, strict=True):
                if p.poll() is not None:
                    raise BenchFailure(f"worker exited with {p.returncode} while draining; "
                                       f"see {lp}")
            with engine.connect() as conn:
                sent, bad = conn.execute(text(
                    "SELECT count(*) FILTER (WHERE status = 'sent'), "
                    "count(*) FILTER (WHERE status IN ('dead', 'retrying')) "
                    "FROM stripe_usage_outbox")).one()
            if bad:
                raise BenchFailure(f"{label}: {bad} events dead or retrying; see {log_path}")
            return bool(sent == n)

        wait_until(progress, 60 + n / 20, f"{n} events sent by the worker", interval=0.1)
        cpu1 = sum(proc_cpu_seconds(p.pid) for p in procs)
        fake_cpu1 = proc_cpu_seconds(fake.pid) if fake is not None else 0.0
        machine1 = machine_cpu_times()
        if detach is not None:
            detach()
        hwm_kb = max(proc_status_kb(p.pid, "VmHWM") for p in procs)
        rss_kb = max(proc_status_kb(p.pid, "VmRSS") for p in procs)
        threads = proc_status_kb(proc.pid, "Threads")
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p, lp in zip(procs, log_paths, strict=True):
            try:
                code = p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                raise BenchFailure(f"{label}: a worker did not stop within 60 s of SIGTERM") \
                    from None
            if code != 0:
                raise BenchFailure(f"{label}: a worker exited {code} on SIGTERM; see {lp}")
        with engine.connect() as conn:
            first, last, attempts = conn.execute(text(
                "SELECT min(first_attempt_at), max(sent_at), "
                "(SELECT count(*) FROM stripe_usage_attempts) FROM stripe_usage_outbox")).one()
        state = fake.state() if fake is not None else None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        engine.dispose()
    if state is None:
        handed = seen_path.read_text().split()
        check_exactly_once(f"{label} (handed to the no-op gateway)", handed, expected)
        seen_path.unlink()
        state = {"calls": len(handed), "duplicate_identifier_rejections": 0, "overlaps": [],
                 "max_in_flight": 0}
    else:
        accepted = [a["identifier"] for a in state["accepted"]]
        check_exactly_once(f"{label} (accepted by the fake)", accepted, expected)
    # Streams: no v1 call at all, and no identifier sent to the stream twice.
    calls = state["calls"] + (n if stream else 0)
    doubled = state["stream_duplicates" if stream else "duplicate_identifier_rejections"]
    if calls != n or doubled or attempts != n:
        raise BenchFailure(
            f"{label}: {state['calls']} v1 calls, {attempts} attempts recorded and {doubled} "
            f"duplicate identifiers for {n} events: some event was handed over more than once")
    requests = state.get("stream_calls", 0)
    elapsed = (last - first).total_seconds()
    released = sum(released_in_log(lp) for lp in log_paths)
    for lp in log_paths:
        lp.unlink(missing_ok=True)  # kept only when something went wrong
    return {"rate": n / elapsed, "elapsed": elapsed, "overlaps": sum(
        o["count"] for o in state["overlaps"]), "max_in_flight": state["max_in_flight"],
        "cpu_per_1000": (cpu1 - cpu0) / n * 1000, "cpu": cpu1 - cpu0,
        "fake_cpu_per_1000": (fake_cpu1 - fake_cpu0) / n * 1000,
        "machine_busy_pct": 100 * busy_fraction(machine0, machine1),
        "hwm_mb": hwm_kb / 1024, "rss_mb": rss_kb / 1024, "threads": threads,
        "released": released, "requests": requests}


def released_in_log(path: Path) -> int:
    """The events a worker released, from its per-batch ``drained: {...}`` log lines."""
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        if "drained: {" in line:
            total += int(ast.literal_eval(line.split("drained: ", 1)[1])["released"])
    return total


# -- the section -----------------------------------------------------------------------------------

class E2EResults(SectionResults):
    """The e2e section's figures."""


def run(db: BenchDatabase, *, events: int, runs: int, log: Any = print,
        concurrencies: Sequence[int] = CONCURRENCIES, fleet: bool = True) -> E2EResults:
    log(f"e2e: enqueueing {events:,} events with enqueue_usage ({TENANTS} tenants × "
        f"{len(METERS)} meters), committed; each run drains its own copy")
    template, keys = make_template(db, events, TENANTS, METERS)
    expected = copied_keys(keys, 1)
    res = E2EResults(events=events, runs=runs)
    with fake_stripe(LATENCY) as fake:
        for i in range(runs):
            r: dict[int | str, Any] = {}
            k = i % len(concurrencies)
            for c in list(concurrencies[k:]) + list(concurrencies[:k]):
                n = _events_for(c, len(expected))
                with db.outbox_schema("e2e", template, limit=n) as url:
                    env = worker_env(url, fake.base_url, OUTBOX_CONCURRENCY=str(c),
                                     OUTBOX_BATCH_SIZE=str(BATCH),
                                     STRIPE_MAX_REQUESTS_PER_SECOND=str(MAX_RPS))
                    r[c] = drain_with_worker(url, fake, expected[:n], env=env,
                                             label=f"e2e-c{c}")
                log(f"e2e run {i + 1}/{runs}: concurrency {c}: {r[c]['rate']:,.0f} "
                    f"events/s, {r[c]['overlaps']} overlaps, "
                    f"{r[c]['cpu_per_1000']:.2f} CPU s/1000 (fake "
                    f"{r[c]['fake_cpu_per_1000']:.2f}), CPUs "
                    f"{r[c]['machine_busy_pct']:.0f}% busy, peak RSS {r[c]['hwm_mb']:.0f} MB")
                for key in ("rate", "overlaps", "cpu_per_1000", "hwm_mb", "max_in_flight",
                            "fake_cpu_per_1000", "machine_busy_pct"):
                    res.fig(f"{key}_{c}").add(r[c][key])
            if fleet:
                c = FLEET_CONCURRENCY
                with db.outbox_schema("e2e", template) as url:
                    env = worker_env(url, fake.base_url, OUTBOX_CONCURRENCY=str(c),
                                     OUTBOX_BATCH_SIZE=str(BATCH),
                                     STRIPE_MAX_REQUESTS_PER_SECOND=str(MAX_RPS))
                    got = drain_with_worker(url, fake, expected, env=env, label="e2e-fleet",
                                            processes=FLEET_PROCESSES)
                log(f"e2e run {i + 1}/{runs}: {FLEET_PROCESSES} workers at concurrency {c}: "
                    f"{got['rate']:,.0f} events/s, {got['overlaps']} overlaps, "
                    f"{got['released']:,} released")
                for key in ("rate", "overlaps", "released", "cpu_per_1000"):
                    res.fig(f"fleet_{key}").add(got[key])
                if c in r:
                    res.fig("fleet_ratio").add(got["rate"] / r[c]["rate"])
                r["fleet"] = got
            if fleet:
                got = _pooled_run(db, template, fake, expected)
                log(f"e2e run {i + 1}/{runs}: through PgBouncer at concurrency "
                    f"{FLEET_CONCURRENCY}: {got['rate']:,.0f} events/s, {got['overlaps']} "
                    "overlaps")
                for key in ("rate", "overlaps", "cpu_per_1000"):
                    res.fig(f"pooled_{key}").add(got[key])
                if FLEET_CONCURRENCY in r:
                    res.fig("pooled_ratio").add(got["rate"] / r[FLEET_CONCURRENCY]["rate"])
                r["pooled"] = got
            r.update(_stream_runs(db, template, fake, expected, res, i, runs, log))
            res.raw.append({str(c): v for c, v in r.items()})
    return res


#: PgBouncer's own default pool size, for the run through it.
POOLER_SIZE = 20


def _pooled_run(db: BenchDatabase, template: Any, fake: FakeStripeProcess,
                expected: list[str]) -> dict[str, Any]:
    """One worker at ``FLEET_CONCURRENCY`` with ``DATABASE_URL`` through Debian's PgBouncer
    in transaction mode and the lane locks over ``DATABASE_DIRECT_URL``."""
    from urllib.parse import parse_qs, unquote, urlsplit

    from tests.support.pgbouncer import PgBouncer

    with db.outbox_schema("e2e", template) as url:
        options = unquote(parse_qs(urlsplit(url).query)["options"][0])
        schema = options.split("search_path=", 1)[1]
        bouncer = PgBouncer(db.url, db.name, schema, pool_size=POOLER_SIZE).start()
        try:
            env = worker_env(bouncer.url("tx"), fake.base_url, DATABASE_DIRECT_URL=url,
                             OUTBOX_CONCURRENCY=str(FLEET_CONCURRENCY),
                             OUTBOX_BATCH_SIZE=str(BATCH),
                             STRIPE_MAX_REQUESTS_PER_SECOND=str(MAX_RPS))
            got = drain_with_worker(url, fake, expected, env=env, label="e2e-pooled")
            if "prepared statement" in bouncer.log():
                raise BenchFailure("e2e through PgBouncer: the pooler logged a prepared "
                                   "statement error")
            return got
        finally:
            bouncer.stop()


def _stream_runs(db: BenchDatabase, template: Any, fake: FakeStripeProcess,
                 expected: list[str], res: E2EResults, i: int, runs: int,
                 log: Any) -> dict[str, Any]:
    """The v2_stream rows of one run: one worker, then ``FLEET_PROCESSES``."""
    out: dict[str, Any] = {}
    for processes in (1, FLEET_PROCESSES):
        label = f"stream{processes}"
        with db.outbox_schema("e2e", template) as url:
            # The rate by hand: with a test-mode key the default keeps to the sandbox's
            # 25 requests/s, which the fake does not enforce.
            env = worker_env(url, fake.base_url, STRIPE_METER_EVENT_API="v2_stream",
                             STRIPE_METER_EVENTS_BASE=fake.meter_events_url,
                             STRIPE_MAX_REQUESTS_PER_SECOND=str(STREAM_REQUESTS_PER_SECOND),
                             OUTBOX_CONCURRENCY=str(STREAM_CONCURRENCY))
            got = drain_with_worker(url, fake, expected, env=env, label=f"e2e-{label}",
                                    processes=processes, stream=True)
        log(f"e2e run {i + 1}/{runs}: v2_stream, {processes} worker(s) at concurrency "
            f"{STREAM_CONCURRENCY}: {got['rate']:,.0f} events/s, {got['requests']:,} "
            f"requests, {got['overlaps']} overlaps, {got['cpu_per_1000']:.2f} CPU s/1000, "
            f"{got['released']:,} released")
        for key in ("rate", "overlaps", "cpu_per_1000", "requests", "released",
                    "fake_cpu_per_1000", "machine_busy_pct"):
            res.fig(f"{label}_{key}").add(got[key])
        out[label] = got
    return out


def _events_for(concurrency: int, events: int) -> int:
    slow = concurrency / LATENCY < FLOOR_RATE
    return max(1, events // SLOW_SHARE) if slow else events


def rows(res: E2EResults, concurrencies: Sequence[int] = CONCURRENCIES) -> list[Row]:
    s = "End to end (real SDK, fake Stripe)"
    f = res.fig
    out = []
    for c in concurrencies:
        ceiling = min(c / LATENCY, MAX_RPS)
        ok = f(f"rate_{c}").median >= FLOOR_RATE and f(f"overlaps_{c}").hi == 0
        out.append(Row(
            s, f"OUTBOX_CONCURRENCY={c} ({_events_for(c, res.events):,} events, "
               f"{TENANTS}×{len(METERS)} lanes, "
               f"{LATENCY * 1000:.0f} ms latency, batch {BATCH})",
            f(f"rate_{c}").fmt(0, " ev/s"), f"≥ {FLOOR_RATE} ev/s, 0 overlaps", verdict(ok),
            f"lane overlaps {f(f'overlaps_{c}').fmt(0)}; worker CPU "
            f"{f(f'cpu_per_1000_{c}').fmt(2, ' s')} per 1,000 events (fake Stripe "
            f"{f(f'fake_cpu_per_1000_{c}').fmt(2, ' s')}); all CPUs busy "
            f"{f(f'machine_busy_pct_{c}').fmt(0, '%')}; ceiling "
            f"min({c} / {LATENCY:g} s, {MAX_RPS}/s) = "
            f"{ceiling:,.0f} ev/s; peak RSS {f(f'hwm_mb_{c}').fmt(0, ' MB')}"))
    best = max(concurrencies, key=lambda c: f(f"rate_{c}").median)
    overlaps = sum(f(f"overlaps_{c}").hi for c in concurrencies)
    ok = f(f"rate_{best}").median >= FLOOR_RATE and overlaps == 0
    if res.fig("fleet_rate").values:
        fc = FLEET_CONCURRENCY
        out.append(Row(
            s, f"{FLEET_PROCESSES} worker processes, OUTBOX_CONCURRENCY={fc} each "
               f"({res.events:,} events, the same lanes and latency)",
            f("fleet_rate").fmt(0, " ev/s"), "0 overlaps", verdict(f("fleet_overlaps").hi == 0),
            f"lane overlaps {f('fleet_overlaps').fmt(0)}; events claimed then released "
            f"because another process held their lane: {f('fleet_released').fmt(0)} per run; "
            f"workers' CPU {f('fleet_cpu_per_1000').fmt(2, ' s')} per 1,000 events"))
        if res.fig("fleet_ratio").values:
            out.append(Row(s, f"ratio {FLEET_PROCESSES} workers / 1 worker at "
                              f"OUTBOX_CONCURRENCY={fc} (same run)",
                           f("fleet_ratio").fmt(2, "×"), "", ""))
    if res.fig("pooled_rate").values:
        fc = FLEET_CONCURRENCY
        out.append(Row(
            s, f"1 worker through PgBouncer 1.18 in transaction mode (pool {POOLER_SIZE}), "
               f"lane locks over DATABASE_DIRECT_URL, OUTBOX_CONCURRENCY={fc} "
               f"({res.events:,} events)",
            f("pooled_rate").fmt(0, " ev/s"), "0 overlaps",
            verdict(f("pooled_overlaps").hi == 0),
            f"lane overlaps {f('pooled_overlaps').fmt(0)}; worker CPU "
            f"{f('pooled_cpu_per_1000').fmt(2, ' s')} per 1,000 events"))
        if res.fig("pooled_ratio").values:
            out.append(Row(s, f"ratio through PgBouncer / direct, 1 worker at "
                              f"OUTBOX_CONCURRENCY={fc} (same run; per run: "
                              f"{', '.join(f'{v:.2f}' for v in f('pooled_ratio').values)})",
                           f("pooled_ratio").fmt(2, "×"), "", ""))
    out += _stream_rows(res)
    out.append(Row(s, f"per worker, best setting (OUTBOX_CONCURRENCY={best}); lane overlaps "
                      "summed over every run", f"{f(f'rate_{best}').median:,.0f} ev/s; "
                      f"{overlaps:.0f} overlaps", f"≥ {FLOOR_RATE} ev/s with 0 overlaps",
                   verdict(ok), floor_name=f"end to end ≥ {FLOOR_RATE} ev/s per worker at "
                                           f"{LATENCY * 1000:.0f} ms, 0 overlaps"))
    return out


def _stream_rows(res: E2EResults) -> list[Row]:
    """The v2_stream rows, beside v1's."""
    s = "End to end (real SDK, fake Stripe)"
    f = res.fig
    if not f("stream1_rate").values:
        return []
    out = []
    for processes in (1, FLEET_PROCESSES):
        k = f"stream{processes}"
        floor = STREAM_FLOOR_RATE * processes if processes == 1 else 0
        ok = f(f"{k}_rate").median >= floor and f(f"{k}_overlaps").hi == 0
        out.append(Row(
            s, f"STRIPE_METER_EVENT_API=v2_stream, {processes} worker process"
               f"{'es' if processes > 1 else ''} at OUTBOX_CONCURRENCY={STREAM_CONCURRENCY} "
               f"({res.events:,} events, {TENANTS}×{len(METERS)} lanes, "
               f"{LATENCY * 1000:.0f} ms latency, the mode's default batch 2,000 and "
               "100 requests/s)",
            f(f"{k}_rate").fmt(0, " ev/s"),
            f"≥ {STREAM_FLOOR_RATE:,} ev/s, 0 overlaps" if processes == 1 else "0 overlaps",
            verdict(ok),
            f"stream requests {f(f'{k}_requests').fmt(0)}; lane overlaps "
            f"{f(f'{k}_overlaps').fmt(0)}; released {f(f'{k}_released').fmt(0)}; worker CPU "
            f"{f(f'{k}_cpu_per_1000').fmt(2, ' s')} per 1,000 events (fake Stripe "
            f"{f(f'{k}_fake_cpu_per_1000').fmt(2, ' s')}); all CPUs busy "
            f"{f(f'{k}_machine_busy_pct').fmt(0, '%')}",
            floor_name=(f"v2_stream end to end ≥ {STREAM_FLOOR_RATE:,} ev/s per worker at "
                        f"{LATENCY * 1000:.0f} ms, 0 overlaps") if processes == 1 else ""))
    return out
