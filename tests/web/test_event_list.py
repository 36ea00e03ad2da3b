"""The events list (/events): each filter, the chips that remove them, keyset paging that
neither loses nor repeats a row, the CSV of exactly the listed set, the count, bad input,
roles, and /events?q= still jumping to one event."""

from __future__ import annotations

import csv
import html as html_lib
import io
import re
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from sqlalchemy import insert

from webapp.models import AuditEntry, AuditEvent
from webapp.outbox.states import MAX_AGE
from webapp.read import event_list as lists


def listed(html: str) -> list[int]:
    """The event ids of the list's table, in page order."""
    table = html.split('id="events-table"', 1)[1] if 'id="events-table"' in html else ""
    return [int(i) for i in re.findall(r'<tr data-id="(\d+)"', table)]


def count_of(html: str) -> int:
    """The number the list says match."""
    found = re.search(r'id="events-count"><strong>([0-9,]+) events? match', html)
    assert found, "the list states how many events match"
    return int(found.group(1).replace(",", ""))


def walk(client: Any, query: str, limit: int = 3) -> list[int]:
    """Every id of every page of the list, following "Next page"."""
    url = f"/events?{query}&limit={limit}" if query else f"/events?limit={limit}"
    seen: list[int] = []
    for _ in range(100):
        html = client.get(url).get_data(as_text=True)
        seen += listed(html)
        nxt = re.search(r'href="([^"]*before=[^"]*)" rel="next"', html)
        if not nxt:
            return seen
        url = nxt.group(1).replace("&amp;", "&")
    raise AssertionError("the pages never end")


def audit_entry(engine: Any, ids: list[int], now: Any, action: str = "requeue") -> int:
    with engine.begin() as conn:
        audit_id = int(conn.execute(insert(AuditEntry.__table__).values(
            at=now, actor="ops@example.com", action=action,
            event_ids=",".join(map(str, ids)), event_count=len(ids))
            .returning(AuditEntry.__table__.c.id)).scalar_one())
        conn.execute(insert(AuditEvent.__table__),
                     [{"audit_id": audit_id, "event_id": i} for i in ids])
    return audit_id


@pytest.fixture
def mix(seed: Any, engine: Any, now: Any) -> dict[str, Any]:
    """A mix of events over statuses, tenants, meters, ages and attempt counts."""
    seed.tenant("acme", "cus_acme", "Acme")
    seed.tenant("globex", None)
    old = now - MAX_AGE - timedelta(days=1)
    near = now - MAX_AGE + timedelta(days=3)
    ids: dict[str, Any] = {
        "sent": seed.events(4, status="sent", stripe_customer_id="cus_acme"),
        "sent_old": seed.events(2, status="sent", sent_at=now - timedelta(days=3),
                                created_at=now - timedelta(days=3),
                                stripe_customer_id="cus_acme"),
        "dead": seed.events(3, status="dead", tenant_id="globex", meter="tokens"),
        "retrying2": seed.events(2, status="retrying", attempt_count=2),
        "retrying4": seed.events(1, status="retrying", attempt_count=4,
                                 last_error_code="api_error", last_outcome="server_error"),
        "due": seed.events(2, status="pending", next_attempt_at=now - timedelta(minutes=1)),
        "later": seed.events(1, status="pending", next_attempt_at=now + timedelta(hours=1)),
        "over": seed.events(2, status="pending", occurred_at=old, tenant_id="globex"),
        "near": seed.events(1, status="dead", occurred_at=near),
        "near_sent": seed.events(1, status="sent", occurred_at=near),
        "processing": seed.events(1, status="processing", claim_token="t", claimed_by="w",
                                  processing_deadline_at=now + timedelta(minutes=1)),
        "rejected": seed.events(1, status="rejected", rejected_at=now, sent_at=now,
                                reject_code="meter_event_customer_not_found"),
    }
    ids["audit"] = audit_entry(engine, ids["dead"][:2] + ids["sent"][:1], now)
    ids["all"] = sorted((i for k, v in ids.items() if isinstance(v, list) for i in v),
                        reverse=True)
    return ids


