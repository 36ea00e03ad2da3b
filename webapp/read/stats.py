"""What ``billing-outbox stats`` prints (the contract's ``stats --json``)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Engine, func, select, text

from ..db import reading
from ..models import IN_FLIGHT_SQL, WAITING_IDLE_SQL
from ..outbox.control import pause_state
from ..outbox.retention import pruned_totals
from ..outbox.sendable import UNADDRESSED_SQL, WAITING_SQL
from ..outbox.sql import T, as_utc
from ..outbox.states import ALL_STATUSES
from .health import health


def stats(engine: Engine, *, now: datetime, api_key_here: bool = True,
          retention_days: int | None = None, meter_event_api: str = "v1",
          stripe_api_base: str | None = None,
          stripe_meter_events_base: str | None = None) -> dict[str, object]:
    """Counts by status (every row counted), the oldest waiting event's age, the sending
    switch, how many events wait for a customer mapping, the state of sending (``health``:
    the dashboard's status line), what retention has removed (``pruned``) and how events go
    to Stripe (``meter_event_api``: ``v1`` or ``v2_stream``; ``stripe_api_base`` and
    ``stripe_meter_events_base``: where calls and streams go; all from the settings)."""
    with reading(engine) as conn:
        counts = dict.fromkeys(ALL_STATUSES, 0)
        for status, n in conn.execute(select(T.c.status, func.count()).group_by(T.c.status)):
            counts[status] = int(n)
        # Waiting: pending or retrying (ix_outbox_waiting_created's predicate), or in flight
        # (ix_outbox_processing_deadline); literal predicates, so each finds its index.
        found = [as_utc(conn.execute(select(func.min(T.c.created_at)).where(text(where)))
                        .scalar()) for where in (WAITING_IDLE_SQL, IN_FLIGHT_SQL)]
        oldest = min((at for at in found if at is not None), default=None)
        unmapped = conn.execute(
            select(func.count()).select_from(T)
            .where(WAITING_SQL, UNADDRESSED_SQL)).scalar_one()
        switch = pause_state(conn)
        state = health(conn, now=now, api_key_here=api_key_here)
        pruned, pruned_units, last_pruned = pruned_totals(conn)
    return {
        "counts": counts,
        "oldest_pending_age_seconds": (round((now - oldest).total_seconds(), 3)
                                       if oldest is not None else None),
        "paused": switch.paused,
        "pause_reason": switch.reason,
        "pause_kind": switch.kind,
        "waiting_for_customer_mapping": int(unmapped),
        "meter_event_api": meter_event_api,
        "stripe_api_base": stripe_api_base,
        "stripe_meter_events_base": stripe_meter_events_base,
        "health": state.as_dict(),
        "pruned": {"events": pruned, "units": pruned_units,
                   "last_at": last_pruned.isoformat() if last_pruned else None,
                   "retention_days": retention_days},
    }
