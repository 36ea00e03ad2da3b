"""Usage by the customer it went to, and Stripe's figure beside ours: a tenant remapped within
the period has a row per customer (page, CSV, ``usage --json``); reconciliation's figures stand
beside each row; its links and search find the old customer's events. Through the real SDK
against the fake, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from conftest import cli, make_settings, wait_for, worker_env
from sqlalchemy import Engine, insert, select, update
from sqlalchemy.orm import Session
from support.fake_stripe import FakeStripe

from webapp.app import create_app
from webapp.db import reading
from webapp.models import AuditEntry, OutboxEvent, Tenant, utcnow
from webapp.outbox import enqueue_usage, operations
from webapp.outbox.sql import RECON_RUNS
from webapp.read import tenants as reads
from webapp.read.compared import meter_totals
from webapp.worker import Drainer, gateway_from, reconcile

from .conftest import csrf_of, login
from .test_tenants import read_usage_csv

OUTBOX = OutboxEvent.__table__

DAY = timedelta(days=1)
METER = "api_requests"


@pytest.fixture
def fake() -> Iterator[FakeStripe]:
    with FakeStripe() as f:
        for customer in ("cus_initech", "cus_initech2"):
            f.create_customer(customer)
        yield f


@pytest.fixture
def settings(db_url: str, fake: FakeStripe) -> Any:
    return make_settings(db_url, stripe_api_base=fake.base_url, reconcile_settle_seconds=3600)


def midday(days_ago: int) -> datetime:
    """Noon ``days_ago`` days back; 0: the latest event a reconciliation run now can see,
    noon today or the last minute of the last whole hour, whichever is earlier (before 1 am
    that is yesterday: the hour a run reads ends at the current hour's start, and an event
    may not lie ahead)."""
    now = utcnow()
    noon = datetime(now.year, now.month, now.day, 12, tzinfo=UTC)
    if days_ago == 0:
        return min(noon, now.replace(minute=0, second=0, microsecond=0) - timedelta(minutes=1))
    return noon - days_ago * DAY


def send(engine: Engine, settings: Any, tenant: str, quantities: list[tuple[int, int]],
         prefix: str) -> list[int]:
    """Enqueue (days ago, quantity) events for ``tenant`` and drain them all."""
    with Session(engine) as db, db.begin():
        ids = [int(enqueue_usage(db, tenant_id=tenant, quantity=q, meter=METER,
                                 idempotency_key=f"{prefix}-{n}", occurred_at=midday(d)).id)
               for n, (d, q) in enumerate(quantities)]
    drainer = Drainer(engine, settings, gateway_from(settings))
    try:
        while drainer.drain_once().claimed:
            pass
    finally:
        drainer.close()
    return ids


@pytest.fixture
def remapped(engine: Engine, fake: FakeStripe, settings: Any) -> dict[str, Any]:
    """initech sends 3 + 4 units to cus_initech (3 and 2 days ago), is remapped to
    cus_initech2, sends 5 more (yesterday) and has 1 waiting; Stripe loses the day of the 4
    units; reconciliation compares every settled day."""
    operations.set_tenant(engine, "initech", stripe_customer_id="cus_initech", name="Initech",
                          now=utcnow())
    old = send(engine, settings, "initech", [(3, 3), (2, 4)], "old")
    operations.set_tenant(engine, "initech", stripe_customer_id="cus_initech2",
                          name="Initech", now=utcnow())
    new = send(engine, settings, "initech", [(1, 5)], "new")
    with Session(engine) as db, db.begin():
        enqueue_usage(db, tenant_id="initech", quantity=7, meter=METER,
                      idempotency_key="waiting", occurred_at=midday(0))
    fake.forget("cus_initech", METER, midday(2).date())
    gateway = gateway_from(settings)
    assert gateway is not None
    try:  # two hours on: every state change has settled (RECONCILE_SETTLE_SECONDS 3600)
        run = reconcile(engine, gateway, settings, trigger="cli",
                        now=utcnow() + timedelta(hours=2))
    finally:
        gateway.close()
    return {"old": old, "new": new, "run": run, "start": midday(5).date(),
            "end": midday(0).date()}


def test_a_remapped_tenant_has_a_row_per_customer_with_stripes_figure(
        engine: Engine, remapped: dict[str, Any]) -> None:
    rows = {r.stripe_customer_id: r for r in reads.tenant_usage(
        engine, start=remapped["start"], end=remapped["end"]).rows}

    assert set(rows) == {"cus_initech", "cus_initech2"}
    old, new = rows["cus_initech"], rows["cus_initech2"]
    assert (old.quantity["sent"], old.events["sent"]) == (7, 2)
    assert (new.quantity["sent"], new.quantity["pending"]) == (5, 7)  # the waiting one: new
    # Stripe lost the day of the 4 units: its figure over the two days compared is 3.
    assert (old.stripe_units, old.compared_units, old.compared_days) == (3.0, 7, 2)
    assert old.difference == -4 and old.compared_at is not None
    assert (new.stripe_units, new.compared_units, new.compared_days) == (5.0, 5, 1)
    assert new.difference == 0
    run = remapped["run"]
    assert [(m.stripe_customer_id, m.local_units, m.stripe_units)
            for m in run.comparison.mismatches] == [("cus_initech", 4, 0.0)]


def test_the_page_the_csv_and_usage_json_show_each_customer_and_stripes_figure(
        db_url: str, engine: Engine, fake: FakeStripe, remapped: dict[str, Any],
        client_as: Any) -> None:
    period = f"from={remapped['start'].isoformat()}&to={remapped['end'].isoformat()}"
    viewer = client_as("viewer")
    html = viewer.get(f"/tenants?{period}").get_data(as_text=True)
    for customer, stripe, diff in (("cus_initech", ">3", ">-4"), ("cus_initech2", ">5", ">=")):
        row = html.split(f'data-customer="{customer}">')[1].split("</tr>")[0]
        cell = row.split('data-col="stripe_units"')[1].split("</td>")[0]
        assert cell.split("data-figure")[1].split("</span>")[0].endswith(stripe)
        assert 'data-col="compared_at">' in cell
        assert row.split('data-col="stripe_difference"')[1].split("</td>")[0].endswith(diff)
    _, header, rows, totals = read_usage_csv(viewer.get(f"/tenants.csv?{period}")
                                             .get_data(as_text=True))
    by = {r["Stripe customer"]: r for r in rows}
    assert set(by) == {"cus_initech", "cus_initech2"}
    assert (by["cus_initech"]["sent units"], by["cus_initech"]["Stripe units"],
            by["cus_initech"]["Stripe difference"]) == ("7", "3", "-4")
    assert by["cus_initech"]["Stripe compared days"] == "2"
    assert by["cus_initech"]["Stripe compared at (UTC)"] != ""
    assert (totals[METER]["sent units"], totals[METER]["Stripe units"]) == ("12", "8")
    out = cli("usage", "--json", "--from", remapped["start"].isoformat(), "--to",
              remapped["end"].isoformat(), env=worker_env(db_url, fake.base_url))
    assert out.returncode == 0, out.stderr
    json_rows = {r["stripe_customer_id"]: r for r in json.loads(out.stdout)["rows"]}
    assert json_rows["cus_initech"]["stripe_units"] == 3
    assert json_rows["cus_initech"]["compared_units"] == 7
    assert json_rows["cus_initech"]["compared_at"] is not None
    assert json_rows["cus_initech2"]["stripe_units"] == 5


def test_reconciliations_link_and_search_find_the_old_customers_events(
        engine: Engine, remapped: dict[str, Any], client_as: Any) -> None:
    viewer = client_as("viewer")
    page = viewer.get("/reconciliation").get_data(as_text=True)
    link = page.split("our events")[0].rsplit('href="', 1)[1].split('"')[0]
    listed = viewer.get(link.replace("&amp;", "&")).get_data(as_text=True)
    assert f'href="/events/{remapped["old"][1]}"' in listed and "0 events match" not in listed
    # The one tenant whose usage went to the old customer, mapped elsewhere now: search
    # finds it (alone, it opens its page).
    found = viewer.get("/search?q=cus_initech")
    assert found.status_code in (302, 303) and found.headers["Location"] == "/tenants/initech"
    mine = viewer.get("/events?customer=cus_initech").get_data(as_text=True)
    for event_id in remapped["old"]:
        assert f'href="/events/{event_id}"' in mine
    for event_id in remapped["new"]:
        assert f'href="/events/{event_id}"' not in mine


def test_the_overview_never_claims_a_match_over_nothing(
        engine: Engine, fake: FakeStripe, settings: Any, client_as: Any) -> None:
    """A run that compared nothing (every day too young) says so; one that compared days
    says how many, and the mismatches."""
    operations.set_tenant(engine, "acme", stripe_customer_id="cus_initech", name=None,
                          now=utcnow())
    send(engine, settings, "acme", [(0, 2)], "young")
    gateway = gateway_from(settings)
    assert gateway is not None
    try:
        run = reconcile(engine, gateway, settings, trigger="cli", now=utcnow())
    finally:
        gateway.close()
    assert run.comparison.checked == 0 and run.comparison.pending >= 1
    html = client_as("viewer").get("/").get_data(as_text=True)
    tile = html.split('data-k="reconciled"')[1].split("</div>")[0]
    assert "nothing compared yet" in tile and "mismatch" not in tile
    assert "good" not in html.split('data-k="reconciled"')[0].rsplit("<a", 1)[1]
    # The usage rows say "not compared yet", in the file too, never a blank.
    today = midday(0).date().isoformat()
    _, _, rows, _ = read_usage_csv(client_as("viewer").get(
        f"/tenants.csv?from={today}&to={today}").get_data(as_text=True))
    assert [(r["Tenant"], r["sent units"], r["Stripe units"], r["Stripe difference"],
             r["Stripe compared at (UTC)"]) for r in rows] == [
        ("acme", "2", "not compared yet", "", "")]
    # When the pending days can be compared: no scheduled run yet, so the scheduler's next.
    assert "the next reconciliation starts within a minute" in tile
    recon = client_as("viewer").get("/reconciliation").get_data(as_text=True)
    assert 'id="nothing-compared"' in recon
    assert "the next reconciliation starts within a minute" in recon.split(
        'id="nothing-compared"')[1].split("</p>")[0]
    # A scheduled run an hour ago: the next is due in 23 hours, named with its time.
    started = utcnow() - timedelta(hours=1)
    with engine.begin() as conn:
        conn.execute(update(RECON_RUNS).where(RECON_RUNS.c.id == run.id).values(
            trigger="schedule", started_at=started))
    due = (started + timedelta(hours=24)).strftime("%Y-%m-%d %H:%M")
    html = client_as("viewer").get("/").get_data(as_text=True)
    tile = html.split('data-k="reconciled"')[1].split("</div>")[0]
    assert "the next reconciliation is due in 22 h 59 min" in tile and due in tile


def test_tenants_sharing_a_customer_count_its_stripe_figure_once(
        engine: Engine, fake: FakeStripe, settings: Any, client_as: Any) -> None:
    """Stripe knows customers, not tenants: two tenants billed to one customer each show the
    customer's figure, and the file's total counts it once, as the page's does."""
    shared_customer(engine, settings)
    day = midday(2).date().isoformat()
    _, _, rows, totals = read_usage_csv(client_as("viewer").get(
        f"/tenants.csv?from={day}&to={day}").get_data(as_text=True))
    assert sorted((r["Tenant"], r["sent units"], r["Stripe units"]) for r in rows) == [
        ("acme", "3", "7"), ("acme-eu", "4", "7")]
    assert (totals[METER]["sent units"], totals[METER]["Stripe units"]) == ("7", "7")
    assert (totals[METER]["Stripe difference"]) == "0"
    with reading(engine) as conn:  # what the page's total row reads
        assert meter_totals(conn, midday(2).date(), midday(2).date())[METER][0] == 7.0


