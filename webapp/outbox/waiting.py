"""Events waiting for their tenant's Stripe customer, kept out of the claim's way.

An event of a tenant without a customer cannot be sent, but it is due: it sits in
``ix_outbox_claimable`` in order of ``next_attempt_at``, oldest first. Every claim, and the
status line's sample of due events, walked past all of them before reaching an event it could
take: 5,000 such events at 10 million rows cost each claim about 80 ms (against 20 ms), and
1,000 of them filled the status line's whole sample, so it said nothing was due while sendable
events waited.

So an unmapped tenant's event that is due and at least :data:`DEFER_AFTER` old is put off
by :data:`DEFER_FOR` (its ``next_attempt_at`` moves, nothing else; put off again as soon as it
comes due, so the claim meets it for at most one turn of the service), and is due again as soon as
its tenant gets a customer: mapping a tenant (``set_tenant``, an import or a sync) makes its
put-off events due in the same transaction, and the maintenance service that puts events off
first makes due again any whose tenant was mapped another way. An event never claimed has no
customer of its own and no backoff to respect, so "due now" is always right for it.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import Connection, Engine, exists, select, update

from .sql import CLAIMABLE_SQL, TENANTS, T, sql_str

#: An unmapped tenant's event is put off once it is this old (a tenant mapped within
#: minutes of its first event never sees it happen).
DEFER_AFTER = timedelta(minutes=5)
#: How far it is put off; the service looks again at this cadence, mapping ends it at once.
DEFER_FOR = timedelta(minutes=10)
#: At most this many events are put off by one statement.
BATCH = 10_000

_MAPPED = exists().where(TENANTS.c.tenant_id == T.c.tenant_id,
                         TENANTS.c.stripe_customer_id.is_not(None))
#: Never claimed (a claim fixes the customer on the row), still pending.
_UNCLAIMED = (CLAIMABLE_SQL, T.c.status == sql_str("pending"), T.c.stripe_customer_id.is_(None))


def defer_unmapped(engine: Engine, *, now: datetime, limit: int = BATCH) -> int:
    """Put off the due events of tenants without a customer that are at least
    :data:`DEFER_AFTER` old, oldest first (at most ``limit``); how many. Rows another transaction
    holds are left for the next turn (``SKIP LOCKED`` on PostgreSQL); the UPDATE checks again
    that each is still unclaimed and unmapped."""
    picked = (select(T.c.id).where(*_UNCLAIMED, T.c.next_attempt_at <= now,
                                   T.c.created_at <= now - DEFER_AFTER, ~_MAPPED)
              .order_by(T.c.next_attempt_at, T.c.id).limit(limit))
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            picked = picked.with_for_update(skip_locked=True, of=T)
        done = conn.execute(update(T).where(
            T.c.id.in_(picked.scalar_subquery()), *_UNCLAIMED, ~_MAPPED)
            .values(next_attempt_at=now + DEFER_FOR))
    return int(done.rowcount or 0)


def undefer_mapped(conn: Connection, *, now: datetime) -> int:
    """Make due now the put-off events whose tenant has a customer (in ``conn``'s
    transaction: a mapping's own); how many."""
    done = conn.execute(update(T).where(*_UNCLAIMED, T.c.next_attempt_at > now, _MAPPED)
                        .values(next_attempt_at=now))
    return int(done.rowcount or 0)


__all__ = ["BATCH", "DEFER_AFTER", "DEFER_FOR", "defer_unmapped", "undefer_mapped"]
