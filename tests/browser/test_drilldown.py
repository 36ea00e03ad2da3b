"""Drill-down in a real browser: from the Overview a count leads to exactly its events, the
35-day alert leads to its rows, and "requeue all matching" lands on a page that follows those
events until they are settled. ``billing-outbox serve`` on PostgreSQL with the drainer off, so
the numbers stay still while they are compared; screenshots under test-artifacts/screenshots.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from conftest import _pg_database, worker_env
from sqlalchemy import update
from support.served import chromium, served
from test_browser_dashboard import SHOTS, Stack, Visitor, _need_browser

from webapp.db import make_engine
from webapp.models import OutboxEvent, utcnow
from webapp.outbox.states import MAX_AGE
from webapp.users import create_user

pytestmark = pytest.mark.slow

PASSWORD = "amber-falcon-orchard-71"
OPERATOR = "drill-operator@example.com"
T = OutboxEvent.__table__
N_PENDING, N_NEAR, N_DEAD, N_SENT = 4, 2, 3, 5


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Seeded events (pending, near the 35-day limit for an unmapped tenant, dead, sent) and
    ``billing-outbox serve --workers 1`` with the in-app drainer off."""
    _need_browser()
    from support.seed import Seed

    db_gen = _pg_database()
    db_url = next(db_gen)
    engine = make_engine(db_url)
    log_path = tmp_path_factory.mktemp("drill") / "serve.log"
    try:
        now = utcnow()
        seed = Seed(engine)
        seed.tenant("acme", "cus_acme", "Acme Corp")
        create_user(engine, OPERATOR, PASSWORD, "operator", now=now)
        seed.events(N_PENDING, status="pending")
        near = seed.events(N_NEAR, status="pending", tenant_id="initech",
                           occurred_at=now - MAX_AGE + timedelta(days=2))
        dead = seed.events(N_DEAD, status="dead")
        seed.events(N_SENT, status="sent", stripe_customer_id="cus_acme")
        env = worker_env(db_url, "http://127.0.0.1:9", DRAINER_ENABLED="false")
        with served(env, log_path) as base:
            yield Stack(base, db_url, engine, None, log_path, [], dead, near)
    finally:
        engine.dispose()
        db_gen.close()


@pytest.fixture(scope="module")
def operator(stack: Stack) -> Iterator[Visitor]:
    SHOTS.mkdir(parents=True, exist_ok=True)
    with chromium() as browser:
        v = Visitor(browser, stack)
        page = v.page
        v.goto("/login")
        page.get_by_label("Email").fill(OPERATOR)
        page.get_by_label("Password").fill(PASSWORD)
        with page.expect_navigation():
            page.get_by_role("button", name="Log in").click()
        try:
            yield v
        finally:
            v.close()


def rows(page: Any) -> Any:
    return page.locator("#events-table tbody tr")


def test_a_count_on_the_overview_leads_to_that_many_rows(operator: Visitor) -> None:
    from playwright.sync_api import expect

    page = operator.page
    operator.goto("/")
    with page.expect_navigation():
        page.get_by_role("link", name=re.compile(rf"^\s*dead\s+{N_DEAD}\b")).click()
    assert page.url.endswith("/events?status=dead"), page.url
    expect(rows(page)).to_have_count(N_DEAD)
    expect(page.locator("#events-count")).to_contain_text(f"{N_DEAD} events match")
    expect(page.locator("#events-chips")).to_contain_text("status is dead")
    operator.shot("drill-01-dead-from-overview")

    operator.goto("/")
    with page.expect_navigation():
        page.get_by_role("link", name=re.compile(rf"^\s*pending\s+{N_PENDING + N_NEAR}\b")
                         ).click()
    expect(rows(page)).to_have_count(N_PENDING + N_NEAR)
    # Removing the chip widens the list to every event.
    with page.expect_navigation():
        page.get_by_role("link", name=re.compile("status is pending")).click()
    expect(rows(page)).to_have_count(N_PENDING + N_NEAR + N_DEAD + N_SENT)
    # A bar of the retries histogram opens the events it counts.
    operator.goto("/retries")
    with page.expect_navigation():
        page.locator('rect[data-href="/events?status=dead&attempts=1"]').click()
    expect(rows(page)).to_have_count(N_DEAD)
    # On a phone the list fits the width (its table scrolls in its own box).
    page.set_viewport_size({"width": 390, "height": 844})
    operator.goto("/events?status=pending&tenant=acme&due=1")
    operator.shot("drill-05-events-phone")
    page.set_viewport_size({"width": 1280, "height": 900})
    operator.assert_clean()


