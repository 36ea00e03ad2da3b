"""The billing-periods and late-usage pages, on SQLite and PostgreSQL: what finance reads
(drafts finalizing, what of them is not at Stripe and why, each a link to those events; late
usage with units per customer), what operators do (bill on the next invoice, write off: with
CSRF, audited, once), what viewers may not do, and the warnings on every page and the
Overview while a draft finalizes with usage unsent."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from html import unescape

from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import Engine, select
from support.billing_rows import closing_draft, finalized_period

from webapp.models import LateUsage, OutboxEvent, utcnow
from webapp.outbox import billing_watch

from .conftest import csrf_of

T = OutboxEvent.__table__
L = LateUsage.__table__
Client = Callable[[str | None], FlaskClient]


def _draft(engine: Engine, finalizes_in: timedelta) -> list[int]:
    return closing_draft(engine, finalizes_in)


def _text(resp: object) -> str:
    return unescape(resp.get_data(as_text=True))  # type: ignore[attr-defined]


def test_periods_page_shows_each_draft_and_what_it_waits_for(engine: Engine, app: Flask,
                                                             client_as: Client) -> None:
    finalized_period(engine)
    ids = _draft(engine, timedelta(minutes=20))
    viewer = client_as("viewer")
    page = _text(viewer.get("/periods"))
    assert "in_B" in page and "cus_B" in page
    table = page.split('id="drafts-table"', 1)[1].split("</table>", 1)[0]
    assert "60 unit(s)" in table and "3 event(s)" in table          # 10 + 20 + 30
    assert "2 on the way" in table and "1 wait for a person" in table
    links = [unescape(h) for h in re.findall(r'href="(/events\?[^"]+)"', table)]
    person = next(h for h in links if "status=dead" in h and "status=pending" not in h)
    assert "tenant=beta" in person and "meter=api_requests" in person and "period=" in person
    # Each figure leads to exactly its events.
    listed = _text(viewer.get(person))
    assert f"#{ids[0]}" in listed and f"#{ids[1]}" not in listed
    everything = next(h for h in links if "status=pending" in h and "status=dead" in h)
    listed = _text(viewer.get(everything))
    assert all(f"#{i}" in listed for i in ids)
    # The risk is on every page, and on the Overview with a link here.
    for path in ("/", "/tenants"):
        html = _text(viewer.get(path))
        assert 'id="invoice-risk-line"' in html and "60 unit(s)" in html
    assert "may miss their invoice" in _text(viewer.get("/"))


def test_while_sending_is_paused_the_page_says_so_beside_what_is_on_the_way(
        engine: Engine, client_as: Client) -> None:
    from webapp.outbox.control import set_paused

    _draft(engine, timedelta(minutes=20))
    table = _text(client_as("viewer").get("/periods")).split('id="drafts-table"', 1)[1]
    assert "2 on the way" in table and "sent or retried on their own" in table
    set_paused(engine, paused=True, reason="maintenance", kind="manual", by="ops",
               now=utcnow())
    table = _text(client_as("viewer").get("/periods")).split('id="drafts-table"', 1)[1]
    assert "but sending is paused" in table and "on their own" not in table


def test_no_warning_while_the_draft_finalizes_later_than_the_risk_window(
        engine: Engine, client_as: Client) -> None:
    _draft(engine, timedelta(hours=5))
    html = _text(client_as("viewer").get("/"))
    assert 'id="invoice-risk-line"' not in html and "may miss their invoice" not in html
    assert "in_B" in _text(client_as("viewer").get("/periods"))


def test_late_usage_page_and_its_actions(engine: Engine, app: Flask, client_as: Client) -> None:
    ids = finalized_period(engine)
    billing_watch.keep_late(engine, now=utcnow())
    viewer = client_as("viewer")
    page = _text(viewer.get("/periods/late"))
    per_customer = page.split('id="late-per-customer"', 1)[1].split("</table>", 1)[0]
    assert "cus_A" in per_customer and ">3<" in per_customer and ">4<" in per_customer
    assert all(f"#{i}" in page for i in ids["sent_late"] + ids["unsent"])
    assert f"#{ids['on_time'][0]}" not in page
    assert "Bill selected" not in page                  # viewers see, operators act
    assert "Late usage: 4 units on no invoice" in _text(viewer.get("/"))
    token = csrf_of(viewer, "/periods/late")
    refused = viewer.post("/periods/late/bill-next", data={
        "ids": ids["sent_late"], "note": "n", "csrf_token": token})
    assert refused.status_code == 403

    ops = client_as("operator")
    token = csrf_of(ops, "/periods/late")
    assert ops.post("/periods/late/bill-next", data={
        "ids": ids["sent_late"], "note": "agreed with finance"}).status_code == 400  # no CSRF
    done = ops.post("/periods/late/bill-next", data={
        "ids": ids["sent_late"], "note": "agreed with finance", "csrf_token": token})
    assert done.status_code == 303
    again = ops.post("/periods/late/bill-next", data={
        "ids": ids["sent_late"], "note": "twice", "csrf_token": token},
        follow_redirects=True)
    assert "handled before; nothing more was done" in _text(again)
    with engine.connect() as conn:
        handled = {r.event_id: r for r in conn.execute(select(L))}
    assert set(handled) == set(ids["sent_late"])
    assert all(r.action == "billed_next" and r.new_event_id for r in handled.values())
    not_late = ops.post("/periods/late/write-off", data={
        "ids": ids["on_time"], "reason": "written_off", "note": "x", "csrf_token": token},
        follow_redirects=True)
    assert f"event {ids['on_time'][0]} is not late" in _text(not_late)
    off = ops.post("/periods/late/write-off", data={
        "ids": ids["unsent"], "reason": "written_off", "note": "too small",
        "csrf_token": token}, follow_redirects=True)
    assert "Wrote off 1 late event(s)" in _text(off)
    assert 'id="no-late-usage"' in _text(ops.get("/periods/late"))
    assert "Late usage:" not in _text(ops.get("/"))       # the figure is kept again
