"""The Rejected page: events Stripe accepted and then reported invalid — nothing was billed —
with the reason in plain words, grouped by Stripe's code; and what a requeue would do."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, func, select

from ..db import reading
from ..outbox.guards import RequeueCheck, requeue_check
from ..outbox.sql import TENANTS, T, as_utc, int_sum, status_is, text_in
from ..outbox.states import MAX_AGE
from ..status import REJECTED
from .counts import NEAR_LIMIT
from .paging import Cursor, Page, keyset

#: What each of Stripe's codes means, and what to do about it ({customer}, {meter} filled in).
REASONS: dict[str, str] = {
    "meter_event_customer_not_found":
        "Stripe does not know customer {customer}: check the tenant's mapping, then requeue.",
    "meter_event_no_customer_defined":
        "The event reached Stripe without a customer in the key meter {meter} reads: check "
        "the meter's customer key, then requeue.",
    "missing_dimension_payload_keys":
        "The event lacked a key meter {meter} groups by: check the meter, then requeue.",
    "meter_event_invalid_value":
        "Stripe could not read the value: check meter {meter}'s value key, then requeue.",
    "meter_event_value_too_many_digits":
        "The value has more than 15 digits: Stripe cannot bill it; resolve it and bill by "
        "hand.",
    "meter_event_dimension_count_too_high":
        "The event has too many dimensions for meter {meter}: check the meter.",
    "no_meter": "Stripe has no meter {meter}: create it (or fix the event name), then requeue.",
    "archived_meter": "Meter {meter} is archived: reactivate it in Stripe, then requeue.",
    "timestamp_in_future": "Stripe saw the event's time as in the future: check the clock "
                           "of the system that recorded it.",
    "timestamp_too_far_in_past": "The event is older than Stripe accepts (35 days): resolve "
                                 "it and bill by hand.",
}


#: The same for a group of events (several customers), where it differs.
GROUP_REASONS: dict[str, str] = {
    "meter_event_customer_not_found":
        "Stripe does not know these events' customers: check the tenants' mappings, then "
        "requeue.",
}


def reason_text(code: str | None, *, customer: str | None, meter: str | None,
                message: str | None = None, group: bool = False) -> str:
    """A rejection in plain words, with what to do; Stripe's own message for an unknown
    code. ``group``: said of several events."""
    template = (GROUP_REASONS.get(code or "") if group else None) or REASONS.get(code or "")
    if template is None:
        return f"Stripe rejected it ({code or 'no code'}): {message or 'no message'}"
    return template.format(customer=customer or "(none)", meter=meter or "(none)")


@dataclass(frozen=True)
class RejectedFilters:
    tenant: str = ""
    meter: str = ""
    code: str = ""

    def __post_init__(self) -> None:
        for name in ("tenant", "meter", "code"):
            if len(getattr(self, name)) > 200:
                raise ValueError(f"{name} is too long")

    def params(self) -> dict[str, str]:
        return {k: v for k, v in self.__dict__.items() if v}

    def conditions(self) -> list[Any]:
        where: list[Any] = [status_is(REJECTED), T.c.rejected_at.is_not(None)]
        if self.tenant:
            where.append(T.c.tenant_id == self.tenant)
        if self.meter:
            where.append(T.c.meter == self.meter)
        if self.code:
            where.append(T.c.reject_code == self.code)
        return where


COLUMNS = (T.c.id, T.c.tenant_id, T.c.meter, T.c.quantity, T.c.idempotency_key,
           T.c.stripe_identifier, T.c.occurred_at, T.c.status, T.c.stripe_customer_id,
           T.c.reject_code, T.c.reject_message, T.c.reject_event_id, T.c.rejected_at,
           T.c.sent_at)


def rejected(engine: Engine, filters: RejectedFilters, *, now: datetime,
             after: Cursor | None = None, before: Cursor | None = None,
             limit: int = 50) -> Page:
    """One page of rejected events, newest report first (keyset on (rejected_at, id) through
    ``ix_outbox_rejected``), each with its reason in words and its requeue check."""
    stmt = select(*COLUMNS).where(*filters.conditions())
    with reading(engine) as conn:
        page = keyset(conn, stmt, T.c.rejected_at, T.c.id, after=after, before=before,
                      limit=limit, key="rejected_at")
        tenants = {r.tenant_id: r.stripe_customer_id for r in conn.execute(
            select(TENANTS.c.tenant_id, TENANTS.c.stripe_customer_id).where(
                text_in(conn, TENANTS.c.tenant_id, sorted({r["tenant_id"] for r in page.rows}))))}
    for r in page.rows:
        r["reason"] = reason_text(r["reject_code"], customer=r["stripe_customer_id"],
                                  meter=r["meter"], message=r["reject_message"])
        r["mapped_to"] = tenants.get(r["tenant_id"])
        r["requeue"] = requeue_check(status=r["status"], occurred_at=r["occurred_at"],
                                     dead_reason=None, first_unknown_at=None, now=now,
                                     window_seconds=0).value
        r["near_limit"] = r["occurred_at"] < now - (MAX_AGE - NEAR_LIMIT)
    return page


@dataclass(frozen=True)
class RejectGroup:
    code: str | None
    meter: str
    events: int
    units: int
    tenants: int
    first: datetime | None
    last: datetime | None
    reason: str


def rejected_groups(engine: Engine, filters: RejectedFilters, limit: int = 50
                    ) -> list[RejectGroup]:
    """Rejected events grouped by Stripe's code and meter, largest first."""
    with reading(engine) as conn:
        rows = conn.execute(
            select(T.c.reject_code, T.c.meter, func.count(), int_sum(T.c.quantity),
                   func.count(T.c.tenant_id.distinct()), func.min(T.c.rejected_at),
                   func.max(T.c.rejected_at))
            .where(*filters.conditions()).group_by(T.c.reject_code, T.c.meter)
            .order_by(func.count().desc()).limit(limit)).all()
    return [RejectGroup(code, meter, int(n), int(q), int(t), as_utc(lo), as_utc(hi),
                        reason_text(code, customer=None, meter=meter, group=True))
            for code, meter, n, q, t, lo, hi in rows]


@dataclass(frozen=True)
class RejectedPreview:
    """What "requeue all matching" would do with rejected events, and the exact ids."""

    matched: int
    capped: bool
    ok_ids: list[int]
    too_old_ids: list[int]
    tenants: int
    units: int


def requeue_preview(engine: Engine, filters: RejectedFilters, *, now: datetime,
                    cap: int) -> RejectedPreview:
    """Snapshot the rejected events matching ``filters`` (oldest reports first, at most
    ``cap``), sorted by the requeue rule."""
    stmt = (select(T.c.id, T.c.tenant_id, T.c.quantity, T.c.status, T.c.occurred_at)
            .where(*filters.conditions()).order_by(T.c.rejected_at, T.c.id).limit(cap + 1))
    with reading(engine) as conn:
        rows = conn.execute(stmt).all()
    ok_ids: list[int] = []
    old: list[int] = []
    tenants: set[str] = set()
    units = 0
    for r in rows[:cap]:
        occurred = as_utc(r.occurred_at)
        assert occurred is not None
        check = requeue_check(status=r.status, occurred_at=occurred, dead_reason=None,
                              first_unknown_at=None, now=now, window_seconds=0)
        if check is RequeueCheck.OK:
            ok_ids.append(int(r.id))
            tenants.add(r.tenant_id)
            units += int(r.quantity)
        else:
            old.append(int(r.id))
    return RejectedPreview(len(rows), len(rows) > cap, ok_ids, old, len(tenants), units)