def test_one_tenants_reconciliation_compares_its_customer_whole(
        engine: Engine, fake: FakeStripe, settings: Any) -> None:
    """A run for one tenant compares each customer its events went to with every tenant's
    events of that customer (Stripe's figure is the customer's): no false mismatch, and the
    day kept is the customer's whole."""
    run = shared_customer(engine, settings, tenant_id="acme")
    assert run.comparison.checked >= 1 and run.comparison.mismatches == []
    with reading(engine) as conn:
        assert meter_totals(conn, midday(2).date(), midday(2).date())[METER][:2] == (7.0, 7)


def test_a_remapped_tenants_page_has_a_row_per_customer_and_a_total_per_meter(
        remapped: dict[str, Any], client_as: Any) -> None:
    period = f"from={remapped['start'].isoformat()}&to={remapped['end'].isoformat()}"
    html = client_as("viewer").get(f"/tenants/initech?{period}").get_data(as_text=True)
    table = html.split('id="tenant-usage"')[1].split("</table>")[0]
    rows = re.findall(r'<tr data-meter="([^"]+)"><td>[^<]*</td><td data-col="customer">'
                      r'([^<]*)</td>.*?data-col="sent_quantity">([^<]*)<', table)
    assert sorted(rows) == [(METER, "cus_initech", "7"), (METER, "cus_initech2", "5")]
    total = table.split(f'data-meter-total="{METER}"')[1].split("</tr>")[0]
    assert f"Total {METER}" in total and 'data-col="total_sent_quantity">12<' in total


