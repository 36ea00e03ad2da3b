"""The finalized lines as ``billing-outbox invoices`` and the Invoices page read them, on both
databases: a whole window (each customer's tenant joined once) and a page (looked up line by
line) name the same tenant for every line — the first by id where two tenants share a
customer, none where no tenant is mapped — and the command prints every line, in batches, as
one JSON document."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest
from sqlalchemy import Engine

from webapp.db import reading
from webapp.models import utcnow
from webapp.outbox import invoices
from webapp.outbox.invoices import InvoiceInfo, LinePeriod, MeteredItem
from webapp.outbox.judge import judge
from webapp.outbox.meters import MeterInfo, store_meters
from webapp.outbox.operations import set_tenant
from webapp.read.invoices import invoice_lines, stream_lines, window

CUSTOMERS = ("cus_A", "cus_B", "cus_C", "cus_D", "cus_E")


def _lines(engine: Engine, now: datetime) -> None:
    """Five customers' finalized lines, an hour apart; cus_A mapped to two tenants, cus_C to
    none."""
    store_meters(engine, [MeterInfo("api_requests", "mtr_api", "active")], now=now)
    set_tenant(engine, "zebra", stripe_customer_id="cus_A", name=None, now=now)
    set_tenant(engine, "aardvark", stripe_customer_id="cus_A", name=None, now=now)
    for c in ("cus_B", "cus_D", "cus_E"):
        set_tenant(engine, f"t_{c[-1]}", stripe_customer_id=c, name=None, now=now)
    for n, c in enumerate(CUSTOMERS):
        end = now - timedelta(days=2, hours=n)
        invoices.store_items(engine, [MeteredItem(
            f"si_{c}", f"sub_{c}", c, "active", "mtr_api", "price_1", end,
            end + timedelta(days=30))], now=now)
        invoices.store_invoices(engine, [InvoiceInfo(
            f"in_{c}", c, f"sub_{c}", "paid", end, None, end + timedelta(hours=1),
            (LinePeriod(f"si_{c}", end - timedelta(days=30), end, n, str(n), 2 * n),),
            "subscription_cycle", "usd")], now=now)
    judge(engine, now=now)


def test_a_whole_window_and_a_page_name_the_same_tenants(engine: Engine) -> None:
    now = utcnow().replace(microsecond=0)
    _lines(engine, now)
    lo, hi = window(None, None, now)
    with reading(engine) as conn:
        whole = list(stream_lines(conn, lo, hi))
    with reading(engine) as conn:
        paged = invoice_lines(conn, lo, hi, limit=50)
    assert whole == paged
    assert [(x.stripe_customer_id, x.tenant_id) for x in whole] == [
        ("cus_A", "aardvark"), ("cus_B", "t_B"), ("cus_C", None), ("cus_D", "t_D"),
        ("cus_E", "t_E")]
    assert [str(x.invoiced) for x in whole] == ["0", "1", "2", "3", "4"]
    assert all(x.verdict != "not_judged" and x.currency == "usd" for x in whole)
    with reading(engine) as conn:
        [one] = list(stream_lines(conn, lo, hi, tenant_id="aardvark"))
    assert one.invoice_id == "in_cus_A"


@pytest.mark.parametrize("as_json", [True, False])
def test_the_command_prints_every_line_in_batches(engine: Engine, db_url: str,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  as_json: bool) -> None:
    from conftest import make_settings

    from webapp import create_app
    from webapp.web.cli import billing

    now = utcnow().replace(microsecond=0)
    _lines(engine, now)
    monkeypatch.setattr(billing, "ECHO_BATCH", 2)
    app = create_app({"TESTING": True}, settings=make_settings(db_url), engine=engine,
                     start_drainer=False, pages=False)
    with app.app_context():
        result = app.test_cli_runner().invoke(args=["invoices", *(["--json"] if as_json
                                                                   else [])])
    assert result.exit_code == 0, result.output
    if as_json:
        got = json.loads(result.output)["invoices"]
        assert [x["stripe_customer_id"] for x in got] == list(CUSTOMERS)
        assert [x["tenant_id"] for x in got] == ["aardvark", "t_B", None, "t_D", "t_E"]
        assert [x["invoiced"] for x in got] == [0, 1, 2, 3, 4]
    else:
        rows = result.output.splitlines()
        assert [r.split("  ")[0] for r in rows[:-1]] == [f"in_{c}" for c in CUSTOMERS]
        assert "(no tenant)" in rows[2]
        assert rows[-1].startswith("5 finalized line(s) from ")
