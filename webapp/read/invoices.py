"""Finalized invoice lines and their verdicts, as the judge kept them
(``webapp.outbox.judge``): for ``billing-outbox invoices`` and the Invoices page. Read from the
lines' table through its indexes (finalized, by verdict); nothing is summed per view."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import Connection, func, literal, select, tuple_

from ..outbox.evidence import VERDICTS, as_number
from ..outbox.sql import INVOICE_PERIODS, INVOICES, TENANTS, as_utc

L = INVOICE_PERIODS
#: The window ``invoices`` reads by default: the last 35 days (as far back as Stripe takes
#: usage, and so as far back as a line can still change).
DEFAULT_DAYS = 35
#: Lines a page shows at most.
PAGE = 50
#: What a line not judged yet shows as its verdict.
NOT_JUDGED = "not_judged"


@dataclass(frozen=True)
class InvoiceLine:
    """One finalized metered line and what the judge found of it."""

    invoice_id: str
    subscription_item_id: str
    invoice_status: str
    tenant_id: str | None
    stripe_customer_id: str
    meter: str | None
    period_start: datetime
    period_end: datetime
    finalized_at: datetime
    formula: str | None
    quantity_decimal: str | None
    amount: int | None
    currency: str | None
    ours: int | None
    ours_events: int | None
    late: int | None
    late_events: int | None
    uncertain: int | None
    uncertain_events: int | None
    difference: str | None
    verdict: str

    @property
    def invoiced(self) -> Decimal | None:
        """Stripe's quantity (None for a ``last`` meter, whose line is listed only)."""
        if self.formula == "last" or self.quantity_decimal is None:
            return None
        return Decimal(self.quantity_decimal)

    @property
    def missing(self) -> Decimal:
        """The units the line lacks (a short line), else 0."""
        return max(Decimal(0), -Decimal(self.difference or "0"))

    @property
    def extra(self) -> Decimal:
        """The units the line holds beyond the project's (an over line), else 0."""
        return max(Decimal(0), Decimal(self.difference or "0"))

    def as_dict(self) -> dict[str, Any]:
        return {"invoice_id": self.invoice_id, "invoice_status": self.invoice_status,
                "tenant_id": self.tenant_id, "stripe_customer_id": self.stripe_customer_id,
                "meter": self.meter, "subscription_item_id": self.subscription_item_id,
                "period_start": self.period_start.isoformat(),
                "period_end": self.period_end.isoformat(),
                "finalized_at": self.finalized_at.isoformat(),
                "invoiced": as_number(self.invoiced), "ours": self.ours, "late": self.late,
                "uncertain": self.uncertain, "difference": as_number(self.difference),
                "amount": self.amount, "currency": self.currency, "verdict": self.verdict}


def window(start: date | None, end: date | None, now: datetime) -> tuple[datetime, datetime]:
    """[from, to] as instants: ``to`` inclusive (its whole day); by default the last
    :data:`DEFAULT_DAYS` days to now."""
    hi = (datetime(end.year, end.month, end.day, tzinfo=UTC) + timedelta(days=1)
          if end is not None else now)
    lo = (datetime(start.year, start.month, start.day, tzinfo=UTC) if start is not None
          else hi - timedelta(days=DEFAULT_DAYS))
    if hi <= lo:
        raise ValueError("the window ends before it starts")
    return lo, hi


def _tenant() -> Any:
    return (select(func.min(TENANTS.c.tenant_id))
            .where(TENANTS.c.stripe_customer_id == L.c.stripe_customer_id)
            .scalar_subquery())


def _where(conn: Connection, lo: datetime, hi: datetime, tenant_id: str | None,
           customer: str | None, verdict: str | None) -> list[Any]:
    where = [L.c.finalized_at.is_not(None), L.c.finalized_at >= lo, L.c.finalized_at < hi]
    if tenant_id is not None:
        customers = [str(c) for c in conn.execute(
            select(TENANTS.c.stripe_customer_id).where(
                TENANTS.c.tenant_id == tenant_id,
                TENANTS.c.stripe_customer_id.is_not(None))).scalars()]
        where.append(L.c.stripe_customer_id.in_(customers))
    if customer is not None:
        where.append(L.c.stripe_customer_id == customer)
    if verdict == NOT_JUDGED:
        where.append(L.c.verdict.is_(None))
    elif verdict is not None:
        if verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {', '.join(VERDICTS)}")
        where.append(L.c.verdict == literal(verdict))
    return where


def invoice_lines(conn: Connection, lo: datetime, hi: datetime, *,
                  tenant_id: str | None = None, customer: str | None = None,
                  verdict: str | None = None, limit: int | None = None,
                  after: tuple[datetime, str, str] | None = None) -> list[InvoiceLine]:
    """The lines finalized in [lo, hi), newest first (then by invoice and item); after the
    line ``after`` (its finalization, invoice, item) for the next page."""
    return list(stream_lines(conn, lo, hi, tenant_id=tenant_id, customer=customer,
                             verdict=verdict, limit=limit, after=after))


