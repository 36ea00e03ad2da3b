"""A finance person closes the month in a real browser, on SQLite and PostgreSQL: the Overview
says what reconciliation compared (never a match over nothing); the Tenants & usage page shows
a tenant remapped within the month as a row per customer, with Stripe's figure, the difference
and when they were compared beside ours; on a phone those figures stay on screen; the exported
file carries them on every row. ``billing-outbox serve`` with the drainer off, reconciliation's
findings written as a run keeps them; screenshots under test-artifacts/screenshots."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import worker_env
from sqlalchemy import insert, select
from support.seed import Seed
from support.served import chromium, served
from test_browser_dashboard import SHOTS, Stack, Visitor, _need_browser, stack_database

from webapp.db import make_engine
from webapp.models import utcnow
from webapp.outbox.reconciliation import ComparedDay, keep_days
from webapp.outbox.rollups import fold, fold_margin
from webapp.outbox.sql import RECON_MISMATCHES, RECON_RUNS, T
from webapp.users import create_user

pytestmark = pytest.mark.slow

PASSWORD = "amber-falcon-orchard-71"
FINANCE = "finance@example.com"
METER = "api_requests"


def _run(engine: Any, *, checked: int, pending: int, mismatches: int, at: datetime) -> int:
    with engine.begin() as conn:
        return int(conn.execute(insert(RECON_RUNS).values(
            started_at=at, finished_at=at, since=at - timedelta(days=35), until=at,
            trigger="schedule", buckets_checked=checked, pending=pending,
            mismatches=mismatches, calls=2, ok=True).returning(RECON_RUNS.c.id)).scalar_one())


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def stack(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """initech sent 3 + 4 units to cus_initech on the month's first two days, then was
    remapped to cus_initech2 and sent 5; acme sent 2 to cus_acme. A run that compared
    nothing came first."""
    _need_browser()
    tmp = tmp_path_factory.mktemp(f"finance-{request.param}")
    db_url, db_gen = stack_database(request.param, tmp)
    engine = make_engine(db_url)
    try:
        now = utcnow()
        first = datetime(now.year, now.month, 1, 12, tzinfo=UTC)
        days = [first + timedelta(days=i) for i in range(3)]
        if days[-1] > now - timedelta(hours=2):  # early in a month: the month before
            first = (first - timedelta(days=5)).replace(day=1)
            days = [first + timedelta(days=i) for i in range(3)]
        seed = Seed(engine)
        create_user(engine, FINANCE, PASSWORD, "viewer", now=now)
        seed.tenant("acme", "cus_acme", "Acme Corp")
        seed.tenant("initech", "cus_initech2", "Initech")
        for day, customer, tenant, q in ((days[0], "cus_initech", "initech", 3),
                                         (days[1], "cus_initech", "initech", 4),
                                         (days[2], "cus_initech2", "initech", 5),
                                         (days[0], "cus_acme", "acme", 2)):
            seed.event(status="sent", tenant_id=tenant, stripe_customer_id=customer,
                       quantity=q, occurred_at=day, sent_at=day, now=day)
        seed.event(status="rejected", tenant_id="acme", stripe_customer_id="cus_acme",
                   quantity=1, occurred_at=days[0], sent_at=days[0], rejected_at=days[0],
                   reject_code="meter_event_customer_not_found",
                   reject_message="No such customer: 'cus_acme'", now=days[0])
        fold(engine, now=now, margin=fold_margin(30))
        _run(engine, checked=0, pending=4, mismatches=0, at=now - timedelta(hours=3))
        env = worker_env(db_url, "http://127.0.0.1:9", DRAINER_ENABLED="false")
        with served(env, tmp / "serve.log") as base:
            yield Stack(base, db_url, engine, None, tmp / "serve.log", [], [], [])
    finally:
        engine.dispose()
        if db_gen is not None:
            db_gen.close()


@pytest.fixture(scope="module")
def finance(stack: Stack) -> Iterator[Visitor]:
    SHOTS.mkdir(parents=True, exist_ok=True)
    with chromium() as browser:
        v = Visitor(browser, stack)
        v.login(FINANCE)
        try:
            yield v
        finally:
            v.close()


def test_a_finance_walk_from_the_overview_to_the_months_file(
        stack: Stack, finance: Visitor, request: pytest.FixtureRequest,
        tmp_path: Path) -> None:
    backend = "pg" if "postgres" in request.node.name else "sqlite"
    page = finance.page
    finance.goto("/")
    tile = page.locator('a[data-k="reconciled"]')
    assert tile.inner_text() == "nothing compared yet"
    assert "good" not in (tile.get_attribute("class") or "")
    finance.shot(f"finance-{backend}-overview-nothing-compared")

    # Reconciliation compares the three days: Stripe lost the day of the 4 units.
    now = utcnow()
    run = _run(stack.engine, checked=4, pending=0, mismatches=1, at=now)
    rows = []
    with stack.engine.connect() as read:
        for customer, occurred, q in read.execute(select(
                T.c.stripe_customer_id, T.c.occurred_at, T.c.quantity).where(
                T.c.status == "sent")):
            lost = customer == "cus_initech" and q == 4
            rows.append(ComparedDay(customer, METER, occurred.date().isoformat(), "sum", q,
                                    0.0 if lost else q))
    with stack.engine.begin() as conn:
        keep_days(conn, run, rows, at=now)
        lost_day = next(d for d in rows if d.stripe == 0.0)
        start = datetime.fromisoformat(lost_day.day).replace(tzinfo=UTC)
        conn.execute(insert(RECON_MISMATCHES).values(
            run_id=run, tenant_id="initech", stripe_customer_id="cus_initech", meter=METER,
            formula="sum", start=start, end=start + timedelta(days=1), local_units=4,
            stripe_units=0.0, difference=-4.0))
    finance.goto("/")
    tile = page.locator('a[data-k="reconciled"]')
    assert tile.inner_text() == "1 mismatch"
    assert "4 compared, 1 mismatched, 0 pending" in page.locator(
        'a[data-k="reconciled"] + .figure-sub').inner_text()

    first = rows[0].day
    month = f"from={first[:8]}01&to={now.date().isoformat()}"
    finance.goto(f"/tenants?{month}")
    table = page.locator("#usage-table")
    old = table.locator('tr[data-customer="cus_initech"]')
    assert old.locator('[data-col="sent_quantity"]').inner_text() == "7"
    assert old.locator('[data-col="stripe_units"] [data-figure]').inner_text() == "3"
    # when it was compared, on screen (the exact time in the title)
    assert old.locator('[data-col="compared_at"]').inner_text() == f"{now:%d %b}"
    assert old.locator('[data-col="stripe_difference"]').inner_text() == "-4"
    assert "2 days compared" in (old.locator('[data-col="stripe_units"]')
                                 .get_attribute("title") or "")
    assert table.locator('tr[data-customer="cus_initech2"] [data-col="stripe_units"] '
                         '[data-figure]').inner_text() == "5"
    finance.shot(f"finance-{backend}-tenants")

    # On a phone, the sent units, Stripe's and the difference of each row stay on screen.
    phone = finance.context.new_page()
    phone.set_viewport_size({"width": 390, "height": 844})
    phone.goto(f"/tenants?{month}")
    phone.screenshot(path=str(SHOTS / f"finance-{backend}-tenants-phone.png"), full_page=True)
    shown = phone.locator("#usage-table").locator("xpath=..").bounding_box()  # the scroller
    assert shown is not None
    for col in ("sent_quantity", "stripe_units", "compared_at", "stripe_difference"):
        cell = phone.locator(f'tr[data-customer="cus_initech"] [data-col="{col}"]')
        box = cell.bounding_box()
        assert box is not None, col
        # inside the table's scroller, and inside the phone's screen as it opens
        assert shown["x"] <= box["x"] and box["x"] + box["width"] <= shown["x"] + shown["width"], (
            col, box, shown)
        assert box["x"] >= 0 and box["x"] + box["width"] <= 390, (col, box)
    # The reconciliation's ours / Stripe's / difference, and why Stripe refused events.
    for path, cols in ((f"/reconciliation?run={run}", ("ours", "stripe", "difference")),
                       ("/rejected", ("why",))):
        phone.goto(path)
        phone.screenshot(path=str(SHOTS / f"finance-{backend}-{path[1:6]}-phone.png"),
                         full_page=True)
        for col in cols:
            box = phone.locator(f'[data-col="{col}"]').first.bounding_box()
            assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390, (
                path, col, box)
    phone.close()

    with page.expect_download() as got:
        page.get_by_role("link", name="Download CSV (every row)").click()
    path = tmp_path / "usage.csv"
    got.value.save_as(path)
    lines = list(csv.reader(io.StringIO(path.read_text(), newline="")))
    header = lines[lines.index([]) + 1]
    body = [dict(zip(header, r, strict=True)) for r in lines[lines.index([]) + 2:]]
    rows_of = [r for r in body if r["Tenant"] != "Total"]
    assert len(rows_of) == 3
    for r in rows_of:  # ours, Stripe's, and when they were compared, on every row
        assert r["sent units"] and r["Stripe units"] and r["Stripe compared at (UTC)"], r
    by = {r["Stripe customer"]: r for r in rows_of}
    assert (by["cus_initech"]["Stripe units"], by["cus_initech"]["Stripe difference"]) == (
        "3", "-4")
    assert finance.errors == []
