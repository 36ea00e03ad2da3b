"""Finance at month end, in a real browser on SQLite and PostgreSQL, on a desktop and a 390 px
phone: from Billing periods to Invoices, each finalized line with its verdict in plain words;
a figure opens exactly the events behind it; an event's page says where its usage ended; the
Overview says what will be on no invoice and who is billed twice. ``billing-outbox serve`` with
the drainer off, the billing tables written as the refresher and the judge keep them;
screenshots under test-artifacts/screenshots."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from conftest import worker_env
from sqlalchemy import Engine, update
from sqlalchemy.orm import Session
from support.billing_rows import finalized_period
from support.served import chromium, served
from test_browser_dashboard import SHOTS, Stack, Visitor, _need_browser, stack_database

from webapp.db import make_engine
from webapp.models import OutboxEvent, utcnow
from webapp.outbox import billing_watch, enqueue_usage, invoices, stripe_runs
from webapp.outbox.invoices import MeteredItem
from webapp.outbox.operations import set_tenant
from webapp.users import create_user

pytestmark = pytest.mark.slow

PASSWORD = "amber-falcon-orchard-71"
FINANCE = "finance@example.com"
T = OutboxEvent.__table__


def _month_end(engine: Engine) -> dict[str, Any]:
    """acme's finalized line (Stripe billed 10 where 3 were taken in time: over; 3 units
    late), a customer with no subscription (usage on no invoice), one with two items on the
    meter (billed twice)."""
    now = utcnow().replace(microsecond=0)
    ids: dict[str, Any] = dict(finalized_period(engine, now=now))
    set_tenant(engine, "bare", stripe_customer_id="cus_N", name="Bare Co", now=now)
    set_tenant(engine, "twice", stripe_customer_id="cus_W", name=None, now=now)
    invoices.store_items(engine, [
        MeteredItem(f"si_W{n}", f"sub_W{n}", "cus_W", "active", "mtr_api", "price_1",
                    now - timedelta(days=3), now + timedelta(days=27)) for n in (1, 2)],
        now=now, complete=False)
    with Session(engine) as db, db.begin():
        ids["bare"] = enqueue_usage(db, tenant_id="bare", quantity=4, idempotency_key="bare0",
                                    occurred_at=now - timedelta(hours=1), now=now).id
    with engine.begin() as conn:
        conn.execute(update(T).where(T.c.id == ids["bare"]).values(
            status="sent", sent_at=now - timedelta(minutes=50), stripe_customer_id="cus_N"))
    stripe_runs.record_run(engine, stripe_runs.SUBSCRIPTIONS_MARK, ok=True, detail=None,
                           now=now)
    billing_watch.keep_late(engine, now=now)
    billing_watch.keep_unbilled(engine, now=now)
    billing_watch.keep_overlaps(engine, now=now)
    return ids


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def stack(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    _need_browser()
    tmp = tmp_path_factory.mktemp(f"invoices-{request.param}")
    db_url, db_gen = stack_database(request.param, tmp)
    engine = make_engine(db_url)
    try:
        create_user(engine, FINANCE, PASSWORD, "viewer", now=utcnow())
        state = _month_end(engine)
        env = worker_env(db_url, "http://127.0.0.1:9", DRAINER_ENABLED="false")
        with served(env, tmp / "serve.log") as base:
            yield Stack(base, db_url, engine, None, tmp / "serve.log", [], [], [], state=state)
    finally:
        engine.dispose()
        if db_gen is not None:
            db_gen.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    SHOTS.mkdir(parents=True, exist_ok=True)
    with chromium() as b:
        yield b


def test_finance_checks_each_invoice_line_and_opens_its_events(
        stack: Stack, browser: Any, request: pytest.FixtureRequest) -> None:
    backend = "pg" if "postgres" in request.node.name else "sqlite"
    v = Visitor(browser, stack)
    try:
        v.login(FINANCE)
        page = v.page
        alerts = page.locator(".alerts").inner_text()
        assert "4 units will be on no invoice" in alerts
        assert "1 customer is billed twice for the same usage" in alerts
        v.shot(f"invoices-{backend}-overview")
        with page.expect_navigation():
            page.get_by_role("link", name="Billing periods").click()
        with page.expect_navigation():
            page.locator("#invoices-link").click()
        row = page.locator('#invoice-lines tr[data-invoice="in_A"]')
        assert "Over" in row.locator('[data-col="verdict"]').inner_text()
        assert "7 unit(s) more" in row.locator('[data-col="verdict"]').inner_text()
        assert row.locator('[data-col="invoiced"]').inner_text().startswith("10")
        assert page.locator("#unbilled-callout").is_visible()
        assert "cus_W" in page.locator("#overlaps-callout").inner_text()
        v.shot(f"invoices-{backend}-invoices")
        with page.expect_navigation():
            row.locator('[data-col="late"] a').click()
        late = stack.state["sent_late"] + stack.state["unsent"]
        for event_id in late:
            assert page.locator(f'a[href="/events/{event_id}"]').count() == 1
        for event_id in stack.state["on_time"]:
            assert page.locator(f'a[href="/events/{event_id}"]').count() == 0
        assert "on the line of invoice in_A" in page.locator(".chips, body").first.inner_text()
        v.shot(f"invoices-{backend}-late-events")
        with page.expect_navigation():
            page.locator(f'a[href="/events/{stack.state["sent_late"][0]}"]').first.click()
        assert "reached Stripe after invoice in_A was final" in page.locator(
            "#status-words").inner_text()
        v.shot(f"invoices-{backend}-event")
        v.goto("/invoices?verdict=over")
        assert page.locator('#invoice-lines tr[data-verdict="over"]').count() == 1
        _phone(v, "/invoices", f"invoices-{backend}-invoices")
        v.assert_clean()
    finally:
        v.close()


def _phone(v: Visitor, path: str, name: str) -> None:
    """The page on a 390 px phone: nothing wider than the screen; the tenant, the verdict and
    Stripe's figure on it as the page opens (inside the table's scroller)."""
    phone = v.context.new_page()
    try:
        phone.set_viewport_size({"width": 390, "height": 844})
        phone.goto(path)
        overflow = phone.evaluate(
            "document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 0, f"{path}: {overflow}px wider than the phone"
        phone.screenshot(path=str(SHOTS / f"{name}-phone.png"), full_page=True)
        for col in ("verdict", "invoiced"):
            box = phone.locator(f'#invoice-lines [data-col="{col}"]').first.bounding_box()
            assert box is not None, col
            assert box["x"] >= 0 and box["x"] + box["width"] <= 390, (path, col, box)
    finally:
        phone.close()
