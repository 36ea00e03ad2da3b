"""Following up a bulk requeue: "requeue all matching" (dead letters and rejected) lands on
the events list of its audit entry, whose summary says what became of the events and polls
while any is still on its way, and stops once all are settled. The audit log links each
bulk entry to the same view."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qs, urlsplit

from sqlalchemy import update

from webapp.models import OutboxEvent
from webapp.outbox.states import DEAD_PAST_WINDOW

from .conftest import csrf_of
from .test_event_list import count_of, listed

T = OutboxEvent.__table__
SUMMARY = re.compile(r'class="tracking-summary"><strong>([0-9,]+) requeued</strong>:\s*'
                     r"([0-9,]+) sent, ([0-9,]+) waiting, ([0-9,]+) failed again")


def summary(html: str) -> tuple[int, int, int, int]:
    found = SUMMARY.search(html)
    assert found, "the tracking summary is shown"
    return tuple(int(g.replace(",", "")) for g in found.groups())  # type: ignore[return-value]


def polls(html: str, url: str | None = None) -> bool:
    """Whether the list's fragment polls (and, given ``url``, polls that address)."""
    head = re.search(r'<div id="events-fragment"[^>]*>', html)
    assert head
    if 'hx-trigger="every' not in head.group(0):
        return False
    if url is not None:
        assert f'hx-get="{url}"' in head.group(0), head.group(0)
    return True


def set_status(engine: Any, ids: list[int], status: str) -> None:
    with engine.begin() as conn:
        conn.execute(update(T).where(T.c.id.in_(ids)).values(status=status))


def requeue_all(client: Any, preview: str, post: str, **extra: str) -> Any:
    html = client.get(preview).get_data(as_text=True)
    snapshot = re.search(r'name="snapshot" value="([^"]+)"', html).group(1)
    return client.post(post, data={"snapshot": snapshot, "csrf_token": csrf_of(client),
                                   **extra})


def test_dead_letters_requeue_all_lands_on_a_page_that_tracks_them(client_as, seed,
                                                                   engine) -> None:
    ids = seed.events(4, status="dead")
    untouched = seed.event(status="dead", meter="other")
    client = client_as("operator")
    resp = requeue_all(client, "/dead-letters/requeue-all?meter=api_requests",
                       "/dead-letters/requeue-all")
    assert resp.status_code == 303
    target = resp.location
    assert urlsplit(target).path == "/events" and list(parse_qs(urlsplit(target).query)) == [
        "audit"]
    html = client.get(target).get_data(as_text=True)
    assert sorted(listed(html), reverse=True) == sorted(ids, reverse=True)
    assert untouched not in listed(html) and count_of(html) == 4
    assert summary(html) == (4, 0, 4, 0) and polls(html, urlsplit(target).path + "?"
                                                     + urlsplit(target).query)
    assert "Requeued 4 event(s)." in html

    set_status(engine, ids[:2], "sent")
    set_status(engine, ids[2:3], "dead")
    fragment = client.get(target, headers={"HX-Request": "true"}).get_data(as_text=True)
    assert fragment.lstrip().startswith('<div id="events-fragment"')
    assert summary(fragment) == (4, 2, 1, 1) and polls(fragment)

    set_status(engine, ids[3:], "rejected")
    fragment = client.get(target, headers={"HX-Request": "true"}).get_data(as_text=True)
    assert summary(fragment) == (4, 2, 0, 2) and not polls(fragment)
    assert "All of them are settled" in fragment


def test_forced_and_plain_requeues_are_tracked_together(client_as, seed) -> None:
    plain = seed.event(status="dead")
    forced = seed.event(status="dead", dead_reason=DEAD_PAST_WINDOW)
    client = client_as("operator")
    resp = requeue_all(client, "/dead-letters/requeue-all", "/dead-letters/requeue-all",
                       include_forced="yes")
    audits = parse_qs(urlsplit(resp.location).query)["audit"]
    assert len(audits) == 2
    html = client.get(resp.location).get_data(as_text=True)
    assert sorted(listed(html)) == sorted([plain, forced]) and summary(html) == (2, 0, 2, 0)


def test_rejected_requeue_all_lands_on_the_tracking_page(client_as, seed, now) -> None:
    ids = seed.events(3, status="rejected", rejected_at=now, sent_at=now,
                      reject_code="meter_event_customer_not_found")
    client = client_as("operator")
    resp = requeue_all(client, "/rejected/requeue-all", "/rejected/requeue-all")
    assert resp.status_code == 303 and urlsplit(resp.location).path == "/events"
    html = client.get(resp.location).get_data(as_text=True)
    assert sorted(listed(html)) == sorted(ids) and summary(html) == (3, 0, 3, 0)


def test_the_audit_log_links_a_bulk_entry_to_its_tracking_page(client_as, seed) -> None:
    ids = seed.events(3, status="dead")
    client = client_as("operator")
    target = requeue_all(client, "/dead-letters/requeue-all", "/dead-letters/requeue-all"
                         ).location
    audit = client.get("/audit").get_data(as_text=True)
    link = re.search(r'href="(/events\?audit=[0-9]+)"[^>]*>3 events</a>', audit)
    assert link and link.group(1) == target
    html = client.get(link.group(1)).get_data(as_text=True)
    assert sorted(listed(html)) == sorted(ids)


def test_a_viewer_can_follow_but_bad_audit_ids_are_refused(client_as, seed) -> None:
    seed.events(2, status="dead")
    target = requeue_all(client_as("operator"), "/dead-letters/requeue-all",
                         "/dead-letters/requeue-all").location
    viewer = client_as("viewer")
    assert viewer.get(target).status_code == 200
    for bad in ("audit=0", "audit=x", "audit=" + "&audit=".join(["1"] * 11)):
        resp = viewer.get(f"/events?{bad}")
        assert resp.status_code == 400 and "“audit”" in resp.get_data(as_text=True), bad
    # An audit entry that does not exist: an empty list, no summary.
    html = viewer.get("/events?audit=999999").get_data(as_text=True)
    assert count_of(html) == 0 and 'class="tracking-summary"' not in html
