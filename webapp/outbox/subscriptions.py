"""The subscriptions with metered items, as the outbox keeps them (``stripe_subscriptions``):
what decides whether their usage lands on an invoice — a trial, a pause, an end. Stored with
the items of each listing (``webapp.outbox.invoices.store_items``); ``changed_at`` moves when
a field the judge and the search for usage on no invoice read changes, so that the usage of
its customer is judged again."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select

from ..models import fit
from .sql import SUBSCRIPTIONS, as_utc, insert_for

#: A subscription Stripe paused (``status``; not ``pause_collection``, which still invoices).
PAUSED = "paused"
#: The fields of a subscription the judge reads: a change of any judges its usage again.
_JUDGED_FIELDS = ("status", "start_date", "trial_start", "trial_end", "ended_at",
                  "paused_at", "resumed_at")
#: Rows written per statement.
CHUNK = 500


@dataclass(frozen=True)
class SubscriptionFacts:
    """What of a subscription decides whether its usage is invoiced (Stripe's
    ``Subscription`` fields of those names; ``pause_collection`` its behavior)."""

    created: datetime | None = None
    start_date: datetime | None = None
    trial_start: datetime | None = None
    trial_end: datetime | None = None
    ended_at: datetime | None = None
    canceled_at: datetime | None = None
    pause_collection: str | None = None
    #: ``status_details.paused.transitioned_at``: when it became ``paused``.
    paused_at: datetime | None = None


def store_subscriptions(conn: Connection, items: Sequence[Any], *,
                         now: datetime) -> None:
    """Keep the subscriptions of ``items`` (metered items, each with its subscription's id,
    customer, status, current period start and :class:`SubscriptionFacts`); ``changed_at``
    moves when a field the judge reads changes. ``paused_at``: since when it has been paused
    (Stripe's ``status_details.paused.transitioned_at``; without it, its trial's end when it
    paused at a trial's end, else the first time it was seen paused), and ``resumed_at`` the
    start of the period it resumed with."""
    subs: dict[str, Any] = {}
    for item in items:
        subs.setdefault(item.subscription_id, item)
    if not subs:
        return
    kept = {str(r.id): r for r in conn.execute(select(SUBSCRIPTIONS).where(
        SUBSCRIPTIONS.c.id.in_(list(subs))))} if len(subs) <= CHUNK else {
        str(r.id): r for r in conn.execute(select(SUBSCRIPTIONS))}
    rows = []
    for sub_id, item in subs.items():
        facts, old = item.subscription, kept.get(sub_id)
        paused_at = None if old is None else as_utc(old.paused_at)
        resumed_at = None if old is None else as_utc(old.resumed_at)
        if item.subscription_status == PAUSED:
            if facts.paused_at is not None:
                paused_at, resumed_at = facts.paused_at, None
            elif paused_at is None or resumed_at is not None:
                paused_at = facts.trial_end if (facts.trial_end is not None
                                                and facts.trial_end <= now) else now
                resumed_at = None
        elif paused_at is not None and resumed_at is None:
            resumed_at = item.period_start
        row = dict(id=sub_id, stripe_customer_id=item.stripe_customer_id,
                   status=fit(SUBSCRIPTIONS.c.status, item.subscription_status),
                   created=facts.created, start_date=facts.start_date,
                   trial_start=facts.trial_start, trial_end=facts.trial_end,
                   ended_at=facts.ended_at, canceled_at=facts.canceled_at,
                   pause_collection=fit(SUBSCRIPTIONS.c.pause_collection,
                                        facts.pause_collection),
                   paused_at=paused_at, resumed_at=resumed_at, seen_at=now)
        same = old is not None and all(
            (as_utc(getattr(old, f)) if f not in ("status",) else getattr(old, f)) == row[f]
            for f in _JUDGED_FIELDS)
        row["changed_at"] = old.changed_at if same and old is not None else now
        rows.append(row)
    ins = insert_for(conn, SUBSCRIPTIONS)
    upsert = ins.on_conflict_do_update(
        index_elements=[SUBSCRIPTIONS.c.id],
        set_={c: ins.excluded[c] for c in rows[0] if c != "id"})
    for start in range(0, len(rows), CHUNK):
        conn.execute(upsert, rows[start:start + CHUNK])
