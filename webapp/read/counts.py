"""The numbers several pages share: events by status, the oldest waiting event, events near
Stripe's 35-day limit, tenants waiting for a customer, and how fresh the rollups are. Each
takes the page's connection, so one page reads one snapshot. (Whether sending is fine is
``health``'s decision alone.)"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, func, select, union_all

from ..outbox.rollups import ROLLUPS, fold_target, read_mark, sent_total
from ..outbox.sql import (
    EPOCH,
    IDLE_UNSENT,
    IN_FLIGHT_WHERE,
    TENANTS,
    WAITING_IDLE,
    T,
    as_utc,
    sql_str,
    status_in,
    status_is,
)
from ..outbox.states import ALL_STATUSES, MAX_AGE
from ..status import DEAD, PROCESSING, RESOLVED, RESTING, SENT, UNSENT_OPEN, WAITING

#: Unsent statuses with a partial index of their own, counted through it.
OWN_INDEX = (DEAD, RESOLVED)
#: The other unsent statuses, counted from their ranges of ``ix_outbox_unsent``.
RANGED = tuple(s for s in RESTING if s not in OWN_INDEX)
#: Stripe rejects events older than 35 days; warn this long before.
NEAR_LIMIT = timedelta(days=7)


def status_counts(conn: Connection) -> dict[str, int]:
    """Events by status, in one statement: sent from the rollup; in flight through
    ``ix_outbox_processing_deadline``; dead and resolved events (the many: they stay until a
    person acts, or until pruned) each through their own narrow index (``ix_outbox_dead``
    is a ninth of ``ix_outbox_unsent``'s size); the other statuses from their ranges of
    ``ix_outbox_unsent``, named in a list so that no index of the claim's (whose entries do
    not say pending from retrying) can serve them. One scan of every unsent row grows with
    the unsent rows; counting pending alone let PostgreSQL join the claim's two indexes and
    visit a heap page per waiting event, where the range reads index entries only."""
    counts = dict.fromkeys(ALL_STATUSES, 0)
    legs = [select(sql_str(s).label("status"), func.count().label("n"))
            .where(status_is(s), IDLE_UNSENT) for s in OWN_INDEX]
    legs.append(select(T.c.status, func.count().label("n"))
                .where(status_in(RANGED), IDLE_UNSENT).group_by(T.c.status))
    legs.append(select(sql_str(PROCESSING).label("status"), func.count().label("n"))
                .where(IN_FLIGHT_WHERE))
    for status, n in conn.execute(union_all(*legs)):
        counts[str(status)] = int(n)
    counts[SENT] = sent_total(conn)
    return counts


def oldest_waiting(conn: Connection) -> datetime | None:
    """When the oldest event still waiting to be sent (pending, processing, retrying) was
    enqueued (``ix_outbox_waiting_created``, and the few in flight apart)."""
    found = [as_utc(conn.execute(select(func.min(T.c.created_at)).where(where)).scalar())
             for where in (WAITING_IDLE, IN_FLIGHT_WHERE)]
    return min((at for at in found if at is not None), default=None)


def age_limits(conn: Connection, now: datetime,
               counts: Mapping[str, int] | None = None) -> tuple[int, int]:
    """(events within 7 days of Stripe's 35-day limit, events past it) not yet sent:
    pending, retrying, dead and in flight. Past the limit is counted as all of them less
    those inside it, so only the last 35 days' range of each status is read (a dead letter
    stays for good: reading the rows past the limit read nearly every dead row).
    ``counts``: :func:`status_counts` read in the same snapshot, if the caller has it."""
    if counts is None:
        counts = status_counts(conn)
    limit = now - MAX_AGE
    parts: dict[str, tuple[Any, ...]] = {s: (status_is(s), IDLE_UNSENT) for s in UNSENT_OPEN}
    parts[PROCESSING] = (IN_FLIGHT_WHERE,)
    legs = []
    for where in parts.values():
        legs.append(select(sql_str("inside").label("k"), func.count().label("n"))
                    .where(*where, T.c.occurred_at >= limit))
        legs.append(select(sql_str("near").label("k"), func.count().label("n"))
                    .where(*where, T.c.occurred_at >= limit,
                           T.c.occurred_at < limit + NEAR_LIMIT))
    got = {"inside": 0, "near": 0}
    for k, n in conn.execute(union_all(*legs)):
        got[str(k)] += int(n)
    return got["near"], sum(counts[s] for s in parts) - got["inside"]


@dataclass(frozen=True)
class UnmappedTenant:
    """A tenant with events waiting only because it has no Stripe customer yet."""

    tenant_id: str
    events: int
    oldest_occurred_at: datetime | None


def waiting_unmapped() -> Any:
    """Tenants with events waiting only for a customer, as a subquery (``tenant_id``, ``n``,
    ``oldest``): per tenant first (a hash of the waiting events through ``ix_outbox_unsent``),
    then one mapping test per tenant, not one per waiting event."""
    waiting = (select(T.c.tenant_id, func.count().label("n"),
                      func.min(T.c.occurred_at).label("oldest"))
               .where(status_in(WAITING), IDLE_UNSENT,
                      T.c.stripe_customer_id.is_(None))
               .group_by(T.c.tenant_id).subquery())
    mapped = (select(TENANTS.c.tenant_id)
              .where(TENANTS.c.tenant_id == waiting.c.tenant_id,
                     TENANTS.c.stripe_customer_id.is_not(None)).exists())
    return select(waiting.c.tenant_id, waiting.c.n, waiting.c.oldest).where(~mapped).subquery()


def unmapped_tenants(conn: Connection, limit: int = 50) -> list[UnmappedTenant]:
    """Tenants with events waiting only because they have no Stripe customer yet, the most
    waiting first."""
    waiting = waiting_unmapped()
    rows = conn.execute(select(waiting.c.tenant_id, waiting.c.n, waiting.c.oldest)
                        .order_by(waiting.c.n.desc(), waiting.c.tenant_id).limit(limit))
    return [UnmappedTenant(t, int(n), as_utc(o)) for t, n, o in rows]


@dataclass(frozen=True)
class Freshness:
    """How far the rollups lag what a fold now would give them (they are exact either way:
    only the time a read takes grows with the lag)."""

    folded_to: datetime | None   # the oldest watermark; None: never folded
    behind: timedelta | None     # beyond the usual margin; None when never folded

    def stale(self, tolerance: timedelta = timedelta(hours=1)) -> bool:
        """Whether the folder seems not to run (it folds every few minutes)."""
        return self.behind is None or self.behind > tolerance


def rollup_freshness(conn: Connection, *, now: datetime, margin: timedelta) -> Freshness:
    """How fresh the rollups are: their oldest watermark, and how far it trails the one a
    fold at ``now`` would set."""
    marks = [read_mark(conn, name) for name in ROLLUPS]
    if any(m.at == EPOCH for m in marks):
        return Freshness(None, None)
    folded = min(m.at for m in marks)
    return Freshness(folded, max(timedelta(0), fold_target(now, margin) - folded))
