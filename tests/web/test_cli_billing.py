"""Issue 30: ``billing-outbox periods`` and ``billing-outbox late`` run as a user would, in a
process of their own, on both databases: the contract's JSON, the late actions applied once
and audited as ``cli:<login>``, an event that is not late refused with one line."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from conftest import cli, worker_env
from sqlalchemy import Engine, select
from support.billing_rows import closing_draft, finalized_period

from webapp.models import AuditEntry, utcnow

AUDIT = AuditEntry.__table__
CLOSING_KEYS = {"tenant_id", "stripe_customer_id", "meter", "period_start", "period_end",
                "invoice_id", "invoice_status", "finalizes_at", "unsent_events",
                "unsent_units"}
LATE_KEYS = {"id", "tenant_id", "stripe_customer_id", "meter", "quantity", "occurred_at",
             "sent_at", "period_start", "period_end", "invoice_id", "finalized_at"}


def run(db_url: str, *args: str) -> Any:
    return cli(*args, env=worker_env(db_url))


def test_periods_and_late_as_the_contract_says(db_url: str, engine: Engine) -> None:
    now = utcnow().replace(microsecond=0)
    ids = finalized_period(engine, now=now)
    closing_draft(engine, timedelta(minutes=20), now=now)
    out = run(db_url, "periods", "--json")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert set(got) == {"as_of", "closing", "late", "overlaps"}
    assert got["late"] == {"events": 3, "units": 4}           # 1 + 2 sent late, 1 unsent
    [draft] = [p for p in got["closing"] if p["invoice_id"] == "in_B"]
    assert set(draft) >= CLOSING_KEYS
    assert (draft["tenant_id"], draft["stripe_customer_id"], draft["invoice_status"],
            draft["unsent_events"], draft["unsent_units"]) == ("beta", "cus_B", "draft", 3, 60)
    assert draft["finalizes_at"] is not None
    text = run(db_url, "periods")
    assert text.returncode == 0 and "late usage: 3 event(s), 4 unit(s)" in text.stdout
    assert "3 event(s), 60 unit(s) not at Stripe" in text.stdout

    listed = json.loads(run(db_url, "late", "--json").stdout)
    assert listed["units"] == 4
    assert [e["id"] for e in listed["events"]] == ids["sent_late"] + ids["unsent"]
    assert all(set(e) >= LATE_KEYS for e in listed["events"])
    assert listed["events"][0]["invoice_id"] == "in_A"


def test_bill_next_and_write_off_once_each_and_refuse_what_is_not_late(
        db_url: str, engine: Engine) -> None:
    ids = finalized_period(engine, now=utcnow().replace(microsecond=0))
    refused = run(db_url, "late", "bill-next", str(ids["on_time"][0]), "--note", "x")
    assert refused.returncode == 1
    assert refused.stderr.strip().count("\n") == 0
    assert f"event {ids['on_time'][0]} is not late" in refused.stderr

    billed = run(db_url, "late", "bill-next", *map(str, ids["sent_late"]), "--note",
                 "January's backlog")
    assert billed.returncode == 0, billed.stderr
    for original in ids["sent_late"]:
        assert f"event {original}: billed on the next invoice as event " in billed.stdout
    again = run(db_url, "late", "bill-next", *map(str, ids["sent_late"]), "--note", "again")
    assert again.returncode == 0 and "handled before (billed next)" in again.stdout
    assert "billed 0" not in again.stdout and "audit entry" not in again.stdout

    bad = run(db_url, "late", "write-off", str(ids["unsent"][0]), "--reason", "nope",
              "--note", "x")
    assert bad.returncode == 2
    off = run(db_url, "late", "write-off", str(ids["unsent"][0]), "--reason", "written_off",
              "--note", "too small")
    assert off.returncode == 0 and "wrote off 1 event(s)" in off.stdout
    assert json.loads(run(db_url, "late", "--json").stdout) == {"units": 0, "events": []}
    with engine.connect() as conn:
        entries = conn.execute(select(AUDIT.c.action, AUDIT.c.actor).order_by(AUDIT.c.id)).all()
    assert [e.action for e in entries] == ["late_bill_next", "late_write_off"]
    assert all(e.actor.startswith("cli:") for e in entries)


INVOICE_KEYS = {"invoice_id", "invoice_status", "tenant_id", "stripe_customer_id", "meter",
                "period_start", "period_end", "finalized_at", "invoiced", "ours", "late",
                "uncertain", "verdict"}


def test_invoices_unbilled_and_why_as_the_contract_says(db_url: str, engine: Engine) -> None:
    """The finalized line of acme's period holds 10 units where Stripe took 3 before it
    finalized (over); two events reached Stripe after, one is unsent. A customer with no
    subscription has its usage on no invoice."""
    from sqlalchemy import update
    from sqlalchemy.orm import Session

    from webapp.models import OutboxEvent
    from webapp.outbox import enqueue_usage, stripe_runs
    from webapp.outbox.operations import set_tenant

    now = utcnow().replace(microsecond=0)
    ids = finalized_period(engine, now=now)
    out = run(db_url, "invoices", "--json")
    assert out.returncode == 0, out.stderr
    [line] = json.loads(out.stdout)["invoices"]
    assert set(line) >= INVOICE_KEYS
    assert (line["invoice_id"], line["invoice_status"], line["tenant_id"],
            line["stripe_customer_id"], line["meter"], line["invoiced"], line["ours"],
            line["late"], line["uncertain"], line["verdict"]) == (
        "in_A", "open", "acme", "cus_A", "api_requests", 10, 3, 4, 0, "over")
    assert json.loads(run(db_url, "invoices", "--json", "--tenant", "nobody").stdout) == {
        "invoices": []}
    old = (now - timedelta(days=60)).date().isoformat()
    assert json.loads(run(db_url, "invoices", "--json", "--to", old).stdout) == {
        "invoices": []}
    bad = run(db_url, "invoices", "--from", "yesterday")
    assert bad.returncode == 2 and "YYYY-MM-DD" in bad.stderr
    text = run(db_url, "invoices")
    assert text.returncode == 0 and "in_A  open  acme  cus_A" in text.stdout

    listed = json.loads(run(db_url, "late", "--json").stdout)
    whys = {e["id"]: e["why"] for e in listed["events"]}
    assert whys == {**{i: "after_finalization" for i in ids["sent_late"]},
                    ids["unsent"][0]: "unsent"}

    # A tenant mapped to a customer with no subscription: its usage lands on no invoice,
    # once Stripe's subscriptions were read after it was sent.
    set_tenant(engine, "bare", stripe_customer_id="cus_N", name=None, now=now)
    with Session(engine) as db, db.begin():
        bare = enqueue_usage(db, tenant_id="bare", quantity=4, idempotency_key="bare0",
                             occurred_at=now - timedelta(hours=1), now=now).id
    with engine.begin() as conn:
        conn.execute(update(OutboxEvent.__table__).where(OutboxEvent.__table__.c.id == bare)
                     .values(status="sent", sent_at=now - timedelta(minutes=50),
                             stripe_customer_id="cus_N"))
    stripe_runs.record_run(engine, stripe_runs.SUBSCRIPTIONS_MARK, ok=True, detail=None,
                           now=now)
    got = json.loads(run(db_url, "unbilled", "--json").stdout)
    assert got["units"] == 4
    [event] = got["events"]
    assert event == {"id": bare, "tenant_id": "bare", "stripe_customer_id": "cus_N",
                     "meter": "api_requests", "quantity": 4,
                     "occurred_at": (now - timedelta(hours=1)).isoformat(),
                     "reason": "no_item"}
    text = run(db_url, "unbilled")
    assert "no item" in text.stdout and "1 event(s), 4 unit(s) on no invoice" in text.stdout
