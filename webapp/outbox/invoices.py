"""Stripe's billing periods and invoices as the outbox keeps them, and the mark that makes the
claim send first what a draft invoice still needs.

Stripe bills a metered period on the invoice it drafts at the period's end; usage of that
period still counts until the draft finalizes (``automatically_finalizes_at``: one hour after
by default, up to 72), then the line is fixed. Usage sent later is accepted and counted by the
meter but is on no invoice (``docs/stripe.md``, "Billing periods and invoices").

- :func:`store_items`: the metered subscription items with their current period (a full
  listing replaces what was kept: an item no longer listed is gone at Stripe).
- :func:`store_invoices`: invoices with the periods of their metered lines.
- :func:`mark_invoice_first`: every waiting event whose (customer, meter, time) falls in a
  period of a draft invoice carries that draft's ``finalizes_at``; the claim takes those first
  (``webapp.outbox.claims``), soonest to finalize first. Events no longer in one are unmarked.

No network call happens here; the billing refresher (``webapp.worker.invoices``) reads Stripe.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, and_, delete, func, select, text
from sqlalchemy import update as sa_update

from ..models import INVOICE_FIRST_SQL, fit
from .sql import (
    INVOICE_PERIODS,
    INVOICES,
    STRIPE_METERS,
    SUBSCRIPTION_ITEMS,
    TENANTS,
    T,
    as_utc,
    insert_for,
)

#: Stripe's invoice statuses (``deleted``: a draft Stripe no longer lists, ours).
DRAFT, OPEN, PAID, UNCOLLECTIBLE, VOID, DELETED = (
    "draft", "open", "paid", "uncollectible", "void", "deleted")
#: Rows written per statement.
CHUNK = 500


@dataclass(frozen=True)
class MeteredItem:
    """A subscription item whose price is metered on a meter, with its current period."""

    id: str
    subscription_id: str
    stripe_customer_id: str
    subscription_status: str
    meter_id: str
    price_id: str | None
    period_start: datetime
    period_end: datetime


@dataclass(frozen=True)
class LinePeriod:
    """One invoice line of a subscription item: the period it bills, and its quantity."""

    subscription_item_id: str
    start: datetime
    end: datetime
    quantity: int | None


@dataclass(frozen=True)
class InvoiceInfo:
    """An invoice of a subscription, as Stripe lists it."""

    id: str
    stripe_customer_id: str
    subscription_id: str | None
    status: str
    created: datetime
    #: ``automatically_finalizes_at``: set only while ``draft``.
    finalizes_at: datetime | None
    #: ``status_transitions.finalized_at``.
    finalized_at: datetime | None
    lines: tuple[LinePeriod, ...] = ()


def _meter_names(conn: Connection) -> dict[str, str]:
    """Stripe's meter id -> its event name, as the meters were last read."""
    return {str(r.meter_id): str(r.event_name) for r in conn.execute(
        select(STRIPE_METERS.c.meter_id, STRIPE_METERS.c.event_name)
        .where(STRIPE_METERS.c.meter_id.is_not(None)))}


def unknown_meters(conn: Connection, items: Iterable[MeteredItem]) -> set[str]:
    """The meter ids these items bill on that the meters last read do not name (a meter made
    since, or meters never read yet): read the meters before storing the items."""
    return {i.meter_id for i in items} - set(_meter_names(conn))


