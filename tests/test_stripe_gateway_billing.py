"""Issue 30: the gateway's reads of subscriptions and invoices, through the real SDK against the
fake: every page, an invoice's lines past the ten embedded (and a subscription's items past
those embedded) read from their own list, licensed items left out,
every status, the lines' periods; a failure is one ``StripeCallFailed``."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from conftest import make_settings

from webapp.stripe_gateway import StripeCallFailed
from webapp.worker import gateway_from

METERS = [f"meter_{i}" for i in range(11)]      # one more than a list embeds


@pytest.fixture
def gateway(fake_stripe: Any, sqlite_url: str) -> Any:
    for name in METERS:
        fake_stripe.add_meter(name)
    return gateway_from(make_settings(sqlite_url, stripe_api_base=fake_stripe.base_url,
                                      stripe_meter_events_base=fake_stripe.meter_events_url))


def test_every_subscription_and_every_metered_item_is_read(fake_stripe: Any,
                                                           gateway: Any) -> None:
    start = int(time.time()) - 3600
    big = fake_stripe.create_subscription("cus_big", METERS, period_start=start,
                                          period_seconds=7200, licensed=True)
    small = fake_stripe.create_subscriptions([f"cus_{i:03d}" for i in range(150)],
                                             [METERS[0]], period_start=start)
    gone = fake_stripe.create_subscription("cus_gone", [METERS[1]], period_start=start)
    fake_stripe.cancel_subscription(gone)
    calls = gateway.calls
    items = gateway.list_subscriptions()
    # 152 subscriptions: two pages of 100 (each with its items embedded, all of them).
    assert gateway.calls - calls == 2
    by_sub: dict[str, list[Any]] = {}
    for item in items:
        by_sub.setdefault(item.subscription_id, []).append(item)
    assert set(by_sub) == {big, gone, *small}
    # Were a subscription's items embedded ten at most, the rest are read from their list.
    fake_stripe.set_embedded_items(10)
    calls = gateway.calls
    again = gateway.list_subscriptions()
    assert gateway.calls - calls == 3
    assert sorted((i.id, i.meter_id) for i in again) == sorted((i.id, i.meter_id) for i in items)
    assert sorted(i.meter_id for i in by_sub[big]) == sorted(
        fake_stripe.meter_id(m) for m in METERS)         # the licensed item left out
    assert {i.subscription_status for i in by_sub[gone]} == {"canceled"}
    first = by_sub[big][0]
    assert first.stripe_customer_id == "cus_big"
    assert first.period_start == datetime.fromtimestamp(start, UTC)
    assert first.period_end - first.period_start == timedelta(seconds=7200)


def test_invoices_since_a_time_with_every_lines_period(fake_stripe: Any, gateway: Any) -> None:
    start = int(time.time()) - 7200
    sub = fake_stripe.create_subscription("cus_big", METERS, period_start=start,
                                          period_seconds=3600, grace_seconds=3 * 86400)
    fake_stripe.create_subscription("cus_old", [METERS[0]], period_start=start - 86400 * 3,
                                    period_seconds=86400)
    listed = gateway.list_invoices(created_gte=datetime.fromtimestamp(start, UTC))
    mine = [i for i in listed if i.subscription_id == sub]
    assert len(mine) == 2                           # two hourly periods ended
    assert {i.status for i in mine} == {"draft"}
    assert all(i.finalizes_at is not None and i.finalized_at is None for i in mine)
    for invoice in mine:
        assert len(invoice.lines) == len(METERS)    # 11 lines: the last read from /lines
        assert {line.end - line.start for line in invoice.lines} == {timedelta(hours=1)}
    assert not any(i.stripe_customer_id == "cus_old" and i.created <
                   datetime.fromtimestamp(start, UTC) for i in listed)

    one = mine[0]
    fake_stripe.finalize_invoice(one.id)
    again = gateway.retrieve_invoice(one.id)
    assert again is not None and again.status == "open" and again.finalized_at is not None
    assert again.finalizes_at is None and len(again.lines) == len(METERS)
    with pytest.raises(StripeCallFailed, match="reading invoice in_nope"):
        gateway.retrieve_invoice("in_nope")


def test_a_refused_key_fails_the_whole_read(fake_stripe: Any, gateway: Any) -> None:
    fake_stripe.create_subscription("cus_a", [METERS[0]], period_start=int(time.time()))
    fake_stripe.set_auth_failure(401)
    with pytest.raises(StripeCallFailed, match="listing subscriptions"):
        gateway.list_subscriptions()
    with pytest.raises(StripeCallFailed, match="listing invoices"):
        gateway.list_invoices(created_gte=datetime.now(UTC))
