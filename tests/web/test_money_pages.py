"""The pages of the money loop, as people use them: the rejected events with their reasons in
plain words, the reconciliation's findings, Stripe's side, an event's rejection and its cancel,
and what the Overview says of all of it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from html import unescape
from typing import Any

import pytest
from conftest import make_settings, wait_for
from flask import Flask
from sqlalchemy import Engine, select
from support.fake_stripe import FakeStripe

from webapp import create_app
from webapp.models import OutboxEvent, ReconciliationRun, utcnow

from .conftest import csrf_of, login

T = OutboxEvent.__table__


def rejected(seed: Any, **kw: Any) -> int:
    now = utcnow()
    fields = dict(status="rejected", rejected_at=now, sent_at=now - timedelta(minutes=5),
                  reject_code="meter_event_customer_not_found",
                  reject_message="No such customer: 'cus_ghost'", stripe_customer_id="cus_ghost",
                  reject_event_id="evt_123", tenant_id="ghost", attempt_count=1, call_count=1)
    fields.update(kw)
    return int(seed.event(**fields))


def test_the_rejected_page_says_why_in_plain_words(client_as: Any, seed: Any) -> None:
    seed.tenant("ghost", "cus_right")
    eid = rejected(seed, reject_message="<b>No such customer</b>")
    html = client_as("viewer").get("/rejected").get_data(as_text=True)
    assert "Stripe does not know customer cus_ghost: check the tenant&#39;s mapping" in html
    # The group of such events speaks of several customers.
    assert "Stripe does not know these events&#39; customers" in html
    assert "&lt;b&gt;No such customer&lt;/b&gt;" in html and "<b>No such" not in html
    assert "now mapped to <code>cus_right</code>" in html
    assert f'href="/events/{eid}"' in html
    assert "Requeue selected" not in html                      # a viewer acts on nothing
    assert "nothing was billed" in html.lower()


def test_an_operator_requeues_a_rejected_event_under_a_new_identifier(client_as: Any,
                                                                       seed: Any) -> None:
    eid = rejected(seed, idempotency_key="usage:7")
    client = client_as("operator")
    html = client.get("/rejected").get_data(as_text=True)
    assert "Requeue selected" in html and "Requeue these…" in html
    resp = client.post("/dead-letters/requeue", data={"ids": [eid], "next": "/rejected",
                                                      "csrf_token": csrf_of(client)})
    assert resp.status_code == 303 and resp.headers["Location"] == "/rejected"
    r = seed.get(eid)
    assert (r.status, r.stripe_identifier, r.stripe_customer_id) == ("pending", "usage:7~r1",
                                                                     None)
    page = client.get(f"/events/{eid}").get_data(as_text=True)
    assert "usage:7~r1" in page and "new identifier no. 1, after Stripe rejected" in page


def test_requeue_all_rejected_of_one_reason_acts_on_the_preview(client_as: Any,
                                                                seed: Any) -> None:
    ours = [rejected(seed) for _ in range(3)]
    other = rejected(seed, reject_code="archived_meter")
    client = client_as("operator")
    preview = client.get("/rejected/requeue-all?code=meter_event_customer_not_found")
    html = preview.get_data(as_text=True)
    assert '<dd data-k="events">3</dd>' in html
    token = re.search(r'name="snapshot" value="([^"]+)"', html)
    assert token
    late = rejected(seed)                                       # rejected after the preview
    resp = client.post("/rejected/requeue-all", data={"snapshot": token.group(1),
                                                      "csrf_token": csrf_of(client)})
    assert resp.status_code == 303
    statuses = seed.statuses()
    assert [statuses[i] for i in ours] == ["pending"] * 3
    assert statuses[other] == statuses[late] == "rejected"


def test_a_rejected_events_page_offers_the_fix(client_as: Any, seed: Any) -> None:
    eid = rejected(seed)
    html = client_as("operator").get(f"/events/{eid}").get_data(as_text=True)
    assert 'id="rejected-panel"' in html and "Requeue under a new identifier" in html
    assert "evt_123" in html and "meter_event_customer_not_found" in html


def test_reconciliation_page_names_each_mismatch_and_links_to_it(client_as: Any,
                                                                  seed: Any) -> None:
    seed.stripe_history(utcnow())
    html = client_as("viewer").get("/reconciliation").get_data(as_text=True)
    assert '<dd data-k="mismatches" class="bad">1</dd>' in html
    assert "cus_acme" in html and "+40" in html and "Stripe has more" in html
    assert "https://dashboard.stripe.com/test/customers/cus_acme" in html
    assert "meter plan_level: not compared" in html
    assert "Reconcile the last 35 days now" not in html         # viewers cannot start one


def test_the_stripe_page_names_a_missing_meter_and_what_to_do(client_as: Any,
                                                              seed: Any) -> None:
    seed.stripe_history(utcnow())
    seed.event(status="pending", meter="plan_level")
    seed.event(status="pending", meter="storage_gb")
    html = client_as("viewer").get("/stripe").get_data(as_text=True)
    assert "of <code>plan_level</code> wait" in html and "reactivate it in Stripe" in html
    assert "of <code>storage_gb</code> wait" in html and "create one in Stripe" in html
    assert "last value: not reconciled" in html
    assert "no event of ours has this identifier" in html
    overview = client_as("viewer").get("/").get_data(as_text=True)
    assert "events wait for meter storage_gb" in overview


def test_the_stripe_page_and_overview_say_why_a_pre_aggregated_meters_events_wait(
        client_as: Any, seed: Any, engine: Engine) -> None:
    """Stripe keeps one value per window of such a meter: its row and the events waiting for
    it say so in plain words, and what makes them go out; Stripe's window text is escaped."""
    from webapp.outbox.meters import MeterInfo, store_meters
    from webapp.outbox.stripe_runs import METERS, record_run

    now = utcnow()
    store_meters(engine, [MeterInfo("api_requests", "mtr_1", "active"),
                          MeterInfo("seats", "mtr_2", "active", event_time_window="day"),
                          MeterInfo("calls", "mtr_3", "inactive", event_time_window="hour"),
                          MeterInfo("odd", "mtr_4", "active", event_time_window="<b>x</b>")],
                 now=now)
    record_run(engine, METERS, ok=True, detail=None, now=now)
    seed.events(2, status="pending", meter="seats")
    seed.event(status="pending", meter="calls")
    seed.event(status="pending", meter="api_requests")
    html = client_as("viewer").get("/stripe").get_data(as_text=True)
    day = ("Pre-aggregated (one value per day): Stripe would keep only the last event of each "
           "day, so its events are not sent. They go out once Stripe has a meter without a "
           "time window for their event name")
    row = re.search(r'<tr data-meter="seats">.*?</tr>', html, re.S)
    assert row and "pre-aggregated</span>" in row.group(0) and day in row.group(0)
    waiting = re.search(r'<li data-meter="seats">.*?</li>', html, re.S)
    assert waiting and "<strong>2</strong> events" in waiting.group(0)
    assert day in waiting.group(0) and "reactivate" not in waiting.group(0)
    # Deactivated and pre-aggregated: reactivating it would not send them.
    calls = re.search(r'<li data-meter="calls">.*?</li>', html, re.S)
    assert calls and "deactivated" in calls.group(0) and "reactivate it" not in calls.group(0)
    assert "Pre-aggregated (one value per hour)" in calls.group(0)
    plain = re.search(r'<tr data-meter="api_requests">.*?</tr>', html, re.S)
    assert plain and "Pre-aggregated" not in plain.group(0)
    assert 'data-meter="api_requests"><strong>' not in html          # nothing waits for it
    assert "one value per &lt;b&gt;x&lt;/b&gt;" in html and "<b>x</b>" not in html
    overview = client_as("viewer").get("/").get_data(as_text=True)
    assert "2 events wait for meter seats" in overview and day in overview


