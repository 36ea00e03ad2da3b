"""The pages that send again what Stripe lost: a mismatch's day with the events it compared
(ours beside Stripe's figures), and the preview of sending them again. Reads only; the rules
are ``webapp.outbox.findings`` and ``webapp.outbox.resend``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, select

from ..db import reading
from ..outbox.findings import Bucket, Finding, Held, finding, offer, require_finding, whole_day
from ..outbox.operations import OperationError
from ..outbox.resend import (
    MAX_CHOSEN,
    ResendPlan,
    compared_events,
    plan_chosen,
    plan_day,
    sent_again_since,
)
from ..outbox.sql import RECON_MISMATCHES, RECON_RUNS, row_dict


def offers(mismatches: Iterable[Mapping[str, Any]]) -> dict[int, str]:
    """What each mismatch of a run offers a person, by its id: ``none`` (Stripe holds none
    of a whole day: it can be sent again) or ``part`` (a person chooses events)."""
    out = {}
    for m in mismatches:
        found = offer(m["start"], m["end"], float(m["local_units"]), float(m["stripe_units"]))
        if found is not None:
            out[int(m["id"])] = found.value
    return out


def _mismatch(conn: Connection, mismatch_id: int) -> tuple[dict[str, Any], Bucket | None] | None:
    """A stored mismatch, and its bucket when it is a whole day (narrowed to the tenant its
    run was of, if it was of one)."""
    X = RECON_MISMATCHES.c  # noqa: N806 - table columns
    row = conn.execute(select(RECON_MISMATCHES, RECON_RUNS.c.tenant_id.label("run_tenant_id"))
                       .join(RECON_RUNS, RECON_RUNS.c.id == X.run_id)
                       .where(X.id == mismatch_id)).first()
    if row is None:
        return None
    m = row_dict(row)
    day = whole_day(m["start"], m["end"])
    bucket = None if day is None else Bucket(m["stripe_customer_id"], m["meter"], day,
                                             m["run_tenant_id"])
    return m, bucket


@dataclass(frozen=True)
class DayPage:
    """A mismatch's day: its figures, what the latest reconciliation of it found, the events
    it compared that are still sent (at most ``MAX_CHOSEN``), and those sent again since."""

    mismatch: dict[str, Any]
    bucket: Bucket | None
    #: What the latest reconciliation of the day offers: ``none`` (send it all again),
    #: ``part`` (choose events), or None (nothing: see ``refusal``).
    offer: str | None
    finding: Finding | None
    #: Why nothing can be sent again now (None: it can).
    refusal: str | None
    events: list[Any] = field(default_factory=list)
    more: bool = False
    sent_again: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def later_run(self) -> bool:
        """Whether a later reconciliation than the mismatch's compared the day since."""
        return self.finding is not None and self.finding.run_id != self.mismatch["run_id"]

    @property
    def sent_again_units(self) -> int:
        return sum(q for _, q, _ in self.sent_again)

    @property
    def audit_ids(self) -> list[int]:
        return sorted({a for _, _, a in self.sent_again})


def day_page(engine: Engine, mismatch_id: int, *, now: datetime) -> DayPage | None:
    """The day of a mismatch; None when there is no such mismatch."""
    with reading(engine) as conn:
        got = _mismatch(conn, mismatch_id)
        if got is None:
            return None
        m, bucket = got
        found = offer(m["start"], m["end"], float(m["local_units"]), float(m["stripe_units"]))
        if bucket is None or found is None:
            return DayPage(m, bucket, None, None, "Stripe has as much as ours or more, or this "
                           "is an hour at the edge of the run's window: nothing to send again.")
        latest = finding(conn, bucket)
        try:
            require_finding(conn, bucket, now=now)
        except OperationError as exc:
            return DayPage(m, bucket, None, latest, str(exc))
        assert latest is not None and latest.held is not None
        rows = compared_events(conn, bucket, latest)
        again = sent_again_since(conn, bucket, latest)
    refusal = None if rows else (
        "Nothing left to send again: every event of this day was sent again since, or is no "
        "longer sent." if again else
        "No event of this day is still sent as the reconciliation compared it.")
    return DayPage(m, bucket, latest.held.value, latest, refusal, rows[:MAX_CHOSEN],
                   len(rows) > MAX_CHOSEN, again)


@dataclass(frozen=True)
class ResendPreview:
    """What sending again would do for a mismatch's day (all of it, or the chosen events),
    or why it is refused."""

    mismatch: dict[str, Any]
    plan: ResendPlan | None
    refusal: str | None

    @property
    def held(self) -> Held | None:
        return None if self.plan is None else self.plan.finding.held


def resend_preview(engine: Engine, mismatch_id: int, ids: Sequence[int], *,
                   now: datetime) -> ResendPreview | None:
    """The preview of sending again the day of a mismatch (``ids`` empty) or the chosen
    events; None when there is no such mismatch."""
    with reading(engine) as conn:
        got = _mismatch(conn, mismatch_id)
        if got is None:
            return None
        m, bucket = got
        if bucket is None:
            return ResendPreview(m, None, "This is an hour at the edge of the run's window, not "
                                 "a whole day: nothing is sent again.")
        try:
            plan = (plan_chosen(conn, bucket, ids, now=now) if ids
                    else plan_day(conn, bucket, now=now))
        except OperationError as exc:
            return ResendPreview(m, None, str(exc))
    return ResendPreview(m, plan, None)


def mismatch_bucket(engine: Engine, mismatch_id: int) -> tuple[int, Bucket | None] | None:
    """A mismatch's run and bucket (None: not a whole day); None when there is no such
    mismatch."""
    with reading(engine) as conn:
        got = _mismatch(conn, mismatch_id)
    return None if got is None else (int(got[0]["run_id"]), got[1])
