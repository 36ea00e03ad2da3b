"""Where each periodic exchange with Stripe stands (``stripe_sync_state``): when it last ran
and how it went, and a lease so that one process at a time runs a long one."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, Engine, select
from sqlalchemy import update as sa_update

from ..models import fit
from .sql import SYNC_STATE, as_utc, insert_for

METERS = "meters"
EVENTS = "events"
RECONCILE = "reconcile"
#: Reading Stripe's subscriptions and invoices (``webapp.worker.invoices``).
BILLING = "billing"
#: When the last complete listing of invoices began (the next one starts from there).
INVOICES_MARK = "billing-invoices"
#: When the last complete listing of subscriptions began: usage Stripe took before then is
#: judged against what that listing said (``webapp.outbox.unbilled``).
SUBSCRIPTIONS_MARK = "billing-subscriptions"
#: When the invoice-line judge last began a pass (``webapp.outbox.judge``): what was sent
#: since, and every line not judged, is judged at the next.
JUDGE_MARK = "billing-judge"
#: When the last look for usage on no invoice began (``webapp.outbox.unbilled``).
UNBILLED_MARK = "billing-unbilled"
#: The last try of each notification channel (``webapp.worker.notify.deliveries``).
NOTIFY = {"slack": "notify-slack", "webhook": "notify-webhook", "email": "notify-email"}


@dataclass(frozen=True)
class RunStatus:
    name: str
    ran_at: datetime | None
    ok: bool | None
    detail: str | None


def _ensure(conn: Connection, name: str) -> None:
    conn.execute(insert_for(conn, SYNC_STATE).values(name=name)
                 .on_conflict_do_nothing(index_elements=[SYNC_STATE.c.name]))


def record_run(engine: Engine, name: str, *, ok: bool, detail: str | None,
               now: datetime) -> None:
    """That ``name`` ran at ``now``, and how it went (one line a person can read; it often
    quotes Stripe's answer, so it is cut to its column: recording it never fails)."""
    with engine.begin() as conn:
        _ensure(conn, name)
        conn.execute(sa_update(SYNC_STATE).where(SYNC_STATE.c.name == name)
                     .values(ran_at=now, ok=ok, detail=fit(SYNC_STATE.c.detail, detail or None)))


def run_status(conn: Connection, name: str) -> RunStatus:
    """When ``name`` last ran and how it went (never: all None)."""
    row = conn.execute(select(SYNC_STATE.c.ran_at, SYNC_STATE.c.ok, SYNC_STATE.c.detail)
                       .where(SYNC_STATE.c.name == name)).first()
    if row is None:
        return RunStatus(name, None, None, None)
    return RunStatus(name, as_utc(row.ran_at), row.ok, row.detail)


def run_statuses(conn: Connection, names: list[str]) -> dict[str, RunStatus]:
    """:func:`run_status` of each of ``names``, in one read."""
    found = {r.name: RunStatus(r.name, as_utc(r.ran_at), r.ok, r.detail) for r in conn.execute(
        select(SYNC_STATE.c.name, SYNC_STATE.c.ran_at, SYNC_STATE.c.ok, SYNC_STATE.c.detail)
        .where(SYNC_STATE.c.name.in_(names)))}
    return {n: found.get(n) or RunStatus(n, None, None, None) for n in names}


def lease_holder(conn: Connection, name: str, *, now: datetime) -> str | None:
    """Who holds ``name`` now, if anyone."""
    row = conn.execute(select(SYNC_STATE.c.locked_by, SYNC_STATE.c.locked_until)
                       .where(SYNC_STATE.c.name == name)).first()
    until = None if row is None else as_utc(row.locked_until)
    if row is None or row.locked_by is None or until is None:
        return None
    return str(row.locked_by) if until > now else None


def take_lease(engine: Engine, name: str, *, owner: str, now: datetime,
               seconds: float) -> bool:
    """Hold ``name`` for ``seconds`` unless another owner holds it; whether we do."""
    with engine.begin() as conn:
        _ensure(conn, name)
        done = conn.execute(sa_update(SYNC_STATE).where(
            SYNC_STATE.c.name == name,
            (SYNC_STATE.c.locked_until.is_(None)) | (SYNC_STATE.c.locked_until < now)
            | (SYNC_STATE.c.locked_by == owner))
            .values(locked_until=now + timedelta(seconds=seconds), locked_by=owner))
        return done.rowcount == 1


def drop_lease(engine: Engine, name: str, *, owner: str) -> None:
    """Let go of ``name`` (if still ours)."""
    with engine.begin() as conn:
        conn.execute(sa_update(SYNC_STATE).where(SYNC_STATE.c.name == name,
                                                 SYNC_STATE.c.locked_by == owner)
                     .values(locked_until=None, locked_by=None))