def test_the_overview_says_what_happened_after_stripes_200(client_as: Any, seed: Any) -> None:
    seed.stripe_history(utcnow())
    rejected(seed)
    html = client_as("viewer").get("/").get_data(as_text=True)
    assert "1 event rejected by Stripe" in html
    assert "Reconciliation found 1 mismatch" in html
    assert "Stripe&#39;s error reports could not be read" in html
    assert 'href="/rejected"' in html and 'href="/reconciliation?run=' in html


# -- with Stripe to ask (the fake) ------------------------------------------------------------

@pytest.fixture
def fake() -> Iterator[FakeStripe]:
    with FakeStripe() as f:
        yield f


@pytest.fixture
def live(engine: Engine, db_url: str, fake: FakeStripe, users: dict[str, str]) -> Flask:
    settings = make_settings(db_url, stripe_api_base=fake.base_url)
    return create_app({"TESTING": True}, settings=settings, engine=engine, start_drainer=False)


@pytest.mark.parametrize("with_id", [False, True], ids=["request-id", "adjustment-id"])
def test_cancel_from_the_event_page_asks_first(live: Flask, engine: Engine, fake: FakeStripe,
                                               users: dict[str, str], seed: Any,
                                               with_id: bool) -> None:
    """The button asks first, then cancels at Stripe; the event keeps Stripe's answer (its
    status, and the adjustment's id when the answer has one, else the call's request id),
    and its page, the flash and the audit entry show it."""
    from webapp.worker import Drainer

    seed.tenant("acme", "cus_acme")
    eid = seed.event(status="pending", idempotency_key="to-cancel")
    if with_id:
        fake.answer_adjustments(status="complete", ids=True)
    drainer = Drainer(engine, live.extensions["billing_outbox"].settings,
                      live.extensions["billing_outbox"].gateway())
    drainer.drain_once()
    drainer.close()
    client = live.test_client()
    login(client, users["operator"])
    page = client.get(f"/events/{eid}").get_data(as_text=True)
    assert "Cancel at Stripe…" in page
    confirm = client.get(f"/events/{eid}/cancel").get_data(as_text=True)
    assert "an invoice Stripe has finalized, that invoice is not changed" in confirm
    token = csrf_of(client)
    unticked = client.post(f"/events/{eid}/cancel", data={"reason": "duplicate", "note": "x",
                                                          "csrf_token": token})
    assert unticked.status_code == 303 and seed.get(eid).status == "sent"
    done = client.post(f"/events/{eid}/cancel", data={"reason": "duplicate", "note": "twice",
                                                      "confirm": "yes", "csrf_token": token})
    assert done.status_code == 303 and seed.get(eid).status == "cancelled"
    assert fake.accepted()["to-cancel"].cancelled
    [answered] = fake.adjustments()
    status, reference = (("complete", answered["id"]) if with_id
                         else ("pending", answered["request_id"]))
    r = seed.get(eid)
    assert (r.cancel_adjustment_status, r.cancel_adjustment_id) == (status, reference)
    page = client.get(f"/events/{eid}").get_data(as_text=True)
    said = f"Event {eid} is cancelled at Stripe: adjustment {status}, id {reference}."
    assert said in unescape(page)                                   # the flash
    assert f"<h2>Cancelled at Stripe: adjustment {status}</h2>" in page
    assert f"id <code>{reference}</code>" in page
    assert ("the meter may show the usage for a little while" in page) == (status == "pending")
    assert f"Stripe answered: event {eid}: adjustment {status}, id {reference}" in page  # audit


def test_reconcile_now_runs_in_the_background(live: Flask, engine: Engine,
                                             users: dict[str, str]) -> None:
    client = live.test_client()
    login(client, users["operator"])
    resp = client.post("/reconciliation/run", data={"csrf_token": csrf_of(client)})
    assert resp.status_code == 303

    def stored() -> bool:
        with engine.connect() as conn:
            return conn.execute(select(ReconciliationRun.__table__.c.trigger)).scalar() \
                == "button"

    wait_for(stored, 15, message="the run stored")
    html = client.get("/reconciliation").get_data(as_text=True)
    assert "operator@example.com" in html
    # No event in the window: said so, never "matches".
    assert "nothing to compare" in html and "nothing compared" in html
    assert "Every compared day matches" not in html
