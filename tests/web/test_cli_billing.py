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
    assert set(got) == {"as_of", "closing", "late"}
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