def store_items(engine: Engine, items: Iterable[MeteredItem], *, now: datetime,
                complete: bool = True) -> int:
    """Keep the metered items listed at ``now``; with ``complete`` (every page of every
    subscription was read), the items not listed are dropped. How many were stored."""
    listed = list({i.id: i for i in items}.values())
    with engine.begin() as conn:
        names = _meter_names(conn)
        ins = insert_for(conn, SUBSCRIPTION_ITEMS)
        upsert = ins.on_conflict_do_update(
            index_elements=[SUBSCRIPTION_ITEMS.c.id],
            set_={c: ins.excluded[c] for c in (
                "subscription_id", "stripe_customer_id", "subscription_status", "meter_id",
                "meter", "price_id", "current_period_start", "current_period_end", "seen_at")})
        for start in range(0, len(listed), CHUNK):
            # One statement, many parameter sets: compiled once (a VALUES list of a whole
            # chunk is compiled anew each time, and that cost more than the rows' writing).
            conn.execute(upsert, [
                dict(id=i.id, subscription_id=i.subscription_id,
                     stripe_customer_id=i.stripe_customer_id,
                     subscription_status=fit(SUBSCRIPTION_ITEMS.c.subscription_status,
                                             i.subscription_status),
                     meter_id=i.meter_id, meter=names.get(i.meter_id), price_id=i.price_id,
                     current_period_start=i.period_start, current_period_end=i.period_end,
                     seen_at=now)
                for i in listed[start:start + CHUNK]])
        if complete:
            conn.execute(delete(SUBSCRIPTION_ITEMS).where(SUBSCRIPTION_ITEMS.c.seen_at < now))
    return len(listed)


def store_invoices(engine: Engine, invoices: Iterable[InvoiceInfo], *, now: datetime,
                   listed_since: datetime | None = None) -> int:
    """Keep these invoices and the periods of their lines that bill a metered item we keep.
    ``listed_since``: every invoice created since then was listed, so a draft kept from that
    stretch that is not among them was deleted at Stripe (Stripe deletes drafts only). How
    many were stored."""
    listed = list({i.id: i for i in invoices}.values())
    with engine.begin() as conn:
        # Read before anything is written: which invoices are kept already (their lines are
        # replaced) and the meters of the items. Done per chunk, these lookups would scan a
        # table this very transaction is filling (its statistics say it is empty), once a
        # chunk: quadratic over a first read of 100,000 invoices.
        kept = _present(conn, INVOICES.c.id, [i.id for i in listed])
        items = _present(conn, SUBSCRIPTION_ITEMS.c.id,
                         sorted({line.subscription_item_id for i in listed for line in i.lines}),
                         SUBSCRIPTION_ITEMS.c.meter)
        ins = insert_for(conn, INVOICES)
        upsert = ins.on_conflict_do_update(
            index_elements=[INVOICES.c.id],
            set_={c: ins.excluded[c] for c in (
                "stripe_customer_id", "subscription_id", "status", "created", "finalizes_at",
                "finalized_at", "seen_at")})
        for start in range(0, len(listed), CHUNK):
            chunk = listed[start:start + CHUNK]
            conn.execute(upsert, [
                dict(id=i.id, stripe_customer_id=i.stripe_customer_id,
                     subscription_id=i.subscription_id, status=fit(INVOICES.c.status, i.status),
                     created=i.created,
                     finalizes_at=i.finalizes_at if i.status == DRAFT else None,
                     finalized_at=i.finalized_at, seen_at=now) for i in chunk])
            again = [i.id for i in chunk if i.id in kept]
            if again:
                conn.execute(delete(INVOICE_PERIODS).where(
                    INVOICE_PERIODS.c.invoice_id.in_(again)))
            periods = [dict(invoice_id=i.id, subscription_item_id=line.subscription_item_id,
                            stripe_customer_id=i.stripe_customer_id,
                            meter=items[line.subscription_item_id], period_start=line.start,
                            period_end=line.end, quantity=line.quantity)
                       for i in chunk
                       for line in {x.subscription_item_id: x for x in i.lines}.values()
                       if line.subscription_item_id in items]
            if periods:
                conn.execute(insert_for(conn, INVOICE_PERIODS), periods)
        if listed_since is not None:
            conn.execute(sa_update(INVOICES).where(
                INVOICES.c.status == DRAFT, INVOICES.c.created >= listed_since,
                INVOICES.c.seen_at < now).values(status=DELETED, finalizes_at=None))
    return len(listed)