def test_a_usage_figure_leads_to_those_events(operator: Visitor) -> None:
    """Finance's question "what are these 5 sent events of Acme?": the figure on the usage
    page opens exactly them, with the period and the tenant shown as filters."""
    from playwright.sync_api import expect

    page = operator.page
    operator.goto("/tenants")
    with page.expect_navigation():
        page.get_by_role("link", name=f"{N_SENT} sent events of acme, api_requests").click()
    expect(rows(page)).to_have_count(N_SENT)
    expect(page.locator("#events-count")).to_contain_text(f"{N_SENT} events match")
    chips = page.locator("#events-chips")
    expect(chips).to_contain_text("status is sent")
    expect(chips).to_contain_text("acme")
    operator.shot("drill-06-usage-figure")
    operator.assert_clean()


def test_the_35_day_alert_leads_to_its_rows_and_its_fix(operator: Visitor,
                                                        stack: Stack) -> None:
    from playwright.sync_api import expect

    page = operator.page
    operator.goto("/")
    alert = page.locator(".alert", has_text="within 7 days of the 35-day limit")
    expect(alert).to_contain_text(f"{N_NEAR} events")
    with page.expect_navigation():
        alert.get_by_role("link", name="Show these events").click()
    expect(rows(page)).to_have_count(N_NEAR)
    shown = sorted(int(i) for i in rows(page).evaluate_all(
        "rs => rs.map(r => r.dataset.id)"))
    assert shown == sorted(stack.unmapped_ids)
    operator.shot("drill-02-near-limit-events")

    operator.goto("/")
    tenant_alert = page.locator(".alert", has_text="Tenant initech has no Stripe customer")
    with page.expect_navigation():
        tenant_alert.get_by_role("link", name="Map the tenant").click()
    assert page.url.endswith("/mappings?tenant=initech"), page.url
    operator.assert_clean()


def test_a_bulk_requeue_lands_on_a_page_that_follows_the_events(operator: Visitor,
                                                                 stack: Stack) -> None:
    from playwright.sync_api import expect

    page = operator.page
    operator.goto("/dead-letters")
    with page.expect_navigation():
        page.get_by_role("link", name=re.compile("Requeue all matching")).click()
    with page.expect_navigation():
        page.get_by_role("button", name=f"Requeue {N_DEAD} events").click()
    assert re.search(r"/events\?audit=\d+$", page.url), page.url
    summary = page.locator(".tracking-summary")
    expect(summary).to_contain_text(f"{N_DEAD} requeued")
    expect(summary).to_contain_text(f"0 sent, {N_DEAD} waiting, 0 failed again")
    expect(rows(page)).to_have_count(N_DEAD)
    operator.shot("drill-03-requeue-tracking")

    # The drainer is off here: move them as it would, and watch the summary follow by itself.
    page.evaluate("window.__sameDocument = true")
    with stack.engine.begin() as conn:
        conn.execute(update(T).where(T.c.id.in_(stack.dead_ids[:2])).values(status="sent"))
        conn.execute(update(T).where(T.c.id == stack.dead_ids[2]).values(status="dead"))
    expect(summary).to_contain_text("2 sent, 0 waiting, 1 failed again", timeout=12_000)
    assert page.evaluate("window.__sameDocument") is True
    expect(page.locator("#tracking")).to_contain_text("All of them are settled")
    operator.shot("drill-04-requeue-settled")
    operator.assert_clean()
