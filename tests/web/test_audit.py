"""The audit log page: filters, pagination and a CSV that parses back to the same rows."""

from __future__ import annotations

import csv
import io
import re
from datetime import timedelta

from webapp.audit import write_audit
from webapp.models import utcnow
from webapp.read import audit as reads


def make_entries(engine, n_requeues: int = 3) -> None:
    now = utcnow()
    with engine.begin() as conn:
        for i in range(n_requeues):
            write_audit(conn, actor="ops@example.com", action="requeue", event_ids=[i + 1],
                            reason_code=None, note=f"batch {i}", now=now)
        write_audit(conn, actor="boss@example.com", action="resolve", event_ids=[1, 2, 3],
                        reason_code="written_off", note="=cmd|' /C calc'!A0",
                        now=now - timedelta(days=3))
        write_audit(conn, actor="boss@example.com", action="pause", event_ids=[],
                        reason_code=None, note=None, now=now)


def ids_on(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<tr data-id="(\d+)"', html)]


def test_filters_and_pagination(client_as, engine) -> None:
    make_entries(engine)
    client = client_as("viewer")
    assert len(ids_on(client.get("/audit").get_data(as_text=True))) == 5
    assert len(ids_on(client.get("/audit?actor=boss").get_data(as_text=True))) == 2
    assert len(ids_on(client.get("/audit?action=requeue").get_data(as_text=True))) == 3
    today = utcnow().date()
    since = (today - timedelta(days=1)).isoformat()
    assert len(ids_on(client.get(f"/audit?since={since}").get_data(as_text=True))) == 4
    old = (today - timedelta(days=3)).isoformat()
    assert len(ids_on(client.get(f"/audit?since={old}&until={old}")
                      .get_data(as_text=True))) == 1
    assert len(ids_on(client.get("/audit?event=2").get_data(as_text=True))) == 2
    page1 = client.get("/audit?limit=2").get_data(as_text=True)
    nxt = re.search(r'href="([^"]*below=[^"]*)" rel="next"', page1).group(1)
    page2 = client.get(nxt.replace("&amp;", "&")).get_data(as_text=True)
    page3 = client.get(re.search(r'href="([^"]*below=[^"]*)" rel="next"', page2).group(1)
                       .replace("&amp;", "&")).get_data(as_text=True)
    assert 'rel="next"' not in page3
    seen = ids_on(page1) + ids_on(page2) + ids_on(page3)
    assert seen == sorted(seen, reverse=True) and len(set(seen)) == 5
    assert client.get("/audit?event=abc").status_code == 400


def test_csv_parses_back_to_the_same_entries(client_as, engine) -> None:
    make_entries(engine)
    client = client_as("viewer")
    rows = list(csv.DictReader(io.StringIO(client.get("/audit.csv?actor=boss")
                                           .get_data(as_text=True))))
    expected = reads.audit_log(engine, reads.AuditFilters(actor="boss")).rows
    assert [int(r["id"]) for r in rows] == sorted(e["id"] for e in expected)
    resolve = next(r for r in rows if r["action"] == "resolve")
    assert resolve["event_ids"] == "1,2,3" and resolve["event_count"] == "3"
    assert resolve["reason_code"] == "written_off"
    assert resolve["note"].startswith("'=")            # not run by a spreadsheet
    everything = list(csv.DictReader(io.StringIO(client.get("/audit.csv")
                                                 .get_data(as_text=True))))
    assert len(everything) == 5


def test_audit_rows_are_read_in_batches(engine) -> None:
    make_entries(engine, n_requeues=7)
    rows = list(reads.audit_rows(engine, reads.AuditFilters(), batch=3))
    assert [r.id for r in rows] == sorted(r.id for r in rows) and len(rows) == 9