CASES = [
    ("", "all"),
    ("status=dead", ("dead", "near")),
    ("status=dead&status=retrying", ("dead", "near", "retrying2", "retrying4")),
    ("tenant=globex", ("dead", "over")),
    ("customer=cus_acme", None),   # acme's: sent with cus_acme, or acme's not yet attempted
    ("meter=tokens", ("dead",)),
    ("due=1", ("due", "over")),
    ("age=near", ("near",)),
    ("age=over", ("over",)),
    ("code=api_error", ("retrying4",)),
    ("outcome=server_error", ("retrying4",)),
    ("attempts=2", ("retrying2",)),
    ("attempts=3-5&status=retrying", ("retrying4",)),
    ("status=retrying&attempts=2-", ("retrying2", "retrying4")),
    ("status=sent&tenant=acme", ("sent", "sent_old", "near_sent")),
]


@pytest.mark.parametrize("query, keys", CASES)
def test_each_filter_lists_exactly_its_events(query, keys, mix, client_as, engine, now) -> None:
    client = client_as("viewer")
    if keys is None:
        # acme is mapped to cus_acme: its events sent to it, and those not yet attempted.
        others = set(mix["dead"] + mix["over"])
        expected = [i for i in mix["all"] if i not in others]
    elif keys == "all":
        expected = mix["all"]
    else:
        expected = sorted((i for k in keys for i in mix[k]), reverse=True)
    assert walk(client, query) == expected, query
    html = client.get(f"/events?{query}").get_data(as_text=True)
    assert count_of(html) == len(expected)


def test_dates_created_sent_and_occurred(mix, client_as, now) -> None:
    client = client_as("viewer")
    today, three_ago = now.date(), (now - timedelta(days=3)).date()
    assert sorted(walk(client, f"sent_from={three_ago}&sent_to={three_ago}")) == sorted(
        mix["sent_old"])
    assert sorted(walk(client, f"sent_from={today}")) == sorted(
        mix["sent"] + mix["near_sent"] + mix["rejected"])
    assert sorted(walk(client, f"created_to={three_ago}")) == sorted(mix["sent_old"])
    near_day = (now - MAX_AGE + timedelta(days=3)).date()
    assert sorted(walk(client, f"occurred_from={near_day}&occurred_to={near_day}")) == sorted(
        mix["near"] + mix["near_sent"])


def test_audit_filter_lists_the_events_an_entry_touched(mix, client_as) -> None:
    got = walk(client_as("viewer"), f"audit={mix['audit']}")
    assert got == sorted(mix["dead"][:2] + mix["sent"][:1], reverse=True)


def test_paging_loses_and_repeats_nothing(mix, client_as) -> None:
    client = client_as("viewer")
    for size in (1, 2, 5, 7, len(mix["all"]), len(mix["all"]) + 1):
        got = walk(client, "", limit=size)
        assert got == mix["all"], size
    statuses = "status=dead&status=pending&status=sent"
    got = walk(client, statuses, limit=2)
    assert len(got) == len(set(got)) and got == sorted(got, reverse=True)
    assert len(got) == 3 + 1 + 2 + 1 + 2 + 4 + 2 + 1


def test_chips_say_each_filter_and_remove_it(mix, client_as) -> None:
    client = client_as("viewer")
    html = client.get("/events?status=dead&status=retrying&tenant=globex&age=near&attempts=2-5"
                      "&due=1").get_data(as_text=True)
    chips = re.findall(r'<a class="chip" href="([^"]+)"[^>]*>([^<]+)', html)
    words = [html_lib.unescape(w).strip() for _, w in chips]
    # Statuses in their usual order (ALL_STATUSES), whatever the order in the address.
    assert words == ["status is retrying", "status is dead", "tenant globex",
                     "next attempt due now", "within 7 days of Stripe's 35-day limit",
                     "2 to 5 attempts"]
    first = parse_qs(urlsplit(chips[0][0].replace("&amp;", "&")).query)
    assert first == {"status": ["dead"], "tenant": ["globex"], "due": ["1"],
                     "age": ["near"], "attempts": ["2-5"]}
    tenant_removed = parse_qs(urlsplit(chips[2][0].replace("&amp;", "&")).query)
    assert "tenant" not in tenant_removed and tenant_removed["status"] == ["retrying", "dead"]
    assert 'href="/events">clear all</a>' in html
    assert "clear all" not in client.get("/events").get_data(as_text=True)