def stream_lines(conn: Connection, lo: datetime, hi: datetime, *,
                 tenant_id: str | None = None, customer: str | None = None,
                 verdict: str | None = None, limit: int | None = None,
                 after: tuple[datetime, str, str] | None = None) -> Iterator[InvoiceLine]:
    """:func:`invoice_lines` as they are read (a server-side cursor on PostgreSQL, a
    thousand rows at a time): a command printing every line of a window never holds it all."""
    whole = limit is None
    tenants = _tenants()
    stmt = (select(*_columns(tenants.c.tenant_id if whole else _tenant()))
            .select_from(L)
            .join(INVOICES, INVOICES.c.id == L.c.invoice_id)
            .where(*_where(conn, lo, hi, tenant_id, customer, verdict))
            .order_by(L.c.finalized_at.desc(), L.c.invoice_id.desc(),
                      L.c.subscription_item_id.desc()))
    if whole:
        # Every line of a window: each customer's tenant joined once (a hash of the
        # mapping), not looked up line by line.
        stmt = stmt.outerjoin(tenants, tenants.c.stripe_customer_id == L.c.stripe_customer_id)
    if after is not None:
        stmt = stmt.where(tuple_(L.c.finalized_at, L.c.invoice_id, L.c.subscription_item_id)
                          < tuple_(literal(after[0], L.c.finalized_at.type),
                                   literal(after[1]), literal(after[2])))
    if limit is not None:
        stmt = stmt.limit(limit)
    elif conn.dialect.name == "postgresql":
        # Every line of a window: the plan's estimate passes PostgreSQL's JIT thresholds, and
        # compiling costs more than the read (measured in bench/RESULTS.md, issue 44).
        conn.exec_driver_sql("SET LOCAL jit = off")
    for r in conn.execution_options(yield_per=1000).execute(stmt):
        yield _line(r)


def one_line(conn: Connection, invoice_id: str, item_id: str) -> InvoiceLine | None:
    """One line by (invoice, item), finalized or not yet judged."""
    r = conn.execute(select(*_columns(_tenant())).select_from(L)
                     .join(INVOICES, INVOICES.c.id == L.c.invoice_id)
                     .where(L.c.invoice_id == invoice_id, L.c.subscription_item_id == item_id,
                            L.c.finalized_at.is_not(None))).first()
    return None if r is None else _line(r)


def _columns(tenant: Any) -> list[Any]:
    """What a line is read as, in :class:`InvoiceLine`'s order (read by position: a row's
    attributes by name cost more than the rest of the read at 100,000 lines)."""
    return [L.c.invoice_id, L.c.subscription_item_id, INVOICES.c.status, tenant,
            L.c.stripe_customer_id, L.c.meter, L.c.period_start, L.c.period_end,
            L.c.finalized_at, L.c.formula, L.c.quantity_decimal, L.c.amount,
            INVOICES.c.currency, L.c.ours, L.c.ours_events, L.c.late, L.c.late_events,
            L.c.uncertain, L.c.uncertain_events, L.c.difference, L.c.verdict]


def _tenants() -> Any:
    """Each mapped customer's tenant (the first by id), as a relation to join."""
    return (select(TENANTS.c.stripe_customer_id,
                   func.min(TENANTS.c.tenant_id).label("tenant_id"))
            .where(TENANTS.c.stripe_customer_id.is_not(None))
            .group_by(TENANTS.c.stripe_customer_id)
            .subquery("line_tenants"))


def _line(r: Any) -> InvoiceLine:
    (invoice, item, status, tenant, customer, meter, start, end, finalized, formula, quantity,
     amount, currency, ours, ours_events, late, late_events, uncertain, uncertain_events,
     difference, verdict) = r
    return InvoiceLine(str(invoice), str(item), str(status), tenant, str(customer), meter,
                       _utc(start), _utc(end), _utc(finalized), formula, quantity, amount,
                       currency, ours, ours_events, late, late_events, uncertain,
                       uncertain_events, difference, verdict or NOT_JUDGED)


def _utc(value: Any) -> datetime:
    found = as_utc(value)
    assert found is not None
    return found


def verdict_counts(conn: Connection, lo: datetime, hi: datetime, *,
                   tenant_id: str | None = None,
                   customer: str | None = None) -> dict[str, int]:
    """Lines finalized in [lo, hi) by verdict (``not_judged`` for those not judged yet)."""
    found = {str(r[0] or NOT_JUDGED): int(r[1]) for r in conn.execute(
        select(L.c.verdict, func.count())
        .where(*_where(conn, lo, hi, tenant_id, customer, None))
        .group_by(L.c.verdict))}
    return {v: found[v] for v in (*VERDICTS, NOT_JUDGED) if found.get(v)}


def invoiced_units(conn: Connection, customers: Sequence[str] | None, lo: datetime,
                   hi: datetime) -> dict[tuple[str, str], Decimal]:
    """Stripe's quantity on the finalized lines (not void) whose period lies within [lo, hi),
    per (customer, meter), of these customers (None: every one): what the Tenants & usage
    file shows as invoiced. Lines end before they are final, so ``finalized_at`` bounds the
    read (``ix_invoice_periods_finalized``)."""
    out: dict[tuple[str, str], Decimal] = {}
    if customers is not None and not customers:
        return out
    mine = [] if customers is None else [L.c.stripe_customer_id.in_(sorted(set(customers)))]
    for r in conn.execute(select(L.c.stripe_customer_id, L.c.meter, L.c.quantity_decimal)
                          .join(INVOICES, INVOICES.c.id == L.c.invoice_id)
                          .where(*mine, L.c.finalized_at.is_not(None),
                                 L.c.finalized_at >= lo, L.c.period_start >= lo,
                                 L.c.period_end <= hi, L.c.meter.is_not(None),
                                 INVOICES.c.status != literal("void"),
                                 L.c.quantity_decimal.is_not(None))):
        key = (str(r.stripe_customer_id), str(r.meter))
        out[key] = out.get(key, Decimal(0)) + Decimal(r.quantity_decimal)
    return out
