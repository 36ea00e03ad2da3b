"""The Invoices page, on SQLite and PostgreSQL: each finalized line with its verdict in plain
words, filtered by tenant and verdict, each figure a link to exactly the events behind it;
linked from Billing periods and the tenant's page; usage on no invoice and customers billed
twice said on it and on the Overview; viewers may read it, anonymous people may not."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from html import unescape

from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import Engine, update
from sqlalchemy.orm import Session
from support.billing_rows import finalized_period

from webapp.models import OutboxEvent, utcnow
from webapp.outbox import billing_watch, enqueue_usage, invoices, stripe_runs
from webapp.outbox.invoices import InvoiceInfo, LinePeriod, MeteredItem
from webapp.outbox.meters import MeterInfo, store_meters
from webapp.outbox.operations import set_tenant

T = OutboxEvent.__table__
Client = Callable[[str | None], FlaskClient]


def _text(resp: object) -> str:
    return unescape(resp.get_data(as_text=True))  # type: ignore[attr-defined]


def _ids_behind(client: FlaskClient, href: str) -> set[int]:
    page = _text(client.get(href))
    return {int(i) for i in re.findall(r'data-id="([0-9]+)"', page)}


def test_each_line_its_verdict_and_the_events_behind_each_figure(
        engine: Engine, app: Flask, client_as: Client) -> None:
    now = utcnow().replace(microsecond=0)
    ids = finalized_period(engine, now=now)
    billing_watch.keep_late(engine, now=now)
    viewer = client_as("viewer")
    page = _text(viewer.get("/invoices"))
    table = page.split('id="invoice-lines"', 1)[1].split("</table>", 1)[0]
    assert 'data-verdict="over"' in table and "in_A" in table and "acme" in table
    assert "Stripe billed more units than the outbox sent" in table
    assert "7 unit(s) more" in table                         # 10 on the line, 3 in time
    links = {place: unescape(h) for place, h in (
        (p, re.search(rf'href="([^"]*place={p}[^"]*)"', table).group(1))  # type: ignore[union-attr]
        for p in ("ours", "late"))}
    assert _ids_behind(viewer, links["ours"]) == set(ids["on_time"])
    assert _ids_behind(viewer, links["late"]) == set(ids["sent_late"] + ids["unsent"])
    # Filtered by verdict and tenant; the counts lead to the filtered list.
    assert 'data-verdict="over"' not in _text(viewer.get("/invoices?verdict=matches"))
    assert "Over: 1" in page
    assert "in_A" not in _text(viewer.get("/invoices?tenant=globex"))
    assert "in_A" in _text(viewer.get("/invoices?tenant=acme&verdict=over"))
    # Linked from Billing periods and the tenant's page.
    assert 'id="invoices-link"' in _text(viewer.get("/periods"))
    assert "/invoices?tenant=acme" in _text(viewer.get("/tenants/acme"))
    # Bad input is a 400 naming the field, never a 500.
    for bad in ("/invoices?verdict=nope", "/invoices?from=yesterday", "/invoices?after=x",
                "/events?line=in_A/si_A", "/events?line=in_A/si_A&place=all"):
        assert viewer.get(bad).status_code == 400, bad
    assert client_as(None).get("/invoices").status_code in (302, 401)


def test_usage_on_no_invoice_and_two_items_on_one_meter_are_said(
        engine: Engine, app: Flask, client_as: Client) -> None:
    now = utcnow().replace(microsecond=0)
    set_tenant(engine, "bare", stripe_customer_id="cus_N", name=None, now=now)
    set_tenant(engine, "twice", stripe_customer_id="cus_2", name=None, now=now)
    store_meters(engine, [MeterInfo("api_requests", "mtr_api", "active")], now=now)
    invoices.store_items(engine, [
        MeteredItem(f"si_{n}", f"sub_{n}", "cus_2", "active", "mtr_api", "price_1",
                    now - timedelta(days=3), now + timedelta(days=27)) for n in (1, 2)],
        now=now)
    with Session(engine) as db, db.begin():
        bare = enqueue_usage(db, tenant_id="bare", quantity=4, idempotency_key="bare0",
                             occurred_at=now - timedelta(hours=1), now=now).id
    with engine.begin() as conn:
        conn.execute(update(T).where(T.c.id == bare).values(
            status="sent", sent_at=now - timedelta(minutes=50), stripe_customer_id="cus_N"))
    stripe_runs.record_run(engine, stripe_runs.SUBSCRIPTIONS_MARK, ok=True, detail=None,
                           now=now)
    billing_watch.keep_unbilled(engine, now=now)
    billing_watch.keep_overlaps(engine, now=now)
    viewer = client_as("viewer")
    page = _text(viewer.get("/invoices"))
    assert "4 unit(s) will be on no invoice" in page
    href = unescape(re.search(r'id="unbilled-callout".*?href="([^"]+)"', page, re.S)
                    .group(1))  # type: ignore[union-attr]
    assert _ids_behind(viewer, href) == {bare}
    assert "1 customer(s) are billed twice" in page and "si_1, si_2" in page
    overview = _text(viewer.get("/"))
    assert "4 units will be on no invoice" in overview
    assert "1 customer is billed twice for the same usage" in overview
    assert "billed twice" in _text(viewer.get("/periods"))


def test_a_void_invoice_keeps_its_figures(engine: Engine, app: Flask,
                                          client_as: Client) -> None:
    now = utcnow().replace(microsecond=0)
    finalized_period(engine, now=now)
    end = now - timedelta(hours=3)
    invoices.store_invoices(engine, [InvoiceInfo(
        "in_A", "cus_A", "sub_A", "void", end, None, end + timedelta(hours=1),
        (LinePeriod("si_A", end - timedelta(days=30), end, 10),))], now=now)
    page = _text(client_as("viewer").get("/invoices?verdict=void"))
    assert 'data-verdict="void"' in page and "The invoice was voided" in page


def test_an_event_page_says_where_its_usage_ended(engine: Engine, app: Flask,
                                                  client_as: Client) -> None:
    """Taken in time: on its invoice; late: on no invoice until handled; billed next: the
    original names its copy and the copy its original (counted once); written off: not
    billed — never "billed unless Stripe reports a problem"."""
    from webapp.outbox import late

    now = utcnow().replace(microsecond=0)
    ids = finalized_period(engine, now=now)
    viewer = client_as("viewer")

    def words(event_id: int) -> str:
        page = _text(viewer.get(f"/events/{event_id}"))
        return page.split('id="status-words">', 1)[1].split("</p>", 1)[0]

    assert "Billed on invoice in_A" in words(ids["on_time"][0])
    first, second = ids["sent_late"]
    assert "reached Stripe after invoice in_A was final" in words(first)
    billed = late.bill_next(engine, [first], actor="ops", note="x", now=now)
    late.write_off(engine, [second], actor="ops", reason="written_off", note="y", now=now)
    copy = billed.new_events[first]
    assert f"billed on a later invoice as event #{copy}" in words(first)
    assert f"bills late event #{first}" in words(copy)
    written = words(second)
    assert "written off" in written and "will not be billed" in written
    assert "billed unless" not in written


def test_the_usage_file_carries_the_invoiced_units(engine: Engine, app: Flask,
                                                   client_as: Client) -> None:
    """``invoiced_units``: Stripe's quantity on the finalized lines of the row's customer and
    meter whose period lies within the file's days; empty where none does."""
    import csv
    import io

    now = utcnow().replace(microsecond=0)
    finalized_period(engine, now=now)             # in_A: 10 units, a period ending 3 h ago
    viewer = client_as("viewer")

    def invoiced(start: str, end: str) -> dict[str, str]:
        body = viewer.get(f"/tenants.csv?from={start}&to={end}").get_data(as_text=True)
        rows = list(csv.reader(io.StringIO(body)))
        header = rows[0] if rows[0][0] == "Tenant" else next(r for r in rows if r[:1] == ["Tenant"])
        at = header.index("invoiced_units")
        return {r[0]: r[at] for r in rows[rows.index(header) + 1:] if r and r[0] != "Total"}

    whole = (now - timedelta(days=31)).date().isoformat(), now.date().isoformat()
    assert invoiced(*whole) == {"acme": "10"}
    part = (now - timedelta(days=5)).date().isoformat(), now.date().isoformat()
    assert invoiced(*part) == {"acme": ""}       # the period does not lie within those days
