"""``python -m bench.run``: the benchmark suite of issue 5, one markdown table.

    python -m bench.run                  # everything, 3 runs each
    python -m bench.run --quick          # a smoke run: fewer events, 1 run
    python -m bench.run --only drain,enqueue --runs 5
    python -m bench.run --only scale --runs 1   # a year at 10 million rows (not in the default)
    python -m bench.run --only claim --runs 1   # the claim at 10 million rows, before and now

Progress goes to stderr; the table goes to stdout and, for a full default run, to
``bench/RESULTS.md`` (other runs write ``bench/results/RESULTS-<stamp>.md``). Raw per-run
figures go to ``bench/results/<stamp>.json``. Exit status: 0 when every benchmark ran (floors
may be missed: see the Verdict column), 1 when a run broke a guarantee (an event lost or sent
twice, a worker that did not stop cleanly) or could not run, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .common import RESULTS_DIR, ROOT, BenchDatabase, BenchFailure, Row, nproc, sources_digest

SECTIONS = ("drain", "enqueue", "ingest", "e2e", "memory", "dashboard", "money", "periods",
            "scale", "claim", "invoices")
DEFAULT = ("drain", "enqueue", "ingest", "e2e", "memory", "dashboard", "money", "periods")

#: Where ``bench/RESULTS.md`` keeps the scale section's figures (see ``main``).
SCALE_HEADING = "## Scale: 10 million rows"

#: Sizes: (full, quick).
SIZES = {
    "drain": (20_000, 2_000),
    "enqueue": (5_000, 300),
    "ingest": (100_000, 10_000),         # events over HTTP, in batches of 500
    "e2e": (10_000, 1_000),
    "memory": (100_000, 10_000),
    "dashboard": (1_000_000, 100_000),   # outbox rows, loaded once per invocation
    "money": (10_000, 1_000),            # error reports polled (reconciliation: fixed size)
    "periods": (100_000, 10_000),        # Stripe customers with a metered subscription
    "scale": (10_000_000, 500_000),      # outbox rows over 400 days; not in DEFAULT
    "claim": (10_000_000, 500_000),      # outbox rows; the claim old and new; not in DEFAULT
    "invoices": (100_000, 10_000),       # customers (10M / 500k events); not in DEFAULT
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="smoke run: fewer events, 1 run (results are not RESULTS.md material)")
    p.add_argument("--only", default=",".join(DEFAULT),
                   help=f"comma-separated sections among {', '.join(SECTIONS)} "
                        "(default: all of them)")
    p.add_argument("--runs", type=int, default=None,
                   help="runs per figure (default 3; 1 with --quick)")
    p.add_argument("--output", type=Path, default=None, help="where to write the table")
    args = p.parse_args(argv)
    args.sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in args.sections if s not in SECTIONS]
    if unknown or not args.sections:
        p.error(f"unknown section(s) {', '.join(unknown) or '(none)'}; "
                f"choose among {', '.join(SECTIONS)}")
    if args.runs is None:
        args.runs = 1 if args.quick else 3
    if args.runs < 1:
        p.error("--runs must be at least 1")
    return args


def git_commit() -> str:
    """The checked-out commit (read-only ``git rev-parse``)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, timeout=10).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def machine_line(pg_version: str, load_before: tuple[float, float, float],
                 code: dict[str, str]) -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load_after = os.getloadavg()
    if code["digest_before"] == code["digest_after"]:
        source = f"webapp/ sources {code['digest_before']}"
    else:
        source = (f"**webapp/ sources changed during the run** ({code['digest_before']} → "
                  f"{code['digest_after']}; commit at the end {code['commit_after']})")
    return (f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')} · {nproc()} cores ({cpu}) · "
            f"PostgreSQL {pg_version} · Python {platform.python_version()} · "
            f"commit {code['commit_before']} (working tree as found), {source} · "
            f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")


def render(rows: list[Row], machine: str, args: argparse.Namespace, elapsed: float) -> str:
    command = "python -m bench.run" + (" --quick" if args.quick else "") + (
        f" --only {','.join(args.sections)}" if tuple(args.sections) != DEFAULT else "") + (
        f" --runs {args.runs}" if args.runs != (1 if args.quick else 3) else "")
    out = [
        "## Benchmarks",
        "",
        f"Machine: {machine}",
        "",
        f"Command: `{command}` ({elapsed / 60:.1f} min). Each figure: the median of "
        f"{args.runs} run{'s' if args.runs > 1 else ''}, (min–max) across them; every ratio is "
        "taken within one run, then summarized the same way.",
        "",
        "| Section | Measure | Figure: median (min–max) | Floor | Verdict | Notes |",
        "|---|---|---|---|---|---|",
    ]
    last = None
    for r in rows:
        section = r.section if r.section != last else ""
        last = r.section
        out.append(f"| {section} | {r.what} | {r.figure} | {r.floor} | {r.verdict} | "
                   f"{r.note} |")
    floors = [r for r in rows if r.floor_name]
    if floors:
        out += ["", "Floors (the issues that set them are named in the README):", ""]
        out += [f"- {r.floor_name}: **{r.verdict}** ({r.figure})" for r in floors]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    load_before = os.getloadavg()
    code = {"commit_before": git_commit(), "digest_before": sources_digest()}
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    size = {k: v[1] if args.quick else v[0] for k, v in SIZES.items()}
    rows: list[Row] = []
    raw: dict[str, Any] = {"argv": sys.argv[1:], "sizes": size, "runs": args.runs}

    db = BenchDatabase()
    try:
        db.create()
    except Exception as exc:  # noqa: BLE001
        log(f"cannot create the bench database via {db.name}: {type(exc).__name__}: {exc}")
        return 1
    log(f"bench database {db.name}; sections {', '.join(args.sections)}; {args.runs} run(s)")
    try:
        pg_version = db.server_version()
        for section in args.sections:
            t0 = time.monotonic()
            if section == "drain":
                from . import drain

                res: Any = drain.run(db, events=size["drain"], runs=args.runs, log=log)
                rows += drain.rows(res)
            elif section == "enqueue":
                from . import enqueue

                res = enqueue.run(db, n=size["enqueue"], runs=args.runs, log=log)
                rows += enqueue.rows(res)
            elif section == "ingest":
                from . import ingest

                res = ingest.run(db, events=size["ingest"], runs=args.runs, log=log)
                rows += ingest.rows(res)
            elif section == "e2e":
                from . import e2e

                res = e2e.run(db, events=size["e2e"], runs=args.runs, log=log)
                rows += e2e.rows(res)
            elif section == "memory":
                from . import memory

                res = memory.run(db, events=size["memory"], runs=args.runs, log=log)
                rows += memory.rows(res)
            elif section == "money":
                from . import money

                res = money.run(db, reports=size["money"], runs=args.runs, log=log)
                rows += money.rows(res)
            elif section == "periods":
                from . import periods

                res = periods.run(db, customers=size["periods"], runs=args.runs, log=log)
                rows += periods.rows(res)
            elif section == "claim":
                from . import claim_cost

                res = claim_cost.run(db, rows=size["claim"], runs=args.runs, log=log)
                rows += claim_cost.rows(res)
            elif section == "invoices":
                from . import invoices

                res = invoices.run(db, customers=size["invoices"], runs=args.runs, log=log)
                rows += invoices.rows(res)
            elif section == "scale":
                from . import scale

                res = scale.run(db, events=size["scale"], runs=args.runs, log=log)
                rows += res.table
            else:
                from . import dashboard

                res = dashboard.run(db, events=size["dashboard"], runs=args.runs, log=log)
                rows += dashboard.rows(res)
            raw[section] = {"figures": {k: asdict(v) for k, v in res.figures.items()},
                            "runs": _strip(res.raw)}
            # A long section's figures are on disk as soon as it ends.
            (RESULTS_DIR / f"{stamp}.json").write_text(json.dumps(raw, indent=1, default=str))
            log(f"{section} done in {time.monotonic() - t0:.0f} s")
    except BenchFailure as exc:
        log(f"FAILED: {exc}")
        print(f"bench: FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        db.drop()
        (RESULTS_DIR / f"{stamp}.json").write_text(json.dumps(raw, indent=1, default=str))

    elapsed = time.monotonic() - started
    code.update(commit_after=git_commit(), digest_after=sources_digest())
    raw["code"] = code
    (RESULTS_DIR / f"{stamp}.json").write_text(json.dumps(raw, indent=1, default=str))
    table = render(rows, machine_line(pg_version, load_before, code), args, elapsed)
    print(table, end="")
    full = not args.quick and tuple(args.sections) == DEFAULT and args.output is None
    target = args.output or (ROOT / "bench" / "RESULTS.md" if full
                             else RESULTS_DIR / f"RESULTS-{stamp}.md")
    if full and target.exists():
        # The scale section is not part of a default run: its figures, recorded below the
        # default table, stay.
        kept = target.read_text().partition(SCALE_HEADING)
        if kept[1]:
            table += "\n" + kept[1] + kept[2]
    target.write_text(table)
    log(f"table written to {target}; raw figures in {RESULTS_DIR / (stamp + '.json')}")
    return 0


def _strip(obj: Any) -> Any:
    """Raw results without the per-event identifier lists."""
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in ("seen", "expected")}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


if __name__ == "__main__":
    raise SystemExit(main())
