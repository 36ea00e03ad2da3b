"""The sending switch: one row every worker reads before it claims. A person pauses and
resumes it (``operator``); a worker that meets a systemic answer (401, 403, a missing
default meter) pauses it (``systemic``), and a probe call that succeeds lifts only that kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, Engine, select
from sqlalchemy import update as sa_update

from ..models import fit
from .sql import CONTROL, as_utc, insert_for

SENDING = "sending"
OPERATOR = "operator"
SYSTEMIC = "systemic"


@dataclass(frozen=True)
class PauseState:
    """Whether sending is paused, why, of which kind, since when and by whom."""

    paused: bool
    reason: str | None = None
    kind: str | None = None
    changed_at: datetime | None = None
    changed_by: str | None = None


def pause_state(conn: Connection) -> PauseState:
    """Whether sending is paused, for every worker (one primary-key read)."""
    row = conn.execute(select(CONTROL.c.paused, CONTROL.c.reason, CONTROL.c.kind,
                              CONTROL.c.changed_at, CONTROL.c.changed_by)
                       .where(CONTROL.c.name == SENDING)).first()
    if row is None or not row.paused:
        return PauseState(False)
    return PauseState(True, row.reason, row.kind, as_utc(row.changed_at), row.changed_by)


def set_paused(engine: Engine, *, paused: bool, reason: str | None, kind: str, by: str,
               now: datetime, only_kind: str | None = None) -> bool:
    """:func:`set_paused_in` in a transaction of its own."""
    with engine.begin() as conn:
        return set_paused_in(conn, paused=paused, reason=reason, kind=kind, by=by, now=now,
                             only_kind=only_kind)


def set_paused_in(conn: Connection, *, paused: bool, reason: str | None, kind: str, by: str,
                  now: datetime, only_kind: str | None = None) -> bool:
    """Pause or resume sending, in the caller's transaction. ``only_kind``: change it only if
    the current pause is of that kind (a probe resumes a systemic pause, never a person's). A
    systemic cause never replaces a person's pause. Returns whether it changed."""
    # A systemic reason quotes Stripe's answer: cut to its column, it can always be stored
    # (and compares equal to what is stored).
    reason = fit(CONTROL.c.reason, reason)
    # Several lanes (threads, processes) can meet the same 401 at once: make sure the row
    # exists, then lock it, so concurrent callers queue here instead of racing to INSERT
    # (a unique violation on PostgreSQL that failed the drain pass).
    conn.execute(insert_for(conn, CONTROL).values(name=SENDING, paused=False)
                 .on_conflict_do_nothing(index_elements=[CONTROL.c.name]))
    conn.execute(select(CONTROL.c.name).where(CONTROL.c.name == SENDING).with_for_update())
    current = pause_state(conn)
    if only_kind is not None and (not current.paused or current.kind != only_kind):
        return False
    if current.paused == paused and current.reason == reason:
        return False
    if paused and current.paused and current.kind == OPERATOR and kind != OPERATOR:
        return False
    values = dict(paused=paused, reason=reason if paused else None,
                  kind=kind if paused else None, changed_at=now,
                  changed_by=fit(CONTROL.c.changed_by, by))
    conn.execute(sa_update(CONTROL).where(CONTROL.c.name == SENDING).values(**values))
    return True
