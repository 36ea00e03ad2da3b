"""Every count of events links to exactly those events: on each page, each link to the
events list whose text is a number is followed, and the list must say that many match and
show that many rows across its pages. The Overview's alerts link to their events and to the
action that fixes them."""

from __future__ import annotations

import html as html_lib
import re
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import insert

from webapp.models import AuditEntry, AuditEvent
from webapp.outbox.states import DEAD_EXHAUSTED, DEAD_PAST_WINDOW, MAX_AGE

from .conftest import seed_every_kind
from .test_event_list import count_of, walk

LINK = re.compile(r'<a\b[^>]*href="(/events\?[^"]*)"[^>]*>(.*?)</a>', re.S)
NUMBER = re.compile(r"[0-9][0-9,]*")


def event_links(html: str) -> list[tuple[str, int]]:
    """(address, the number shown) of each link to the events list whose text is a count."""
    out = []
    for href, inner in LINK.findall(html):
        if "<rect" in inner:
            continue  # a histogram bar: its table row holds the same link with the count
        text = html_lib.unescape(re.sub(r"<[^>]+>", " ", inner))
        numbers = NUMBER.findall(text)
        if len(numbers) == 1:
            out.append((html_lib.unescape(href), int(numbers[0].replace(",", ""))))
    return out


def check_links(client: Any, path: str, at_least: int) -> list[tuple[str, int]]:
    """Follow every count link of ``path``; each lists exactly that many events."""
    links = event_links(client.get(path).get_data(as_text=True))
    assert len(links) >= at_least, (path, links)
    for href, shown in links:
        page = client.get(href)
        assert page.status_code == 200, href
        assert count_of(page.get_data(as_text=True)) == shown, (path, href)
        query = href.split("?", 1)[1]
        assert len(walk(client, query, limit=200)) == shown, (path, href)
    return links


@pytest.fixture
def mix(seed: Any, engine: Any, now: Any) -> dict[str, Any]:
    ids = seed_every_kind(seed, now)
    seed.tenant("globex", "cus_globex", "Globex")
    seed.events(2, status="retrying", attempt_count=2, tenant_id="globex")
    seed.events(3, status="retrying", attempt_count=3, last_error_code="api_error",
                last_http_status=500, last_outcome="server_error")
    seed.events(2, status="dead", dead_reason=DEAD_PAST_WINDOW, last_error_code=None,
                last_error_class=None, last_http_status=None, meter="tokens")
    seed.events(1, status="dead", dead_reason=f"{DEAD_EXHAUSTED} after 12 attempts",
                last_error_code="api_error", last_http_status=500)
    seed.events(2, status="rejected", rejected_at=now, sent_at=now, reject_code=None,
                tenant_id="globex")
    seed.events(2, status="pending", occurred_at=now - MAX_AGE + timedelta(days=2),
                tenant_id="unmapped-co")
    seed.events(1, status="pending", occurred_at=now - MAX_AGE - timedelta(hours=2),
                tenant_id="unmapped-co")
    seed.events(2, status="pending", next_attempt_at=now - timedelta(hours=1),
                created_at=now - timedelta(hours=1), tenant_id="globex")
    seed.events(2, status="sent", tenant_id="globex", meter="tokens",
                stripe_customer_id="cus_globex")
    return ids


def test_overview_counts_link_to_exactly_their_events(mix, client_as) -> None:
    client = client_as("viewer")
    links = check_links(client, "/", at_least=9)
    hrefs = [h for h, _ in links]
    for status in ("pending", "processing", "retrying", "sent", "rejected", "dead",
                   "cancelled", "resolved"):
        assert f"/events?status={status}" in hrefs, status
    assert "/events?status=pending&status=processing&status=retrying" in hrefs


def test_retries_bars_link_to_exactly_their_events(mix, client_as) -> None:
    links = check_links(client_as("viewer"), "/retries", at_least=5)
    hrefs = [h for h, _ in links]
    assert "/events?status=retrying&attempts=3" in hrefs
    assert "/events?status=dead&attempts=1" in hrefs
    html = client_as("viewer").get("/retries").get_data(as_text=True)
    # A click on a bar opens the same list (static/app.js follows the bar's data-href).
    assert re.search(r'<rect [^>]*data-href="/events\?status=retrying&amp;attempts=2"', html)


@pytest.mark.parametrize("path", ["/tenants", "/tenants/acme", "/tenants/globex",
                                  "/tenants/unmapped-co", "/mappings"])
def test_usage_figures_link_to_exactly_their_events(path, mix, client_as, now) -> None:
    links = check_links(client_as("viewer"), path, at_least=1)
    if path == "/tenants":
        assert any("tenant=globex" in h and "meter=tokens" in h and "status=sent" in h
                   and "occurred_from=" in h for h, _ in links)
        # "pending" on the usage pages counts the events in flight too
        assert any("status=pending&status=processing" in h for h, _ in links)
    if path == "/tenants/globex":
        last_month = (now.replace(day=1) - timedelta(days=1)).date()
        period = f"from={last_month.replace(day=1)}&to={now.date()}"
        check_links(client_as("viewer"), f"{path}?{period}", at_least=2)


