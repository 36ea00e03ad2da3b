"""Stripe's billing periods and invoices as the outbox keeps them, and the mark that makes the
claim send first what a draft invoice still needs.

Stripe bills a metered period on the invoice it drafts at the period's end; usage of that
period still counts until the draft finalizes (``automatically_finalizes_at``: one hour after
by default, up to 72), then the line is fixed. Usage sent later is accepted and counted by the
meter but is on no invoice (``docs/stripe.md``, "Billing periods and invoices").

- :func:`store_items`: the metered subscription items with their current period (a full
  listing replaces what was kept: an item no longer listed is gone at Stripe), and their
  subscriptions with what decides whether usage is invoiced (trial, pause, end).
- :func:`store_invoices`: invoices with their metered lines (Stripe's exact quantity, the
  amount); a line's verdict (``webapp.outbox.judge``) is kept while the line is unchanged.
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
from ..status import WAITING
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
from .subscriptions import SubscriptionFacts, store_subscriptions

#: Stripe's invoice statuses (``deleted``: a draft Stripe no longer lists, ours).
DRAFT, OPEN, PAID, UNCOLLECTIBLE, VOID, DELETED = (
    "draft", "open", "paid", "uncollectible", "void", "deleted")
#: The statuses of an invoice Stripe finalized: its metered lines are fixed.
FINALIZED = (OPEN, PAID, UNCOLLECTIBLE, VOID)

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
    subscription: SubscriptionFacts = SubscriptionFacts()


@dataclass(frozen=True)
class LinePeriod:
    """One invoice line of a subscription item: the period it bills, its quantity (whole
    units, truncated: Stripe's ``quantity``; exactly: ``quantity_decimal``) and its amount
    in the currency's minor unit."""

    subscription_item_id: str
    start: datetime
    end: datetime
    quantity: int | None
    quantity_decimal: str | None = None
    amount: int | None = None


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
    billing_reason: str | None = None
    currency: str | None = None


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
        store_subscriptions(conn, listed, now=now)
    return len(listed)


#: A line's columns the judge writes (``webapp.outbox.judge``), kept while the line is unchanged.
JUDGED = ("verdict", "formula", "ours", "ours_events", "late", "late_events", "uncertain",
          "uncertain_events", "difference", "judged_at")
#: Statuses that are a line's verdict whatever its figures.
STATUS_VERDICTS = (VOID, UNCOLLECTIBLE)


def store_invoices(engine: Engine, invoices: Iterable[InvoiceInfo], *, now: datetime,
                   listed_since: datetime | None = None) -> int:
    """Keep these invoices and their lines that bill a metered item we keep.
    ``listed_since``: every invoice created since then was listed, so a draft kept from that
    stretch that is not among them was deleted at Stripe (Stripe deletes drafts only). A
    judged line read again unchanged (period, quantity, finalization) keeps its verdict, but
    for a change of status to or from ``void`` or ``uncollectible``; any other change leaves it
    to be judged again. How many were stored."""
    listed = list({i.id: i for i in invoices}.values())
    with engine.begin() as conn:
        # Read before anything is written: which invoices are kept already (their lines are
        # replaced) and the meters of the items. Done per chunk, these lookups would scan a
        # table this very transaction is filling (its statistics say it is empty), once a
        # chunk: quadratic over a first read of 100,000 invoices.
        kept = _present(conn, INVOICES.c.id, [i.id for i in listed], INVOICES.c.status)
        items = _present(conn, SUBSCRIPTION_ITEMS.c.id,
                         sorted({line.subscription_item_id for i in listed for line in i.lines}),
                         SUBSCRIPTION_ITEMS.c.meter)
        ins = insert_for(conn, INVOICES)
        upsert = ins.on_conflict_do_update(
            index_elements=[INVOICES.c.id],
            set_={c: ins.excluded[c] for c in (
                "stripe_customer_id", "subscription_id", "status", "created", "finalizes_at",
                "finalized_at", "seen_at", "billing_reason", "currency")})
        for start in range(0, len(listed), CHUNK):
            chunk = listed[start:start + CHUNK]
            conn.execute(upsert, [
                dict(id=i.id, stripe_customer_id=i.stripe_customer_id,
                     subscription_id=i.subscription_id, status=fit(INVOICES.c.status, i.status),
                     created=i.created,
                     finalizes_at=i.finalizes_at if i.status == DRAFT else None,
                     finalized_at=i.finalized_at, seen_at=now,
                     billing_reason=fit(INVOICES.c.billing_reason, i.billing_reason),
                     currency=fit(INVOICES.c.currency, i.currency)) for i in chunk])
            again = [i.id for i in chunk if i.id in kept]
            judged = _judged_lines(conn, again)
            if again:
                conn.execute(delete(INVOICE_PERIODS).where(
                    INVOICE_PERIODS.c.invoice_id.in_(again)))
            periods = [_line_row(i, line, items[line.subscription_item_id],
                                 judged.get((i.id, line.subscription_item_id)),
                                 kept.get(i.id))
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


def _judged_lines(conn: Connection, invoice_ids: Sequence[str]) -> dict[tuple[str, str], Any]:
    """The judged lines of these invoices as kept, by (invoice, item)."""
    if not invoice_ids:
        return {}
    return {(str(r.invoice_id), str(r.subscription_item_id)): r for r in conn.execute(
        select(INVOICE_PERIODS).where(INVOICE_PERIODS.c.invoice_id.in_(list(invoice_ids)),
                                      INVOICE_PERIODS.c.judged_at.is_not(None)))}


def _line_row(invoice: InvoiceInfo, line: LinePeriod, meter: str | None, old: Any,
              old_status: str | None) -> dict[str, Any]:
    """A line's row: what Stripe says of it, and the judge's columns when the line is the
    one judged (see :func:`store_invoices`)."""
    finalized = invoice.finalized_at if invoice.status in FINALIZED else None
    row: dict[str, Any] = dict(
        invoice_id=invoice.id, subscription_item_id=line.subscription_item_id,
        stripe_customer_id=invoice.stripe_customer_id, meter=meter,
        period_start=line.start, period_end=line.end, quantity=line.quantity,
        subscription_id=invoice.subscription_id,
        quantity_decimal=fit(INVOICE_PERIODS.c.quantity_decimal,
                             line.quantity_decimal if line.quantity_decimal is not None
                             else None if line.quantity is None else str(line.quantity)),
        amount=line.amount, finalized_at=finalized)
    row.update({c: None for c in JUDGED})
    unchanged = (old is not None and finalized is not None
                 and as_utc(old.finalized_at) == finalized
                 and as_utc(old.period_start) == line.start
                 and as_utc(old.period_end) == line.end
                 and old.quantity_decimal == row["quantity_decimal"])
    if not unchanged:
        return row
    was, now_status = old_status in STATUS_VERDICTS, invoice.status in STATUS_VERDICTS
    if was and not now_status:
        return row      # e.g. uncollectible, then paid: judged again from its figures
    row.update({c: getattr(old, c) for c in JUDGED})
    if now_status:
        row["verdict"] = invoice.status
    return row


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


def mark_deleted(engine: Engine, invoice_ids: Sequence[str]) -> int:
    """Drafts Stripe says it deleted (``v1.invoice.deleted``): kept as ``deleted``."""
    if not invoice_ids:
        return 0
    with engine.begin() as conn:
        return conn.execute(sa_update(INVOICES).where(
            INVOICES.c.id.in_(list(invoice_ids)), INVOICES.c.status == DRAFT)
            .values(status=DELETED, finalizes_at=None)).rowcount


def last_read(conn: Connection, table: Any, ids: Sequence[str]) -> dict[str, datetime]:
    """When each of these invoices or subscriptions (``table``: ``INVOICES`` or
    ``SUBSCRIPTIONS``) was last read from Stripe; those never read are left out."""
    if not ids:
        return {}
    return {str(r[0]): _seen for r in conn.execute(
        select(table.c.id, table.c.seen_at).where(table.c.id.in_(sorted(set(ids)))))
        if (_seen := as_utc(r[1])) is not None}


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
                .where(T.c.status.in_(WAITING))
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
