"""The Overview's chart in a real browser: pick a range, read the axes, open the table view
(the same server, fixtures and screenshot rules as ``test_browser_dashboard``)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from support.seed import Seed
from test_browser_dashboard import (  # noqa: F401 - fixtures, used by name
    CLIPPED_TICKS,
    SHOTS,
    VIEWER,
    Stack,
    Visitor,
    browser_stack,
    chromium,
)

from webapp.models import utcnow

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def viewer(chromium: Any, browser_stack: Stack) -> Iterator[Visitor]:  # noqa: F811
    v = Visitor(chromium, browser_stack)
    yield v
    v.close()


def test_pick_a_range_read_the_axes_and_the_table(viewer: Visitor,
                                                  browser_stack: Stack) -> None:  # noqa: F811
    from playwright.sync_api import expect

    now = utcnow()
    seed = Seed(browser_stack.engine)
    for days_ago, n in ((0, 3), (2, 5), (5, 2)):
        at = now - timedelta(days=days_ago)
        seed.events(n, status="sent", tenant_id="acme", occurred_at=at, sent_at=at)
    page = viewer.page
    viewer.login(VIEWER)

    picker = page.get_by_role("group", name="Chart range")
    with page.expect_navigation():
        picker.get_by_role("link", name="7 d").click()
    assert page.url.endswith("/?range=7d"), page.url
    expect(picker.get_by_role("link", name="7 d")).to_have_attribute("aria-current", "true")
    chart = page.locator("#sent-chart")
    expect(chart.locator("figcaption")).to_contain_text("by the day they occurred, last 7 days")
    # Round ticks on the count axis, a date under every day, both axes titled.
    assert chart.locator("text.y-tick").all_text_contents() == ["0", "1", "2", "3", "4", "5"]
    days = chart.locator("text.x-tick").all_text_contents()
    assert len(days) == 7 and all(re.fullmatch(r"[A-Z][a-z]{2} \d{1,2}", d) for d in days)
    assert f"{now:%b} {now.day}" == days[-1]
    expect(chart.locator("text.axis-title").last).to_have_text("day the events occurred (UTC)")
    # The live panel refreshes with the same range.
    assert page.locator("#overview-live").get_attribute("hx-get") == "/?range=7d"

    # The same numbers as a table, one click away.
    table = chart.locator("details.chart-table table")
    expect(table).to_be_hidden()
    chart.get_by_text("Show as table").click()
    expect(table).to_be_visible()
    rows = table.locator("tbody tr")
    expect(rows).to_have_count(7)
    expect(rows.last.locator("td")).to_have_text("3")
    assert sum(int(c) for c in table.locator("tbody td").all_inner_texts()) == 10
    viewer.shot("charts-overview-7d-table")

    page.set_viewport_size({"width": 390, "height": 844})
    viewer.goto("/?range=1h")
    expect(page.locator("#sent-chart figcaption")).to_contain_text("per minute, last hour")
    # On a phone the chart fits the screen and no label is cut off. (Only the chart is
    # checked here: the page's own fit at 390 px is the layout's business.)
    box = page.locator("#sent-chart svg").bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390
    assert page.evaluate(CLIPPED_TICKS) == []
    page.screenshot(path=str(SHOTS / "charts-overview-1h-phone.png"), full_page=True)
    viewer.assert_clean()


def test_a_tenant_opened_from_the_usage_table_keeps_its_period(
        viewer: Visitor, browser_stack: Stack) -> None:  # noqa: F811
    from playwright.sync_api import expect

    page = viewer.page
    viewer.ensure_login(VIEWER)
    page.set_viewport_size({"width": 1280, "height": 900})
    viewer.goto("/tenants")
    with page.expect_navigation():
        page.get_by_role("link", name="Last 7 days").click()
    start, end = re.search(r"from=([\d-]+)&to=([\d-]+)", page.url).groups()
    with page.expect_navigation():
        page.locator("#usage-table").get_by_role("link", name="acme", exact=True).click()
    expect(page.locator(".period-line")).to_contain_text(f"{start} – {end}")
    expect(page.get_by_role("link", name="Last 7 days")).to_have_attribute("aria-current", "true")
    chart = page.locator("#tenant-daily")
    expect(chart.locator("figcaption")).to_contain_text("Sent events by the day they occurred")
    assert len(chart.locator("text.x-tick").all_text_contents()) == 7
    viewer.shot("charts-tenant-last-7-days")
    with page.expect_navigation():
        page.get_by_role("link", name="All tenants, same period").click()
    assert f"from={start}&to={end}" in page.url
    viewer.assert_clean()