def test_error_groups_link_to_exactly_their_events(mix, client_as) -> None:
    client = client_as("viewer")
    links = check_links(client, "/dead-letters/groups", at_least=3)
    assert any("why=unknown_past_window" in h and "code=-" in h for h, _ in links)
    check_links(client, "/dead-letters/groups?status=resolved", at_least=1)
    check_links(client, "/dead-letters/groups?tenant=initech", at_least=1)
    rejected = check_links(client, "/rejected", at_least=2)
    assert any("reject_code=-" in h for h, _ in rejected)


def alerts(html: str) -> list[str]:
    return re.findall(r'<div class="alert alert-(?:critical|warning|info)">(.*?)</div>',
                      html, re.S)


def test_every_alert_leads_to_its_events_and_its_fix(mix, client_as) -> None:
    client = client_as("viewer")
    html = client.get("/").get_data(as_text=True)
    found = alerts(html)
    titles = {html_lib.unescape(re.search(r"<strong>(.*?)</strong>", a).group(1)): a
              for a in found}
    expected = {
        "dead letters": ("Requeue or resolve them", "/dead-letters"),
        "past Stripe's 35-day limit": ("Resolve the dead ones", "/dead-letters?age=near_limit"),
        "within 7 days of the 35-day limit": ("Map the tenants without a customer",
                                              "/mappings"),
        "rejected by Stripe": ("Requeue or resolve them", "/rejected"),
        "Tenant unmapped-co has no Stripe customer": ("Map the tenant",
                                                      "/mappings?tenant=unmapped-co"),
        "Events are waiting too long": ("See why they are retried", "/retries"),
    }
    for words, (fix, fix_href) in expected.items():
        title = next((t for t in titles if words in t), None)
        assert title is not None, (words, list(titles))
        block = titles[title]
        events = re.search(r'href="(/events\?[^"]*)">Show these events</a>', block)
        assert events, title
        assert re.search(rf'href="{re.escape(html_lib.escape(fix_href))}">{re.escape(fix)}</a>',
                         block), (title, block)
        listed = client.get(html_lib.unescape(events.group(1))).get_data(as_text=True)
        numbers = NUMBER.findall(title)
        if numbers and "waiting too long" not in title:
            assert count_of(listed) == int(numbers[0].replace(",", "")), title
    # The mapping form comes filled in with the tenant.
    form = client_as("admin").get("/mappings?tenant=unmapped-co").get_data(as_text=True)
    assert re.search(r'name="tenant_id"[^>]*value="unmapped-co"', form)


def test_over_limit_alert_counts_what_its_link_lists(mix, client_as) -> None:
    client = client_as("viewer")
    html = client.get("/").get_data(as_text=True)
    title = re.search(r"<strong>([0-9,]+) events past Stripe&#39;s 35-day limit</strong>", html)
    assert title
    listed = client.get("/events?age=over").get_data(as_text=True)
    assert count_of(listed) == int(title.group(1)) == 1
    near = re.search(r"<strong>([0-9,]+) events within 7 days", html)
    assert near and count_of(client.get("/events?age=near").get_data(as_text=True)) == int(
        near.group(1)) == 2


def test_audit_entries_of_bulk_actions_link_to_their_events(mix, engine, now,
                                                              client_as) -> None:
    dead = [mix["event_id"]]
    with engine.begin() as conn:
        audit_id = int(conn.execute(insert(AuditEntry.__table__).values(
            at=now, actor="ops@example.com", action="requeue", event_ids=str(dead[0]),
            event_count=1, note="requeue all matching (no filter)")
            .returning(AuditEntry.__table__.c.id)).scalar_one())
        conn.execute(insert(AuditEvent.__table__), [{"audit_id": audit_id,
                                                     "event_id": dead[0]}])
    links = check_links(client_as("viewer"), "/audit", at_least=1)
    assert (f"/events?audit={audit_id}", 1) in links


def test_a_mismatch_links_to_the_events_sent_that_day(seed, now, client_as) -> None:
    """Mismatches count units, not events: "our events" lists those the units came from."""
    seed.tenant("acme", "cus_acme", "Acme")
    day = now - timedelta(days=2)
    ours = seed.events(2, status="sent", occurred_at=day, stripe_customer_id="cus_acme")
    seed.event(status="sent", occurred_at=day, meter="tokens", stripe_customer_id="cus_acme")
    seed.event(status="sent", occurred_at=now, stripe_customer_id="cus_acme")
    seed.event(status="dead", occurred_at=day)
    seed.stripe_history(now)
    client = client_as("viewer")
    html = client.get("/reconciliation").get_data(as_text=True)
    link = re.search(r'<a href="(/events\?[^"]*)"[^>]*>our events</a>', html)
    assert link
    listed = client.get(html_lib.unescape(link.group(1))).get_data(as_text=True)
    assert sorted(int(i) for i in re.findall(r'<tr data-id="(\d+)"', listed)) == sorted(ours)
