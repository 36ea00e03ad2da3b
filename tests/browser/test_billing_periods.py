"""Finance watches a month close, and an operator bills what came too late, in a real
browser on SQLite and PostgreSQL, on a desktop and a 390 px phone: the status line warns while
a draft invoice finalizes with usage unsent; the periods page says what each draft's usage
waits for, each figure a link to exactly those events; the late-usage page lists what reached
Stripe after its invoice was final, with units per customer; an operator bills some on the
next invoice and writes the rest off. ``billing-outbox serve`` with the drainer off, the
billing tables written as the refresher keeps them; screenshots under
test-artifacts/screenshots."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from conftest import worker_env
from sqlalchemy import select
from support.billing_rows import closing_draft, finalized_period
from support.served import chromium, served
from test_browser_dashboard import SHOTS, Stack, Visitor, _need_browser, stack_database

from webapp.db import make_engine
from webapp.models import LateUsage, utcnow
from webapp.users import create_user

pytestmark = pytest.mark.slow

PASSWORD = "amber-falcon-orchard-71"
FINANCE = "finance@example.com"
OPS = "ops@example.com"


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def stack(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    _need_browser()
    tmp = tmp_path_factory.mktemp(f"periods-{request.param}")
    db_url, db_gen = stack_database(request.param, tmp)
    engine = make_engine(db_url)
    try:
        now = utcnow()
        create_user(engine, FINANCE, PASSWORD, "viewer", now=now)
        create_user(engine, OPS, PASSWORD, "operator", now=now)
        late = finalized_period(engine)
        draft = closing_draft(engine, timedelta(minutes=25))
        env = worker_env(db_url, "http://127.0.0.1:9", DRAINER_ENABLED="false")
        with served(env, tmp / "serve.log") as base:
            yield Stack(base, db_url, engine, None, tmp / "serve.log", [], [], [],
                        state={"late": late, "draft": draft})
    finally:
        engine.dispose()
        if db_gen is not None:
            db_gen.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    SHOTS.mkdir(parents=True, exist_ok=True)
    with chromium() as b:
        yield b


def _on_phone(v: Visitor, path: str, name: str, cols: tuple[str, ...]) -> None:
    """The page on a 390 px phone: nothing wider than the screen, and the figures a person
    comes for on it as the page opens (inside the table's scroller)."""
    phone = v.context.new_page()
    try:
        phone.set_viewport_size({"width": 390, "height": 844})
        phone.goto(path)
        overflow = phone.evaluate(
            "document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 0, f"{path}: {overflow}px wider than the phone"
        phone.screenshot(path=str(SHOTS / f"{name}-phone.png"), full_page=True)
        for col in cols:
            box = phone.locator(f'[data-col="{col}"]').first.bounding_box()
            assert box is not None, col
            assert box["x"] >= 0 and box["x"] + box["width"] <= 390, (path, col, box)
    finally:
        phone.close()


def test_finance_sees_the_draft_at_risk_and_what_it_waits_for(
        stack: Stack, browser: Any, request: pytest.FixtureRequest) -> None:
    backend = "pg" if "postgres" in request.node.name else "sqlite"
    v = Visitor(browser, stack)
    try:
        v.login(FINANCE)
        page = v.page
        line = page.locator("#invoice-risk-line")
        assert "60 unit(s) of 1 customer(s) are not at Stripe" in line.inner_text()
        assert "finalizes in 2" in line.inner_text()          # 24-25 min
        assert "may miss their invoice" in page.locator(".alerts").inner_text()
        v.shot(f"periods-{backend}-overview-risk")
        with page.expect_navigation():
            page.get_by_role("link", name="Billing periods").click()
        drafts = page.locator("#drafts-table")
        row = drafts.locator("tr", has_text="in_B")
        assert row.locator('[data-col="unsent"]').inner_text().startswith("60 unit(s)")
        assert "3 event(s)" in row.locator('[data-col="unsent"]').inner_text()
        waits = row.locator('[data-col="waits"]').inner_text()
        assert "2 on the way" in waits and "1 wait for a person" in waits
        v.shot(f"periods-{backend}-periods")
        with page.expect_navigation():
            row.get_by_role("link", name="1 wait for a person").click()
        dead = stack.state["draft"][0]
        assert page.locator(f'a[href="/events/{dead}"]').count() == 1
        for other in stack.state["draft"][1:]:
            assert page.locator(f'a[href="/events/{other}"]').count() == 0
        v.shot(f"periods-{backend}-period-events")
        v.goto("/periods/late")
        assert page.locator("#late-per-customer").inner_text().count("cus_A") == 1
        assert page.get_by_role("button", name="Bill selected on the next invoice").count() == 0
        v.shot(f"periods-{backend}-late-viewer")
        _on_phone(v, "/periods", f"periods-{backend}-periods", ("unsent", "finalizes"))
        v.assert_clean()
    finally:
        v.close()


def test_an_operator_bills_late_usage_next_and_writes_off_the_rest(
        stack: Stack, browser: Any, request: pytest.FixtureRequest) -> None:
    backend = "pg" if "postgres" in request.node.name else "sqlite"
    late = stack.state["late"]
    v = Visitor(browser, stack)
    try:
        v.login(OPS)
        page = v.page
        v.goto("/periods/late")
        _on_phone(v, "/periods/late", f"periods-{backend}-late", ())
        for event_id in late["sent_late"]:
            page.locator(f'#late-table tr[data-id="{event_id}"] input[name="ids"]').check()
        page.get_by_label("Note").fill("agreed with the customer: bill on the next invoice")
        with page.expect_navigation():
            page.get_by_role("button", name="Bill selected on the next invoice").click()
        assert "Billing 2 late event(s) on the next invoice" in page.locator(
            ".flashes").inner_text()
        v.shot(f"periods-{backend}-late-billed")
        unsent = late["unsent"][0]
        page.locator(f'#late-table tr[data-id="{unsent}"] input[name="ids"]').check()
        page.get_by_label("Note").fill("a test event, never billable")
        page.get_by_label("Reason").select_option("written_off")
        with page.expect_navigation():
            page.get_by_role("button", name="Write off selected").click()
        assert "Wrote off 1 late event(s)" in page.locator(".flashes").inner_text()
        assert page.locator("#no-late-usage").count() == 1
        v.shot(f"periods-{backend}-late-done")
        with stack.engine.connect() as conn:
            handled = {r.event_id: r.action for r in conn.execute(select(LateUsage.__table__))}
        assert handled == {**{i: "billed_next" for i in late["sent_late"]},
                           unsent: "written_off"}
        v.assert_clean()
    finally:
        v.close()
