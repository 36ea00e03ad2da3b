"""The event page: every field, every attempt, the audit entries touching it; what a cancel
at Stripe says it does."""

from __future__ import annotations

import re
from html import unescape

from webapp.models import utcnow
from webapp.outbox.meters import MeterInfo, store_meters
from webapp.outbox.stripe_runs import METERS, record_run
from webapp.read.events import event_detail
from webapp.read.words import CANCEL_WORDS, STATE_WORDS

from .conftest import csrf_of


def test_event_page_shows_fields_attempts_and_audit(client_as, seed, users) -> None:
    ev = seed.event(status="dead", idempotency_key="usage_log:42", last_request_id="req_123",
                    stripe_customer_id="cus_9", quantity=17)
    seed.attempt(ev, outcome="unknown", http_status=502, stripe_request_id="req_A",
                 error_class="APIError", error_message="bad gateway", worker="host:1:ab",
                 duration_ms=3456)
    seed.attempt(ev, outcome="permanent", http_status=400, stripe_request_id="req_B",
                 applied=False)
    operator = client_as("operator")
    operator.post("/dead-letters/resolve", data={"ids": [ev], "reason": "duplicate",
                                                 "note": "dup of 41",
                                                 "csrf_token": csrf_of(operator)})
    html = client_as("viewer").get(f"/events/{ev}").get_data(as_text=True)
    for text in ("usage_log:42", "req_123", "cus_9", "req_A", "req_B", "host:1:ab", "3456",
                 "bad gateway", "not applied", "duplicate", "dup of 41", users["operator"],
                 "resolve", "Every column, raw", "key_generation", "claim_token"):
        assert text in html, text
    assert "Resolved" in html


def test_dead_event_offers_actions_to_operators_only(client_as, seed) -> None:
    ev = seed.event(status="dead")
    assert "Requeue" in client_as("operator").get(f"/events/{ev}").get_data(as_text=True)
    viewer_html = client_as("viewer").get(f"/events/{ev}").get_data(as_text=True)
    assert 'action="/dead-letters/requeue"' not in viewer_html


def test_requeue_from_the_event_page_returns_to_it(client_as, seed) -> None:
    ev = seed.event(status="dead")
    client = client_as("operator")
    resp = client.post("/dead-letters/requeue", data={"ids": [ev], "next": f"/events/{ev}",
                                                      "csrf_token": csrf_of(client)})
    assert resp.headers["Location"] == f"/events/{ev}"
    html = client.get(f"/events/{ev}").get_data(as_text=True)
    assert 'status-pending' in html and "requeue" in html


def test_missing_event_and_find(client_as, seed) -> None:
    ev = seed.event(idempotency_key="order:7")
    client = client_as("viewer")
    assert client.get("/events/999999").status_code == 404
    # The old jump box's address goes to the search, which goes straight to a single hit.
    assert client.get("/events?q=order:7").headers["Location"] == "/search?q=order:7"
    assert client.get("/events?q=order:7", follow_redirects=True).request.path == f"/events/{ev}"
    assert client.get(f"/events?q={ev}", follow_redirects=True).request.path == f"/events/{ev}"
    miss = client.get("/events?q=nope", follow_redirects=True)
    assert miss.request.path == "/search" and "nope" in miss.get_data(as_text=True)


def test_an_unmapped_tenants_event_says_it_waits_for_a_customer(client_as, seed) -> None:
    """Its next attempt is the mapping (the deferrer moves its time), not a clock time; once
    the tenant is mapped, the time shows again."""
    waiting = seed.event(tenant_id="ghost")
    html = client_as("viewer").get(f"/events/{waiting}").get_data(as_text=True)
    assert 'id="waits-for-customer"' in html and "/mappings?tenant=ghost" in html
    seed.tenant("ghost", "cus_ghost")
    html = client_as("viewer").get(f"/events/{waiting}").get_data(as_text=True)
    assert 'id="waits-for-customer"' not in html


def test_an_event_of_a_missing_meter_says_it_waits_for_the_meter(client_as, seed,
                                                                  engine) -> None:
    """Once Stripe's meters are listed and its meter is not active, the event's next attempt
    is the meter, not a clock time; a listing that shows the meter ends it."""
    seed.tenant("acme", "cus_acme")
    waiting = seed.event(tenant_id="acme", meter="storage_gb")
    now = utcnow()
    store_meters(engine, [MeterInfo("api_requests", "mtr_1", "active")], now=now)
    record_run(engine, METERS, ok=True, detail=None, now=now)
    html = client_as("viewer").get(f"/events/{waiting}").get_data(as_text=True)
    assert 'id="waits-for-meter"' in html and "storage_gb" in html
    assert 'id="waits-for-customer"' not in html
    store_meters(engine, [MeterInfo("api_requests", "mtr_1", "active"),
                          MeterInfo("storage_gb", "mtr_2", "active")], now=now)
    html = client_as("viewer").get(f"/events/{waiting}").get_data(as_text=True)
    assert 'id="waits-for-meter"' not in html


