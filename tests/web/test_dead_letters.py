"""Dead letters: escaping, filters, keyset pagination at its boundaries, requeue (with the
forced confirmation), resolve, and "requeue all matching" acting on its snapshot only."""

from __future__ import annotations

import random
import re
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from webapp.models import TEXT_LIMIT, AuditEntry, utcnow
from webapp.outbox.states import DEAD_PAST_WINDOW
from webapp.read import dead_letters as reads
from webapp.read.audit import NOT_SIGN_IN

from .conftest import csrf_of

XSS = "<script>alert('pwned')</script>"


def row_ids(html: str) -> list[int]:
    """The event ids of the dead-letter table, in page order."""
    table = html.split('id="dl-table"', 1)[1] if 'id="dl-table"' in html else ""
    return [int(i) for i in re.findall(r'<tr data-id="(\d+)"', table)]


def test_error_message_is_shown_escaped_everywhere(client_as, seed) -> None:
    dead = seed.event(status="dead", last_error_message=XSS, dead_reason=XSS,
                      tenant_id="<b>t</b>", meter="m<i>")
    seed.event(status="retrying", last_error_message=XSS)
    seed.attempt(dead, outcome="permanent", error_message=XSS, http_status=400)
    client = client_as("operator")
    for path in ("/dead-letters", f"/events/{dead}", "/retries", "/dead-letters/groups",
                 "/tenants", "/tenants/%3Cb%3Et%3C/b%3E"):
        html = client.get(path).get_data(as_text=True)
        assert "<script>alert" not in html, path
        assert "<b>t</b>" not in html and "m<i>" not in html, path
    html = client.get("/dead-letters").get_data(as_text=True)
    assert "&lt;script&gt;alert(&#39;pwned&#39;)&lt;/script&gt;" in html
    assert "&lt;b&gt;t&lt;/b&gt;" in html


@pytest.mark.parametrize("n_rows, expect_next", [(5, False), (6, True)])
def test_keyset_pagination_boundaries(n_rows: int, expect_next: bool, client_as, seed) -> None:
    """Page size N with exactly N rows has no next page; with N+1 the next page holds exactly
    the one row left, and going back returns the first page. Ties on dead_at (one batch died
    at once) are broken by id, so nothing is shown twice or skipped."""
    at = utcnow() - timedelta(minutes=3)
    ids = seed.events(n_rows, status="dead", dead_at=at)
    newest_first = sorted(ids, reverse=True)
    client = client_as("viewer")
    html = client.get("/dead-letters?limit=5").get_data(as_text=True)
    assert row_ids(html) == newest_first[:5]
    nxt = re.search(r'href="([^"]*after=[^"]*)" rel="next"', html)
    assert bool(nxt) == expect_next
    assert 'rel="prev"' not in html
    if not expect_next:
        return
    page2 = client.get(nxt.group(1).replace("&amp;", "&")).get_data(as_text=True)
    assert row_ids(page2) == newest_first[5:]
    assert 'rel="next"' not in page2
    prev = re.search(r'href="([^"]*before=[^"]*)" rel="prev"', page2)
    assert prev
    back = client.get(prev.group(1).replace("&amp;", "&")).get_data(as_text=True)
    assert row_ids(back) == newest_first[:5]
    assert 'rel="prev"' not in back