def _present(conn: Connection, key: Any, wanted: Sequence[str], value: Any = None
             ) -> dict[str, Any]:
    """Which of ``wanted`` the table of ``key`` holds (key -> ``value``'s column, or None):
    a lookup of these keys for a few, one read of the whole column for many (a scan the
    planner would choose anyway, done once)."""
    if not wanted:
        return {}
    cols = [key] if value is None else [key, value]
    if len(wanted) <= CHUNK:
        rows = conn.execute(select(*cols).where(key.in_(list(wanted))))
    else:
        rows = conn.execute(select(*cols))
    want = set(wanted)
    return {str(r[0]): (r[1] if value is not None else None) for r in rows if str(r[0]) in want}


def oldest_draft_created(conn: Connection) -> datetime | None:
    """When the oldest draft we keep was created (a listing must reach back to it)."""
    return as_utc(conn.execute(select(func.min(INVOICES.c.created))
                               .where(INVOICES.c.status == DRAFT)).scalar())


def drafts_to_finalize(conn: Connection) -> int:
    """How many drafts we keep."""
    return int(conn.execute(select(func.count()).select_from(INVOICES)
                            .where(INVOICES.c.status == DRAFT)).scalar() or 0)


def draft_windows() -> Any:
    """(customer, meter, period start, period end, finalizes_at) of every draft's metered
    line, as a subquery."""
    return (select(INVOICE_PERIODS.c.stripe_customer_id.label("customer"),
                   INVOICE_PERIODS.c.meter.label("meter"),
                   INVOICE_PERIODS.c.period_start.label("start"),
                   INVOICE_PERIODS.c.period_end.label("end"),
                   INVOICES.c.finalizes_at.label("finalizes_at"))
            .join(INVOICES, INVOICES.c.id == INVOICE_PERIODS.c.invoice_id)
            .where(INVOICES.c.status == DRAFT, INVOICES.c.finalizes_at.is_not(None),
                   INVOICE_PERIODS.c.meter.is_not(None))
            .subquery("w"))


def mark_invoice_first(engine: Engine) -> tuple[int, int]:
    """Give every waiting event of a draft invoice's period that draft's ``finalizes_at``
    (the soonest, should two drafts bill it), and take it from the events no longer in one;
    (marked, unmarked)."""
    w = draft_windows()
    customer = func.coalesce(T.c.stripe_customer_id, TENANTS.c.stripe_customer_id)
    with engine.begin() as conn:
        wanted: dict[int, datetime] = {}
        if drafts_to_finalize(conn):
            rows = conn.execute(
                select(T.c.id, T.c.invoice_finalizes_at, func.min(w.c.finalizes_at))
                .select_from(T)
                .outerjoin(TENANTS, TENANTS.c.tenant_id == T.c.tenant_id)
                .join(w, and_(w.c.customer == customer, w.c.meter == T.c.meter,
                              w.c.start <= T.c.occurred_at, T.c.occurred_at < w.c.end))
                .where(T.c.status.in_(("pending", "retrying")))
                .group_by(T.c.id, T.c.invoice_finalizes_at)).all()
            current = {int(r[0]): as_utc(r[1]) for r in rows}
            wanted = {int(r[0]): as_utc(r[2]) for r in rows}  # type: ignore[misc]
            changed: defaultdict[datetime, list[int]] = defaultdict(list)
            for event_id, due in wanted.items():
                if current[event_id] != due:
                    changed[due].append(event_id)
            marked = _set(conn, changed)
        else:
            marked = 0
        held = [int(i) for i in conn.execute(
            select(T.c.id).where(text(INVOICE_FIRST_SQL))).scalars()]
        stale = [i for i in held if i not in wanted]
        for start in range(0, len(stale), CHUNK):
            conn.execute(sa_update(T).where(T.c.id.in_(stale[start:start + CHUNK]))
                         .values(invoice_finalizes_at=None))
    return marked, len(stale)


def _set(conn: Connection, changed: dict[datetime, list[int]]) -> int:
    done = 0
    for due, ids in changed.items():
        for start in range(0, len(ids), CHUNK):
            part: Sequence[int] = ids[start:start + CHUNK]
            conn.execute(sa_update(T).where(T.c.id.in_(part)).values(invoice_finalizes_at=due))
            done += len(part)
    return done
