"""HTTP ingest: ``POST /api/v1/usage`` through ``billing-outbox serve`` with one gunicorn process
(its 4 threads), on PostgreSQL, the drainer off.

Each run starts the server on a fresh migrated schema with one ingest token, then ``CLIENTS``
client threads, each with its own keep-alive connection, send batches of ``BATCH`` new events
(every key unique) until ``events`` have been sent. Rate = events / wall time from the first
request to the last answer; each batch's latency is its request's round trip. Every answer must
be 200 with every result ``created``, and the table must then hold exactly the events sent;
anything else raises ``BenchFailure``.
"""

from __future__ import annotations

import http.client
import json
import secrets
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .common import BenchDatabase, BenchFailure, Row, SectionResults, verdict

BATCH = 500
CLIENTS = 4
FLOOR_RATE = 5000.0
FLOOR_P95_MS = 200.0
ROOT = Path(__file__).resolve().parent.parent


class IngestResults(SectionResults):
    """The ingest section's figures."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(url: str, log_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    import os

    port = _free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OUTBOX_", "STRIPE_", "DATABASE_URL", "DRAINER_"))}
    env.update(DATABASE_URL=url, SECRET_KEY=secrets.token_urlsafe(48), DRAINER_ENABLED="false",
               LOG_LEVEL="WARNING")
    log = open(log_path, "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([sys.executable, "-m", "webapp", "serve", "--port", str(port),
                             "--workers", "1"], env=env, cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/healthz")
            if c.getresponse().status == 200:
                return proc, port
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise BenchFailure(f"the server did not answer /healthz: {log_path.read_text()[-2000:]}")


def run_once(db: BenchDatabase, events: int, log_dir: Path) -> dict[str, Any]:
    from sqlalchemy import func, select

    from webapp.db import make_engine
    from webapp.models import OutboxEvent, utcnow
    from webapp.outbox.tokens import create_token

    schema, url = db.migrated_schema("ingest")
    engine = make_engine(url)
    proc = None
    try:
        _, token = create_token(engine, "bench", rate_per_second=10_000, actor="bench",
                                now=utcnow())
        proc, port = _serve(url, log_dir / f"serve-{schema}.log")
        batches = events // BATCH
        latencies: list[float] = []
        errors: list[str] = []
        lock = threading.Lock()
        counter = iter(range(batches))
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

        def client(n: int) -> None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            while True:
                with lock:
                    b = next(counter, None)
                if b is None:
                    return
                body = json.dumps({"events": [
                    {"tenant_id": f"tenant-{(b * BATCH + i) % 20:03d}", "quantity": 1 + i % 7,
                     "idempotency_key": f"b{b}:{i}"} for i in range(BATCH)]})
                t0 = time.perf_counter()
                conn.request("POST", "/api/v1/usage", body=body, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
                spent = time.perf_counter() - t0
                with lock:
                    latencies.append(spent * 1000)
                    if resp.status != 200:
                        errors.append(f"HTTP {resp.status}: {payload[:200]!r}")
                    elif any(r["status"] != "created" for r in json.loads(payload)["results"]):
                        errors.append("a result was not created")

        # Warm the server's connections and caches outside the clock (its events counted).
        warm = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        warm.request("POST", "/api/v1/usage", headers=headers, body=json.dumps({"events": [
            {"tenant_id": "warm", "quantity": 1, "idempotency_key": f"warm:{i}"}
            for i in range(BATCH)]}))
        warm.getresponse().read()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        t_start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t_start
        if errors:
            raise BenchFailure(f"ingest: {len(errors)} batch(es) failed, first: {errors[0]}")
        with engine.connect() as conn:
            stored = conn.execute(select(func.count()).select_from(OutboxEvent)).scalar_one()
        if stored != batches * BATCH + BATCH:
            raise BenchFailure(f"ingest: {stored} events stored, {batches * BATCH + BATCH} sent")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=40)
        engine.dispose()
        db.drop_schema(schema)
    ordered = sorted(latencies)
    return {"rate": batches * BATCH / elapsed, "elapsed": elapsed, "events": batches * BATCH,
            "median_ms": statistics.median(ordered),
            "p95_ms": ordered[max(0, int(0.95 * len(ordered) + 0.999) - 1)]}


def run(db: BenchDatabase, *, events: int, runs: int, log: Any = print) -> IngestResults:
    import tempfile

    res = IngestResults(events=events, runs=runs)
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        for i in range(runs):
            r = run_once(db, events, Path(tmp))
            res.raw.append(r)
            res.fig("rate").add(r["rate"])
            res.fig("median_ms").add(r["median_ms"])
            res.fig("p95_ms").add(r["p95_ms"])
            log(f"ingest run {i + 1}/{runs}: {r['rate']:,.0f} events/s ({r['events']:,} in "
                f"{r['elapsed']:.2f} s), a batch's median {r['median_ms']:.0f} ms, p95 "
                f"{r['p95_ms']:.0f} ms")
    return res


def rows(res: IngestResults) -> list[Row]:
    s = "HTTP ingest"
    f = res.fig
    return [
        Row(s, f"POST /api/v1/usage, one gunicorn process (4 threads), {CLIENTS} clients, "
               f"batches of {BATCH} new events ({res.events:,} events), PostgreSQL",
            f("rate").fmt(0, " ev/s"), f"≥ {FLOOR_RATE:,.0f} ev/s",
            verdict(f("rate").median >= FLOOR_RATE),
            f"a batch's round trip: median {f('median_ms').fmt(0, ' ms')}",
            floor_name=f"HTTP ingest ≥ {FLOOR_RATE:,.0f} events/s in one gunicorn process"),
        Row(s, "a batch's round trip, p95", f("p95_ms").fmt(0, " ms"),
            f"< {FLOOR_P95_MS:.0f} ms", verdict(f("p95_ms").median < FLOOR_P95_MS),
            floor_name=f"HTTP ingest: a batch's p95 < {FLOOR_P95_MS:.0f} ms"),
    ]