def test_an_event_of_a_pre_aggregated_meter_says_why_it_is_not_sent(client_as, seed,
                                                                    engine) -> None:
    """Its next attempt is a meter without a time window, and the page says why: Stripe
    would keep only the last event of each window. A listing that shows the event name's
    meter ordinary ends it."""
    seed.tenant("acme", "cus_acme")
    waiting = seed.event(tenant_id="acme", meter="seats")
    now = utcnow()
    store_meters(engine, [MeterInfo("seats", "mtr_1", "active", event_time_window="hour")],
                 now=now)
    record_run(engine, METERS, ok=True, detail=None, now=now)
    html = client_as("viewer").get(f"/events/{waiting}").get_data(as_text=True)
    assert 'id="waits-for-meter" data-why="pre-aggregated"' in html
    assert ("is pre-aggregated (one value per hour): Stripe would keep only the last event "
            "of each hour, so its events are not sent.") in html
    assert "reactivate" not in html
    store_meters(engine, [MeterInfo("seats", "mtr_2", "active")], now=now)
    html = client_as("viewer").get(f"/events/{waiting}").get_data(as_text=True)
    assert 'id="waits-for-meter"' not in html and "pre-aggregated" not in html


#: What a cancel must not promise: Stripe does not reopen an invoice it finalized.
PROMISES = ("will not be on the invoice", "not billed", "will not be billed", "'s invoice")


def test_the_cancel_confirm_says_what_stripe_does_and_promises_no_more(client_as,
                                                                       seed) -> None:
    ev = seed.event(status="sent", tenant_id="acme", quantity=7)
    page = unescape(client_as("operator").get(f"/events/{ev}/cancel").get_data(as_text=True))
    for line in CANCEL_WORDS:
        assert line in page, line
    assert "invoice Stripe has finalized, that invoice is not changed" in page
    assert "credit the customer in Stripe" in page and "within 24 hours" in page
    assert "Take these 7 units off acme's meter at Stripe" in page
    for promise in PROMISES:
        assert promise not in page, promise


def test_a_cancelled_event_says_a_finalized_invoice_is_not_changed(client_as, seed) -> None:
    ev = seed.event(status="cancelled", sent_at=utcnow(), cancelled_at=utcnow(),
                    cancel_reason="duplicate", cancelled_by="ops@example.com")
    page = unescape(client_as("viewer").get(f"/events/{ev}").get_data(as_text=True))
    assert "Cancelled at Stripe" in page and STATE_WORDS["cancelled"] in page
    assert CANCEL_WORDS.finalized_invoice in page
    for promise in PROMISES:
        assert promise not in page, promise

DUPLICATE = ("An event already exists with identifier usage_log:7; events are deduplicated "
             "within 24 hours")


def _attempt_cells(html: str) -> dict[str, str]:
    """The attempts table: each row's "Stripe's answer" cell (its inner HTML), by request id."""
    table = html[html.index('id="attempts"'):].split("</table>")[0]
    head = re.search(r"<thead>(.*?)</thead>", table, re.S).group(1)
    columns = re.findall(r"<th[^>]*>(.*?)</th>", head)
    at = [unescape(c) for c in columns].index("Stripe's answer")
    cells = {}
    for row in re.findall(r"<tr id=\"attempt-\d+\".*?</tr>", table, re.S):
        tds = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
        request = re.search(r"<code>(req_\w+)</code>", row).group(1)
        cells[request] = tds[at]
    return cells


def test_stripes_answer_is_a_note_when_the_event_was_already_there(client_as, seed,
                                                                   engine) -> None:
    """Stripe's "already exists" answer means delivered, counted once: its message is shown
    as a note under "Stripe's answer", never as an error; real errors still read as errors,
    and a plain 200 says nothing."""
    ev = seed.event(status="sent", idempotency_key="usage_log:7", attempt_count=3,
                    call_count=3)
    seed.attempt(ev, outcome="unknown", http_status=500, error_class="APIError",
                 error_message="An unknown error occurred", stripe_request_id="req_first")
    seed.attempt(ev, outcome="not_executed", http_status=429, error_class="RateLimitError",
                 error_code="rate_limit", stripe_request_id="req_second")
    seed.attempt(ev, outcome="delivered", http_status=400, error_class="InvalidRequestError",
                 error_message=DUPLICATE, stripe_request_id="req_third")
    ok = seed.event(status="sent")
    seed.attempt(ok, stripe_request_id="req_plain")

    by_request = {a["stripe_request_id"]: a["answer"]
                  for e in (ev, ok) for a in event_detail(engine, e).attempts}
    assert by_request == {"req_first": "Error", "req_second": "Error",
                          "req_third": "Already at Stripe", "req_plain": None}

    viewer = client_as("viewer")
    html = viewer.get(f"/events/{ev}").get_data(as_text=True)
    assert ">Error<" not in html.split('id="attempts"')[1].split("</thead>")[0]
    cells = _attempt_cells(html)
    note = cells["req_third"]
    assert text_of(note) == f"Already at Stripe: {DUPLICATE}"
    assert 'class="answer-note"' in note
    for error_mark in ("answer-error", '"err"', "Error"):
        assert error_mark not in note, error_mark
    for request, words in (("req_first", "Error: APIError An unknown error occurred"),
                           ("req_second", "Error: RateLimitError rate_limit")):
        assert text_of(cells[request]) == words, cells[request]
        assert 'class="answer-error"' in cells[request] and 'class="err"' in cells[request]
    assert text_of(_attempt_cells(viewer.get(f"/events/{ok}").get_data(as_text=True))[
        "req_plain"]) == ""


def text_of(html: str) -> str:
    return unescape(" ".join(re.sub(r"<[^>]+>", " ", html).split())).replace(" :", ":")