def test_csv_is_exactly_the_list(mix, client_as) -> None:
    client = client_as("viewer")
    for query in ("", "status=dead&status=retrying", "tenant=globex", "age=over",
                  "attempts=2"):
        resp = client.get(f"/events.csv?{query}")
        assert resp.status_code == 200 and resp.mimetype == "text/csv"
        rows = list(csv.reader(io.StringIO(resp.get_data(as_text=True))))
        assert rows[0] == lists.CSV_HEADER
        assert [int(float(r[0])) for r in rows[1:]] == walk(client, query), query
        html = client.get(f"/events?{query}").get_data(as_text=True)
        assert 'href="/events.csv' in html


def test_count_is_capped(engine, client_as, monkeypatch) -> None:
    monkeypatch.setattr(lists, "COUNT_CAP", 3)
    from support.seed import Seed

    Seed(engine).events(5, status="sent")
    html = client_as("viewer").get("/events").get_data(as_text=True)
    assert "More than 3 events match" in html


@pytest.mark.parametrize("query, field", [
    ("status=bogus", "status"), ("age=old", "age"), ("attempts=x", "attempts"),
    ("attempts=5-2", "attempts"), ("created_from=2026-02-30", "created_from"),
    ("sent_to=yesterday", "sent_to"), ("audit=0", "audit"), ("before=-1", "before"),
    ("customer=acme", "customer"), ("due=yes", "due"), ("occurred_from=x", "occurred_from"),
    ("tenant=" + "a" * 101, "tenant"),
])
def test_bad_input_is_400_naming_the_field(query, field, client_as) -> None:
    client = client_as("viewer")
    for path in ("/events", "/events.csv") if field != "before" else ("/events",):
        resp = client.get(f"{path}?{query}")
        assert resp.status_code == 400, (path, query)
        assert f"“{field}”" in resp.get_data(as_text=True), (path, query)


def test_roles_and_the_jump_by_q(mix, client_as) -> None:
    assert client_as(None).get("/events").status_code in (302, 303)
    assert client_as(None).get("/events.csv").status_code in (302, 303, 401)
    client = client_as("viewer")
    assert client.get("/events").status_code == 200
    target = mix["dead"][0]
    resp = client.get(f"/events?q={target}", follow_redirects=True)
    assert resp.request.path == f"/events/{target}"
    miss = client.get("/events?q=no-such-key&status=dead")
    assert miss.status_code == 302 and miss.location == "/search?q=no-such-key"


def test_htmx_gets_the_fragment(mix, client_as) -> None:
    html = client_as("viewer").get("/events?status=dead",
                                   headers={"HX-Request": "true"}).get_data(as_text=True)
    assert html.lstrip().startswith('<div id="events-fragment"')
    assert listed(html) == sorted(mix["dead"] + mix["near"], reverse=True)


def test_csv_read_in_small_batches_is_still_the_whole_list(mix, client_as,
                                                           monkeypatch) -> None:
    """The export reads ranges of ids, each piece in batches, and merges the pieces: across
    the ranges' and the batches' boundaries nothing is lost or doubled."""
    monkeypatch.setattr(lists, "EXPORT_BATCH", 2)
    monkeypatch.setattr(lists, "EXPORT_FIRST_IDS", 1)
    client = client_as("viewer")
    for query in ("", "status=dead&status=pending&status=sent", "age=near&status=dead"):
        rows = list(csv.reader(io.StringIO(client.get(f"/events.csv?{query}")
                                           .get_data(as_text=True))))
        assert [int(float(r[0])) for r in rows[1:]] == walk(client, query), query