def test_a_viewers_check_with_stripe_writes_nothing_but_the_comparison(
        engine: Engine, fake: FakeStripe, settings: Any, users: dict[str, str]) -> None:
    """A viewer may ask for the period's comparison (signed in, with the form's CSRF token);
    it reads Stripe and keeps a run and its days, and no event, mapping or audit entry
    changes."""
    operations.set_tenant(engine, "acme", stripe_customer_id="cus_initech", name=None,
                          now=utcnow())
    send(engine, settings, "acme", [(2, 3)], "a")
    with engine.begin() as conn:  # long settled: the day can be compared at once
        conn.execute(update(OUTBOX).values(updated_at=utcnow() - timedelta(hours=2)))
    app = create_app({"TESTING": True}, settings=settings, engine=engine, start_drainer=False)
    day = midday(2).date().isoformat()
    form = {"from": day, "to": day}
    anonymous = app.test_client()
    refused = anonymous.post("/tenants/check-with-stripe",
                             data={**form, "csrf_token": csrf_of(anonymous, "/login")})
    assert refused.status_code in (302, 303, 401) and runs(engine) == []  # signed in only
    viewer = app.test_client()
    assert login(viewer, users["viewer"]).status_code == 303
    assert viewer.post("/tenants/check-with-stripe", data=form).status_code == 400  # no CSRF
    assert runs(engine) == []

    before = tables(engine)
    resp = viewer.post("/tenants/check-with-stripe",
                       data={**form, "csrf_token": csrf_of(viewer, f"/tenants?from={day}")})
    assert resp.status_code == 303
    wait_for(lambda: [r.finished_at is not None for r in runs(engine)] == [True], 20,
             message="the check's run ends")
    (run,) = runs(engine)
    assert (run.trigger, run.actor, run.buckets_checked, run.mismatches) == (
        "check", users["viewer"], 1, 0)
    assert tables(engine) == before          # events, mappings, audit: as they were
    with reading(engine) as conn:
        assert meter_totals(conn, midday(2).date(), midday(2).date())[METER][:2] == (3.0, 3)


