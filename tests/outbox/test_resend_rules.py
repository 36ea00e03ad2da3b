"""The rules of sending again what Stripe lost, as tables: what Stripe holds of a day, which
buckets are whole days, and which events may go again for a finding."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from webapp.outbox.findings import Held, held, offer, whole_day
from webapp.outbox.resend import ResendCheck, resend_check
from webapp.outbox.states import ALL_STATUSES

NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
RUN = NOW - timedelta(hours=1)
MIDNIGHT = datetime(2026, 3, 8, tzinfo=UTC)


@pytest.mark.parametrize(("local", "stripe", "expected"), [
    (15, 0.0, Held.NONE), (15, 0.0000001, Held.NONE), (15, 4.0, Held.PART),
    (15, -3.0, Held.PART), (15, 15.0, Held.MORE), (15, 47.0, Held.MORE), (0, 0.0, Held.MORE),
])
def test_what_stripe_holds(local: int, stripe: float, expected: Held) -> None:
    assert held(local, stripe) is expected


@pytest.mark.parametrize(("start", "end", "expected"), [
    (MIDNIGHT, MIDNIGHT + timedelta(days=1), MIDNIGHT.date()),
    (MIDNIGHT + timedelta(hours=1), MIDNIGHT + timedelta(hours=2), None),     # a ragged hour
    (MIDNIGHT + timedelta(hours=1), MIDNIGHT + timedelta(days=1, hours=1), None),
    (MIDNIGHT, MIDNIGHT + timedelta(days=2), None),
])
def test_only_whole_utc_days_are_sent_again(start: datetime, end: datetime,
                                            expected: object) -> None:
    assert whole_day(start, end) == expected


def test_a_mismatch_offers_only_what_stripe_lacks_of_a_whole_day() -> None:
    day = (MIDNIGHT, MIDNIGHT + timedelta(days=1))
    assert offer(*day, 15, 0.0) is Held.NONE
    assert offer(*day, 15, 4.0) is Held.PART
    assert offer(*day, 7, 47.0) is None
    assert offer(MIDNIGHT, MIDNIGHT + timedelta(hours=1), 15, 0.0) is None


OK_EVENT = dict(status="sent", sent_at=RUN - timedelta(minutes=5),
                occurred_at=MIDNIGHT + timedelta(hours=10))


@pytest.mark.parametrize(("change", "expected"), [
    ({}, ResendCheck.OK),
    ({"sent_at": RUN}, ResendCheck.NOT_COMPARED),                  # sent as the run started
    ({"sent_at": RUN + timedelta(minutes=1)}, ResendCheck.NOT_COMPARED),   # sent again since
    ({"sent_at": None}, ResendCheck.NOT_COMPARED),
    ({"occurred_at": NOW - timedelta(days=35)}, ResendCheck.TOO_OLD),
    ({"occurred_at": NOW - timedelta(days=34, hours=23, minutes=45)}, ResendCheck.OK),
    *[({"status": s}, ResendCheck.NOT_SENT) for s in ALL_STATUSES if s != "sent"],
])
def test_resend_check(change: dict[str, object], expected: ResendCheck) -> None:
    args: dict[str, object] = {**OK_EVENT, **change}
    assert resend_check(compared_at=RUN, now=NOW, **args) is expected  # type: ignore[arg-type]
