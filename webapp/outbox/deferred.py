"""Events that cannot be sent yet, kept out of the claim's way: those of a tenant without a
Stripe customer, and those of a meter Stripe does not have (active), or has pre-aggregated
(kept ``pre_aggregated``, not ``active``: see :mod:`webapp.outbox.meters`).

Such an event is due, but no claim takes it: it sits in ``ix_outbox_claimable`` in order of
``next_attempt_at``, oldest first. Every claim, and the status line's sample of due events,
walked past all of them before reaching an event it could take: thousands of them made every
claim several times slower, and enough of them filled the status line's whole sample.

So such an event, never claimed, due and at least :data:`DEFER_AFTER` old, is put off by
:data:`DEFER_FOR` (its ``next_attempt_at`` moves, nothing else; put off again as soon as it
comes due, so the claim meets it for at most one turn of the service), and is due again as soon
as it can be sent: mapping a tenant (``set_tenant``, an import or a sync) makes its put-off
events due in the same transaction, so does a listing of Stripe's meters that shows their meter
active, and the maintenance service that puts events off first makes due again any that can be
sent by then (a tenant mapped by hand in the database). An event never claimed has no customer
of its own and no backoff to respect, so "due now" is always right for it.

Events of a missing meter are put off only while the last listing of Stripe's meters
succeeded: a drainer whose listing fails holds every event anyway (the status line says
Holding), and one that never lists them (no meter source) sends them all.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, and_, select, update

from ..status import PENDING
from .sendable import TENANT_MAPPED, WAITING_SQL
from .sql import STRIPE_METERS, SYNC_STATE, T, sql_str

#: An event that cannot be sent is put off once it is this old (a tenant mapped, or a meter
#: created, within minutes of the first event never sees it happen).
DEFER_AFTER = timedelta(minutes=5)
#: How far it is put off; the service looks again at this cadence, mapping ends it at once.
DEFER_FOR = timedelta(minutes=10)
#: At most this many events are put off by one statement.
BATCH = 10_000

#: The event's meter may be sent to: kept ``active`` (a pre-aggregated one is kept
#: ``pre_aggregated``), as :func:`webapp.outbox.meters.active_meters` picks them in Python.
_ACTIVE_METER = T.c.meter.in_(select(STRIPE_METERS.c.event_name)
                              .where(STRIPE_METERS.c.status == sql_str("active")))
#: Never claimed (a claim fixes the customer on the row), still pending.
UNCLAIMED = (WAITING_SQL, T.c.status == sql_str(PENDING), T.c.stripe_customer_id.is_(None))


def meters_listed(conn: Connection) -> bool:
    """Whether the last listing of Stripe's meters succeeded (then a meter it does not show
    active is missing, and a drainer claims none of its events)."""
    return bool(conn.execute(select(SYNC_STATE.c.ok).where(
        SYNC_STATE.c.name == sql_str("meters"))).scalar())


def _sendable(listed: bool) -> Any:
    """An unclaimed event's tenant has a customer and, when Stripe's meters are listed, its
    meter is active."""
    return and_(TENANT_MAPPED, _ACTIVE_METER) if listed else TENANT_MAPPED


def defer_unsendable(engine: Engine, *, now: datetime, limit: int = BATCH) -> int:
    """Put off the due events that cannot be sent (tenant without a customer, meter Stripe
    does not have) and are at least :data:`DEFER_AFTER` old, oldest first (at most
    ``limit``); how many. Rows another transaction holds are left for the next turn (``SKIP
    LOCKED`` on PostgreSQL); the UPDATE checks again that each is still unclaimed and still
    cannot be sent."""
    with engine.begin() as conn:
        cannot = ~_sendable(meters_listed(conn))
        picked = (select(T.c.id).where(*UNCLAIMED, T.c.next_attempt_at <= now,
                                       T.c.created_at <= now - DEFER_AFTER, cannot)
                  .order_by(T.c.next_attempt_at, T.c.id).limit(limit))
        if conn.dialect.name == "postgresql":
            picked = picked.with_for_update(skip_locked=True, of=T)
        done = conn.execute(update(T).where(
            T.c.id.in_(picked.scalar_subquery()), *UNCLAIMED, cannot)
            .values(next_attempt_at=now + DEFER_FOR))
    return int(done.rowcount or 0)


def undefer_sendable(conn: Connection, *, now: datetime, listed: bool | None = None) -> int:
    """Make due now the put-off events that can be sent by now (in ``conn``'s transaction: a
    mapping's own, or a listing's of Stripe's meters, which passes ``listed``); how many."""
    can = _sendable(meters_listed(conn) if listed is None else listed)
    done = conn.execute(update(T).where(*UNCLAIMED, T.c.next_attempt_at > now, can)
                        .values(next_attempt_at=now))
    return int(done.rowcount or 0)


def waits_for(conn: Connection, event: dict[str, Any]) -> str | None:
    """What a pending, never-claimed event waits for before it can be sent: ``"customer"``
    (its tenant has none), ``"meter"`` (Stripe does not have its meter, active, or has it
    pre-aggregated: the meter's own row says which), or None."""
    if event["status"] != PENDING or event.get("stripe_customer_id"):
        return None
    row = conn.execute(select(TENANT_MAPPED.label("mapped"), _ACTIVE_METER.label("active"))
                       .select_from(T).where(T.c.id == event["id"])).first()
    if row is None:
        return None
    if not row.mapped:
        return "customer"
    if not row.active and meters_listed(conn):
        return "meter"
    return None


__all__ = ["BATCH", "DEFER_AFTER", "DEFER_FOR", "UNCLAIMED", "defer_unsendable",
           "meters_listed", "undefer_sendable", "waits_for"]