def runs(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return conn.execute(select(RECON_RUNS)).all()


def tables(engine: Engine) -> dict[str, list[Any]]:
    with engine.connect() as conn:
        return {t.name: sorted(map(tuple, conn.execute(select(t)).all()), key=repr)
                for t in (OUTBOX, Tenant.__table__, AuditEntry.__table__)}


def test_a_narrow_check_never_stands_for_the_whole_reconciliation(
        engine: Engine, client_as: Any) -> None:
    """A viewer's check of one day, or one tenant's run, after a run of everything found a
    mismatch: the Overview's tile still names the whole run's mismatch, and what it covered."""
    now = utcnow()
    whole = dict(started_at=now - timedelta(hours=2), finished_at=now - timedelta(hours=2),
                 since=now - timedelta(days=34), until=now - timedelta(hours=2),
                 trigger="schedule", buckets_checked=30, pending=0, mismatches=1, ok=True)
    with engine.begin() as conn:
        conn.execute(insert(RECON_RUNS).values(**whole))
        for narrow in (dict(trigger="check", actor="viewer@example.com"),
                       dict(trigger="cli", tenant_id="acme")):
            conn.execute(insert(RECON_RUNS).values(**dict(
                whole, started_at=now, finished_at=now, since=now - timedelta(days=3),
                until=now - timedelta(days=2), buckets_checked=1, mismatches=0, **narrow)))
    html = client_as("viewer").get("/").get_data(as_text=True)
    tile = html.split('data-k="reconciled">')[1].split("</div>")[0]
    assert tile.startswith("1 mismatch<")
    assert f"{whole['since']:%Y-%m-%d} – " in tile


def shared_customer(engine: Engine, settings: Any, tenant_id: str | None = None) -> Any:
    """acme and acme-eu both billed to cus_initech, 3 and 4 units two days ago, Stripe
    holding all 7; then a settled reconciliation (of ``tenant_id`` alone, if given)."""
    for tenant in ("acme", "acme-eu"):
        operations.set_tenant(engine, tenant, stripe_customer_id="cus_initech", name=None,
                              now=utcnow())
    send(engine, settings, "acme", [(2, 3)], "a")
    send(engine, settings, "acme-eu", [(2, 4)], "b")
    gateway = gateway_from(settings)
    assert gateway is not None
    try:
        return reconcile(engine, gateway, settings, trigger="cli", tenant_id=tenant_id,
                         now=utcnow() + timedelta(hours=2))
    finally:
        gateway.close()


def test_one_tenants_reads_give_stripes_figure_as_the_whole_set_does(
        db_url: str, engine: Engine, fake: FakeStripe, remapped: dict[str, Any],
        client_as: Any) -> None:
    """One tenant's rows read what was compared of them alone; the figures are the ones
    every tenant's read joins."""
    start, end = remapped["start"], remapped["end"]
    figures = ("stripe_units", "compared_units", "compared_days", "compared_at")

    def cells(rows: Any) -> dict[str, tuple[Any, ...]]:
        return {r.stripe_customer_id: tuple(getattr(r, f) for f in figures) for r in rows}

    whole = cells(reads.tenant_usage(engine, start=start, end=end).rows)
    one = cells(reads.tenant_usage(engine, start=start, end=end, tenant_id="initech").rows)
    assert one == whole and whole["cus_initech"][:3] == (3.0, 7, 2)
    env = worker_env(db_url, fake.base_url)
    period = ("--from", start.isoformat(), "--to", end.isoformat())
    every = json.loads(cli("usage", "--json", *period, env=env).stdout)["rows"]
    mine = json.loads(cli("usage", "--json", *period, "--tenant", "initech", env=env).stdout)
    assert mine["rows"] == [r for r in every if r["tenant_id"] == "initech"]
    assert [r["stripe_units"] for r in mine["rows"]] == [3, 5]
    viewer = client_as("viewer")
    q = f"from={start.isoformat()}&to={end.isoformat()}"
    _, _, all_rows, _ = read_usage_csv(viewer.get(f"/tenants.csv?{q}").get_data(as_text=True))
    _, _, my_rows, _ = read_usage_csv(viewer.get(f"/tenants.csv?{q}&tenant=initech")
                                      .get_data(as_text=True))
    assert my_rows == [r for r in all_rows if r["Tenant"] == "initech"] and len(my_rows) == 2


def test_without_a_key_no_page_promises_a_reconciliation(db_url: str, engine: Engine,
                                                         users: dict[str, str]) -> None:
    """No STRIPE_API_KEY: nothing can be compared, so no page says when the next
    reconciliation runs; each says what it needs."""
    app = create_app({"TESTING": True}, settings=make_settings(db_url, stripe_api_key=None),
                     engine=engine, start_drainer=False)
    client = app.test_client()
    login(client, users["viewer"])
    for path in ("/tenants", "/reconciliation"):
        html = client.get(path).get_data(as_text=True)
        assert "runs until STRIPE_API_KEY is set" in html, path
        assert "starts within a minute" not in html and "is due in" not in html, path
