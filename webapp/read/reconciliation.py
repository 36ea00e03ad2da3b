"""The Reconciliation page: the last runs (when, what they checked, what they found) and the
mismatches of one run, each with the facts to act on."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, select

from ..db import reading
from ..outbox import stripe_runs
from ..outbox.sql import RECON_MISMATCHES, RECON_RUNS, row_dict


@dataclass(frozen=True)
class RunSummary:
    id: int
    started_at: datetime
    finished_at: datetime | None
    since: datetime
    until: datetime
    tenant_id: str | None
    trigger: str
    actor: str | None
    buckets_checked: int
    pending: int
    mismatches: int
    calls: int
    ok: bool
    errors: list[str]
    notes: list[str]

    @property
    def covers(self) -> str:
        """What it compared, in words: its UTC days, and the tenant when it was one's."""
        last = self.until - timedelta(seconds=1)
        days = (f"{self.since:%Y-%m-%d}" if last.date() == self.since.date()
                else f"{self.since:%Y-%m-%d} – {last:%Y-%m-%d}")
        return days + (f", tenant {self.tenant_id}" if self.tenant_id else "")


def _summary(row: Any) -> RunSummary:
    r = row_dict(row)
    return RunSummary(r["id"], r["started_at"], r["finished_at"], r["since"], r["until"],
                      r["tenant_id"], r["trigger"], r["actor"], r["buckets_checked"],
                      r["pending"], r["mismatches"], r["calls"], bool(r["ok"]),
                      json.loads(r["errors"] or "[]"), json.loads(r["notes"] or "[]"))


#: Runs of part of the window only: one tenant's (``reconcile --tenant``), or a period a
#: person asked to check from Tenants & usage.
NARROW = RECON_RUNS.c.tenant_id.is_not(None) | (RECON_RUNS.c.trigger == "check")


def last_run(conn: Connection, *, whole: bool = False) -> RunSummary | None:
    """The most recent reconciliation, if any; ``whole``: the most recent of every tenant
    over the whole window (a narrower check must not stand for it, nor clear what it
    found), else the most recent of any."""
    query = select(RECON_RUNS).order_by(RECON_RUNS.c.id.desc()).limit(1)
    row = conn.execute(query.where(~NARROW) if whole else query).first()
    if row is None and whole:
        row = conn.execute(query).first()
    return None if row is None else _summary(row)


@dataclass(frozen=True)
class ReconciliationPage:
    runs: list[RunSummary]
    run: RunSummary | None
    mismatches: list[dict[str, Any]]
    #: Who runs one now (``button:<email>`` or the scheduling process), if anyone.
    running_by: str | None = None

    @property
    def running_person(self) -> str | None:
        """The person who started the run in progress from the dashboard, if one did."""
        by = self.running_by or ""
        for started_from in ("button:", "check:"):
            if by.startswith(started_from):
                return by.removeprefix(started_from)
        return None


def reconciliation_page(engine: Engine, *, now: datetime, run_id: int | None = None,
                        limit: int = 20) -> ReconciliationPage:
    """The last ``limit`` runs, and the mismatches of ``run_id`` (default: the latest)."""
    with reading(engine) as conn:
        running_by = stripe_runs.lease_holder(conn, stripe_runs.RECONCILE, now=now)
        runs = [_summary(r) for r in conn.execute(
            select(RECON_RUNS).order_by(RECON_RUNS.c.id.desc()).limit(limit))]
        run = next((r for r in runs if r.id == run_id), None) if run_id is not None else (
            runs[0] if runs else None)
        if run is None and run_id is not None:
            row = conn.execute(select(RECON_RUNS).where(RECON_RUNS.c.id == run_id)).first()
            run = None if row is None else _summary(row)
        mismatches = [] if run is None else [row_dict(m) for m in conn.execute(
            select(RECON_MISMATCHES).where(RECON_MISMATCHES.c.run_id == run.id)
            .order_by(RECON_MISMATCHES.c.stripe_customer_id, RECON_MISMATCHES.c.meter,
                      RECON_MISMATCHES.c.start))]
    return ReconciliationPage(runs, run, mismatches, running_by)