def test_keyset_query_walks_every_row_once(engine, seed, now) -> None:
    """Mixed and tied timestamps, both directions, page sizes 1…7."""
    base = now - timedelta(hours=1)
    ids = []
    for i in range(11):
        ids += seed.events(2, status="dead", dead_at=base + timedelta(seconds=i // 3))
    expected = [r.id for r in sorted((seed.get(i) for i in ids),
                                     key=lambda r: (r.dead_at, r.id), reverse=True)]
    f = reads.DeadFilters()
    for size in range(1, 8):
        seen, cursor, pages = [], None, []
        while True:
            page = reads.dead_letters(engine, f, now=now, window_seconds=3600, after=cursor,
                                        limit=size)
            pages.append(page)
            seen += [r["id"] for r in page.rows]
            if page.next is None:
                break
            cursor = page.next
        assert seen == expected, size
        # and backwards from the last page
        back, page = [], pages[-1]
        back = [r["id"] for r in page.rows]
        while page.prev is not None:
            page = reads.dead_letters(engine, f, now=now, window_seconds=3600,
                                        before=page.prev, limit=size)
            back = [r["id"] for r in page.rows] + back
        assert back == expected, size


def test_filters(client_as, seed, now) -> None:
    a = seed.event(status="dead", tenant_id="acme", meter="api_requests",
                   last_error_code="resource_missing", last_error_message="No such customer")
    b = seed.event(status="dead", tenant_id="globex", meter="storage",
                   last_error_code="parameter_invalid_integer",
                   last_error_class="InvalidRequestError",
                   last_error_message="Invalid integer: 100%_off", dead_reason="bad value",
                   dead_at=now - timedelta(days=2))
    c = seed.event(status="dead", tenant_id="globex", meter="api_requests",
                   last_error_code=None, last_error_class="Timeout",
                   last_error_message="read timeout", dead_reason=DEAD_PAST_WINDOW,
                   occurred_at=now - timedelta(days=30), dead_at=now - timedelta(days=8))
    r = seed.event(status="resolved", tenant_id="acme")
    seed.event(status="pending", tenant_id="acme")
    client = client_as("viewer")

    def ids(query: str) -> set[int]:
        return set(row_ids(client.get(f"/dead-letters?{query}").get_data(as_text=True)))

    assert ids("") == {a, b, c}
    assert ids("tenant=globex") == {b, c}
    assert ids("tenant=globex&meter=api_requests") == {c}
    assert ids("code=resource_missing") == {a}
    assert ids("error_class=Timeout") == {c}
    assert ids("q=customer") == {a}
    assert ids("q=CUSTOMER") == {a}            # case-insensitive
    assert ids("q=100%25_off") == {b}           # % and _ are literal, not wildcards
    assert ids("q=100%25%25") == set()
    assert ids("q=BAD+Value") == {b}            # the dead reason too
    assert ids("q=integer:+100") == {b}
    assert ids("age=24h") == {a}
    assert ids("age=gt24h") == {b, c}
    assert ids("age=gt7d") == {c}
    assert ids("age=near_limit") == {c}
    assert ids("status=resolved") == {r}
    assert client.get("/dead-letters?age=bogus").status_code == 400
    assert client.get("/dead-letters?after=garbage").status_code == 400
    # the htmx filter form gets only the fragment
    frag = client.get("/dead-letters?tenant=acme", headers={"HX-Request": "true"})
    assert frag.get_data(as_text=True).lstrip().startswith('<div id="dl-fragment">')
    assert "HX-Request" in frag.headers["Vary"]


def test_grouping_by_error(client_as, seed) -> None:
    seed.events(3, status="dead", last_error_code="resource_missing", quantity=2,
                tenant_id="a")
    seed.events(2, status="dead", last_error_code="resource_missing", tenant_id="b")
    seed.event(status="dead", last_error_code=None, last_error_class="Timeout",
               last_http_status=None, dead_reason=DEAD_PAST_WINDOW)
    groups = reads.dead_letter_groups(seed.engine, reads.DeadFilters(), now=utcnow())
    top = groups[0]
    assert (top.code, top.events, top.quantity, top.tenants) == ("resource_missing", 5, 8, 2)
    assert groups[1].kind == "unknown_past_window" and groups[1].events == 1
    html = client_as("viewer").get("/dead-letters/groups",
                                   headers={"HX-Request": "true"}).get_data(as_text=True)
    assert "<html" not in html and "resource_missing" in html
    assert "outcome unknown past the 24 h window" in html


def test_operator_requeues_selected(client_as, seed, users) -> None:
    ids = seed.events(3, status="dead")
    keep = seed.event(status="dead")
    client = client_as("operator")
    resp = client.post("/dead-letters/requeue", data={"ids": ids, "csrf_token": csrf_of(client),
                                                      "next": "/dead-letters?tenant=acme"})
    assert resp.status_code == 303 and resp.headers["Location"] == "/dead-letters?tenant=acme"
    statuses = seed.statuses()
    assert [statuses[i] for i in ids] == ["pending"] * 3 and statuses[keep] == "dead"
    with seed.engine.connect() as conn:
        entry = conn.execute(select(AuditEntry.__table__).where(NOT_SIGN_IN)).one()
    assert (entry.actor, entry.action, entry.event_count) == (users["operator"], "requeue", 3)
    assert "Requeued 3 event(s)" in client.get("/dead-letters").get_data(as_text=True)


def test_requeue_refuses_too_old_and_not_dead_changing_nothing(client_as, seed, now) -> None:
    old = seed.event(status="dead", occurred_at=now - timedelta(days=36))
    fresh = seed.event(status="dead")
    sent = seed.event(status="sent")
    client = client_as("operator")
    token = csrf_of(client)
    for ids in ([old, fresh], [sent, fresh]):
        before = seed.snapshot()
        resp = client.post("/dead-letters/requeue", data={"ids": ids, "csrf_token": token})
        assert resp.status_code == 303
        assert seed.snapshot() == before
    page = client.get("/dead-letters").get_data(as_text=True)
    assert "Nothing changed" in page


def test_forced_requeue_needs_an_explicit_confirmation(client_as, seed) -> None:
    unknown = seed.event(status="dead", dead_reason=DEAD_PAST_WINDOW,
                         first_unknown_at=utcnow() - timedelta(hours=25))
    ok = seed.event(status="dead", first_unknown_at=utcnow() - timedelta(hours=1))
    client = client_as("operator")
    token = csrf_of(client)
    before = seed.snapshot()
    resp = client.post("/dead-letters/requeue", data={"ids": [unknown, ok], "csrf_token": token})
    assert resp.status_code == 409
    html = resp.get_data(as_text=True)
    assert "outcome unknown past Stripe" in html and f"#{unknown}" in html
    assert 'name="confirm_force"' in html
    assert seed.snapshot() == before
    # force without ticking the confirmation: still nothing
    resp = client.post("/dead-letters/requeue", data={"ids": [unknown, ok], "force": "1",
                                                      "csrf_token": token})
    assert resp.status_code == 409 and seed.snapshot() == before
    resp = client.post("/dead-letters/requeue", data={"ids": [unknown, ok], "force": "1",
                                                      "confirm_force": "yes",
                                                      "csrf_token": token})
    assert resp.status_code == 303
    assert seed.get(unknown).status == "pending" and seed.get(ok).status == "pending"
    # the event that did not need force keeps its unknown-outcome clock
    assert seed.get(ok).first_unknown_at is not None
    assert seed.get(unknown).first_unknown_at is None
    with seed.engine.connect() as conn:
        actions = sorted(conn.execute(select(AuditEntry.__table__.c.action)
                                       .where(NOT_SIGN_IN)).scalars())
    assert actions == ["force_requeue", "requeue"]


def test_resolve_needs_a_reason_and_a_note(client_as, seed, users) -> None:
    ids = seed.events(2, status="dead")
    client = client_as("operator")
    token = csrf_of(client)
    for form in ({"reason": "written_off", "note": "  "}, {"reason": "bogus", "note": "x"},
                 {"reason": "", "note": "x"}):
        before = seed.snapshot()
        resp = client.post("/dead-letters/resolve", data={"ids": ids, "csrf_token": token,
                                                          **form})
        assert resp.status_code == 303 and seed.snapshot() == before
    resp = client.post("/dead-letters/resolve", data={
        "ids": ids, "csrf_token": token, "reason": "billed_manually",
        "note": "invoice INV-7 <b>by hand</b>"})
    assert resp.status_code == 303
    row = seed.get(ids[0])
    assert (row.status, row.resolve_reason, row.resolved_by) == (
        "resolved", "billed_manually", users["operator"])
    # resolved rows stay visible in the history view, escaped
    history = client.get("/dead-letters?status=resolved").get_data(as_text=True)
    assert set(row_ids(history)) == set(ids)
    assert "invoice INV-7 &lt;b&gt;by hand&lt;/b&gt;" in history
    assert row_ids(client.get("/dead-letters").get_data(as_text=True)) == []


def test_requeue_all_acts_on_the_previewed_snapshot_only(client_as, seed, now) -> None:
    ok = seed.events(3, status="dead", tenant_id="acme", quantity=5)
    ok += seed.events(1, status="dead", tenant_id="globex", quantity=7,
                      occurred_at=now - timedelta(days=30))          # near the 35-day limit
    forced = seed.event(status="dead", tenant_id="acme", quantity=11,
                        dead_reason=DEAD_PAST_WINDOW)
    too_old = seed.event(status="dead", tenant_id="acme", occurred_at=now - timedelta(days=36))
    other = seed.event(status="dead", tenant_id="initech", meter="storage")
    client = client_as("operator")
    resp = client.get("/dead-letters/requeue-all?meter=api_requests")
    assert resp.status_code == 200
    html = resp.get_data(as_text=True)

    def shown(key: str) -> str:
        return re.search(rf'data-k="{key}">([^<]+)<', html).group(1)

    assert (shown("events"), shown("tenants"), shown("units")) == ("4", "2", str(3 * 5 + 7 + 11))
    assert (shown("force"), shown("near"), shown("too_old")) == ("1", "1", "1")
    snapshot = re.search(r'name="snapshot" value="([^"]+)"', html).group(1)

    late = seed.event(status="dead", tenant_id="acme")               # died after the preview
    resp = client.post("/dead-letters/requeue-all", data={"snapshot": snapshot,
                                                          "csrf_token": csrf_of(client)})
    assert resp.status_code == 303
    st = seed.statuses()
    assert all(st[i] == "pending" for i in ok)
    assert st[forced] == "dead"          # not forced: the box was not ticked
    assert st[late] == "dead"            # arrived after the preview: untouched
    assert st[too_old] == "dead" and st[other] == "dead"
    with seed.engine.connect() as conn:
        entry = conn.execute(select(AuditEntry.__table__).where(NOT_SIGN_IN)).one()
    assert entry.action == "requeue" and entry.event_count == 4
    assert "requeue all matching meter=api_requests" in entry.note

    # the same snapshot again: those events are no longer dead; nothing changes
    before = seed.snapshot()
    client.post("/dead-letters/requeue-all", data={"snapshot": snapshot,
                                                   "csrf_token": csrf_of(client),
                                                   "include_forced": "yes"})
    assert seed.snapshot() == before


def test_requeue_all_with_forced_events_ticked(client_as, seed) -> None:
    plain = seed.event(status="dead")
    forced = seed.event(status="dead", dead_reason=DEAD_PAST_WINDOW)
    client = client_as("operator")
    html = client.get("/dead-letters/requeue-all").get_data(as_text=True)
    snapshot = re.search(r'name="snapshot" value="([^"]+)"', html).group(1)
    client.post("/dead-letters/requeue-all", data={"snapshot": snapshot, "include_forced": "yes",
                                                   "csrf_token": csrf_of(client)})
    assert seed.get(plain).status == "pending" and seed.get(forced).status == "pending"


def test_requeue_all_refuses_a_tampered_or_foreign_snapshot(client_as, seed) -> None:
    seed.events(2, status="dead")
    operator, admin = client_as("operator"), client_as("admin")
    html = operator.get("/dead-letters/requeue-all").get_data(as_text=True)
    snapshot = re.search(r'name="snapshot" value="([^"]+)"', html).group(1)
    before = seed.snapshot()
    for client, snap in ((operator, snapshot[:-2] + "xx"), (operator, "e30.e30.e30"),
                         (admin, snapshot)):
        resp = client.post("/dead-letters/requeue-all", data={"snapshot": snap,
                                                              "csrf_token": csrf_of(client)})
        assert resp.status_code == 400
        assert seed.snapshot() == before


def test_preview_is_capped(engine, seed, now) -> None:
    ids = seed.events(5, status="dead")
    p = reads.requeue_preview(engine, reads.DeadFilters(), now=now, window_seconds=3600,
                                cap=3)
    assert p.capped and p.ok_ids == sorted(ids)[:3]


def test_search_text_is_literal_and_ignores_ascii_case(engine, seed, now) -> None:
    """The dead-letter search: '/', '%' and '_' match themselves; ASCII letters match in
    either case; an id-like text matches an idempotency key exactly."""
    a = seed.event(status="dead", last_error_message="POST /v1/billing/meter_events failed")
    b = seed.event(status="dead", last_error_message="POST /v1xbilling failed")
    c = seed.event(status="dead", idempotency_key="order-7/usage")
    d = seed.event(status="dead", last_error_message="No such customer: 'cus_Tenant00/42_x'")

    def found(q: str) -> set[int]:
        page = reads.dead_letters(engine, reads.DeadFilters(q=q), now=now,
                                    window_seconds=86400)
        return {r["id"] for r in page.rows}

    assert found("/v1/") == {a}
    assert found("post /V1") == {a, b}
    assert found("meter_events") == {a}
    assert found("meter%events") == set()
    assert found("order-7/usage") == {c}
    assert found("//") == set()
    # an id: its digits and punctuation match as they are, its letters in either case
    assert found("CUS_tenant00/42_X") == {d}
    assert found("cus_tenant00/43_x") == found("cus_tenant0042_x") == set()


def test_a_refusal_naming_thousands_of_ids_still_reaches_the_page(client_as, seed) -> None:
    """The refusal travels as a flash message in the session cookie: shortened, so the
    browser keeps the cookie (it drops one over about 4 KB) and the person sees why."""
    client = client_as("operator")
    token = csrf_of(client, "/dead-letters")
    ids = [str(900_000 + i) for i in range(3000)]
    resp = client.post("/dead-letters/resolve", data={
        "ids": ids, "csrf_token": token, "reason": "other", "note": "nothing here"})
    assert resp.status_code == 303
    assert len(resp.headers.get("Set-Cookie", "")) < 4000
    page = client.get(resp.headers["Location"]).get_data(as_text=True)
    assert "Nothing changed" in page and "(shortened)" in page


def test_dead_events_with_the_longest_texts_are_stored_grouped_and_found(engine, seed,
                                                                        now) -> None:
    """A dead event's texts may be as long as their columns keep (2,000 characters each, of
    up to 4 bytes): too long for an entry of ``ix_outbox_dead_errors``, such a row is in
    ``ix_outbox_dead_outsize``, and the groups, the search and the pages see both kinds of
    row alike. The groups' figures are a plain count of the rows."""
    rng = random.Random(7)
    # Incompressible: random characters of 4 bytes in UTF-8.
    huge = "".join(chr(rng.randrange(0x1F300, 0x1F5FF)) for _ in range(TEXT_LIMIT))
    at = now - timedelta(minutes=5)
    long_ids = [seed.event(status="dead", tenant_id=f"t{i}", last_error_code="resource_missing",
                           last_error_message=huge[:-6] + "needle", dead_reason=huge,
                           quantity=3, dead_at=at) for i in range(2)]
    short_ids = [seed.event(status="dead", tenant_id=f"t{i % 3}", quantity=i + 1,
                            last_error_code="resource_missing" if i % 2 else None,
                            last_error_class=None if i % 2 else "Timeout",
                            last_error_message=f"msg {i} needle" if i == 4 else f"msg {i}",
                            dead_reason=DEAD_PAST_WINDOW if i % 3 == 0 else f"reason {i}",
                            dead_at=at if i < 3 else at - timedelta(seconds=i))
                 for i in range(7)]
    seed.event(status="resolved", last_error_code="resource_missing", tenant_id="t9")
    seed.event(status="retrying", last_error_code="resource_missing", tenant_id="t9")
    rows = [seed.get(i) for i in long_ids + short_ids]
    assert all(len(r.last_error_message) == TEXT_LIMIT for r in rows[:2])

    def kind(reason: str) -> str:
        return ("unknown_past_window" if reason == DEAD_PAST_WINDOW else
                "exhausted" if reason.startswith("retries exhausted") else "permanent")

    expected: dict[tuple[Any, ...], list[Any]] = {}
    for r in rows:
        g = expected.setdefault((kind(r.dead_reason), r.last_error_class, r.last_error_code,
                                 r.last_http_status), [0, 0, set(), r.dead_at, r.dead_at])
        g[0] += 1
        g[1] += r.quantity
        g[2].add(r.tenant_id)
        g[3], g[4] = min(g[3], r.dead_at), max(g[4], r.dead_at)
    groups = reads.dead_letter_groups(engine, reads.DeadFilters(), now=now)
    assert {(g.kind, g.error_class, g.code, g.http_status):
            [g.events, g.quantity, g.tenants, g.first_dead_at, g.last_dead_at]
            for g in groups} == {k: [n, q, len(t), lo, hi]
                                 for k, (n, q, t, lo, hi) in expected.items()}
    assert [g.events for g in groups] == sorted((g.events for g in groups), reverse=True)

    def found(q: str) -> set[int]:
        page = reads.dead_letters(engine, reads.DeadFilters(q=q), now=now,
                                    window_seconds=86400)
        return {r["id"] for r in page.rows}

    assert found("NEEDLE") == {*long_ids, short_ids[4]}
    newest_first = [r.id for r in sorted(rows, key=lambda r: (r.dead_at, r.id), reverse=True)]
    seen, cursor = [], None
    while True:
        page = reads.dead_letters(engine, reads.DeadFilters(), now=now, window_seconds=86400,
                                  after=cursor, limit=2)
        seen += [r["id"] for r in page.rows]
        if page.next is None:
            break
        cursor = page.next
    assert seen == newest_first
    assert page.rows[-1]["last_error_message"] == rows[-1].last_error_message
