"""Sending again what Stripe lost, from the Reconciliation page, on SQLite and PostgreSQL,
through the real SDK against a fake that lost a customer's day: a preview first (operators
only), then once; where Stripe holds part of the day, the events are listed for a person, who
sends again only the ones ticked."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from html import unescape

import pytest
from conftest import make_settings
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session
from support.fake_stripe import FakeStripe

from webapp import create_app
from webapp.models import AuditEntry, OutboxEvent, ReconciliationMismatch, utcnow
from webapp.outbox import enqueue_usage, operations
from webapp.services import services_of
from webapp.worker import Drainer, gateway_from, reconcile

from .conftest import csrf_of, login

T = OutboxEvent.__table__
X = ReconciliationMismatch.__table__
A = AuditEntry.__table__
#: The tests' "now": later than anything the drain stamps (the reconciliation that starts
#: then compared every event sent before it); today's start and the day lost, two days
#: before. Set as each test starts (:func:`_clock`), never at import.
T0: datetime
TODAY: datetime
LOST: datetime
TOKEN = re.compile(r'name="snapshot" value="([^"]+)"')


@pytest.fixture(autouse=True)
def _clock() -> None:
    global T0, TODAY, LOST
    T0 = utcnow() + timedelta(hours=2)
    TODAY = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    LOST = TODAY - timedelta(days=2)


@pytest.fixture
def fake() -> Iterator[FakeStripe]:
    with FakeStripe() as f:
        yield f


@pytest.fixture
def live(engine: Engine, db_url: str, fake: FakeStripe, users: dict[str, str]) -> Flask:
    settings = make_settings(db_url, stripe_api_base=fake.base_url,
                             reconcile_settle_seconds=3600)
    app = create_app({"TESTING": True}, settings=settings, engine=engine, start_drainer=False)
    services_of(app).clock = lambda: T0 + timedelta(minutes=1)
    return app


@pytest.fixture
def sent(engine: Engine, live: Flask) -> list[int]:
    """acme's api_requests on the lost day, 4, 5 and 6 units, sent to cus_acme."""
    operations.set_tenant(engine, "acme", stripe_customer_id="cus_acme", name=None,
                          now=utcnow())
    with Session(engine) as db, db.begin():
        ids = [int(enqueue_usage(db, tenant_id="acme", quantity=q, meter="api_requests",
                                 idempotency_key=f"day:{q}",
                                 occurred_at=LOST + timedelta(hours=10, minutes=q)).id)
               for q in (4, 5, 6)]
    drain(engine, live, utcnow())
    return ids


def drain(engine: Engine, app: Flask, now: datetime) -> None:
    drainer = Drainer(engine, services_of(app).settings, services_of(app).gateway(),
                      clock=lambda: now)
    try:
        while drainer.drain_once().claimed:
            pass
    finally:
        drainer.close()


def find_lost_day(engine: Engine, app: Flask) -> tuple[int, int]:
    """Reconcile at ``T0``: the run's id and its mismatch's."""
    settings = services_of(app).settings
    gateway = gateway_from(settings)
    assert gateway is not None
    run = reconcile(engine, gateway, settings, trigger="cli", now=T0)
    with engine.connect() as conn:
        [mismatch] = conn.execute(select(X.c.id).where(X.c.run_id == run.id)).scalars()
    assert run.id is not None
    return run.id, int(mismatch)


def signed_in(app: Flask, email: str) -> FlaskClient:
    client = app.test_client()
    login(client, email)
    return client


def statuses(engine: Engine, ids: list[int]) -> list[tuple[str, str | None]]:
    with engine.connect() as conn:
        return [(r.status, r.stripe_identifier) for r in conn.execute(
            select(T.c.status, T.c.stripe_identifier).where(T.c.id.in_(ids)).order_by(T.c.id))]


def resends(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).where(A.c.action == "resend"))
                   .scalar_one())


def test_an_operator_previews_then_sends_a_lost_day_again_once(
        live: Flask, engine: Engine, fake: FakeStripe, users: dict[str, str],
        sent: list[int]) -> None:
    fake.forget("cus_acme", "api_requests", LOST.date())
    run_id, mismatch = find_lost_day(engine, live)
    viewer = signed_in(live, users["viewer"])
    page = viewer.get("/reconciliation").get_data(as_text=True)
    assert "/resend" not in page                                # viewers see no button
    assert f'href="/reconciliation/mismatches/{mismatch}"' in page
    day = viewer.get(f"/reconciliation/mismatches/{mismatch}").get_data(as_text=True)
    assert '<dd data-k="ours">15</dd>' in day and '<dd data-k="stripe">0</dd>' in day
    assert "Stripe has <strong>none</strong> of this day" in day
    assert "Send again…" not in day and 'name="ids"' not in day
    assert viewer.get(f"/reconciliation/mismatches/{mismatch}/resend").status_code == 403

    client = signed_in(live, users["operator"])
    page = client.get("/reconciliation").get_data(as_text=True)
    assert f'href="/reconciliation/mismatches/{mismatch}/resend" title="Stripe has none of ' \
           'this day: send its events again">Send again…</a>' in page
    preview = client.get(f"/reconciliation/mismatches/{mismatch}/resend").get_data(as_text=True)
    said = " ".join(unescape(preview).split())
    assert ("These 3 events (15 units) are sent to Stripe again under new identifiers; Stripe "
            "has none of them for this day, so this cannot bill twice.") in said
    assert all(f"day:{q}</code> → <code>day:{q}~r1" in preview for q in (4, 5, 6))
    assert statuses(engine, sent) == [("sent", None)] * 3       # a preview changes nothing
    token = TOKEN.search(preview)
    assert token
    form = {"snapshot": token.group(1), "csrf_token": csrf_of(client)}
    done = client.post(f"/reconciliation/mismatches/{mismatch}/resend", data=form)
    assert done.status_code == 303
    assert done.headers["Location"] == f"/reconciliation?run={run_id}"
    assert statuses(engine, sent) == [("pending", f"day:{q}~r1") for q in (4, 5, 6)]
    with engine.connect() as conn:
        audit_id = conn.execute(select(A.c.id).where(A.c.action == "resend")).scalar_one()
    page = client.get(done.headers["Location"]).get_data(as_text=True)
    assert "Sent again: 3 event(s), 15 units of api_requests for cus_acme" in unescape(page)
    assert f'<a href="/events?audit={audit_id}">See what becomes of them</a>' in page
    tracked = client.get(f"/events?audit={audit_id}").get_data(as_text=True)
    assert "<strong>3 sent again</strong>: 0 sent, 3 waiting" in " ".join(tracked.split())

    # A second click (the same preview, or a new one) does nothing more, and says so.
    again = client.post(f"/reconciliation/mismatches/{mismatch}/resend", data=form)
    assert again.status_code == 303
    page = client.get(again.headers["Location"]).get_data(as_text=True)
    assert "Nothing changed: Already sent again: 3 event(s)" in unescape(page)
    refused = client.get(f"/reconciliation/mismatches/{mismatch}/resend").get_data(as_text=True)
    assert "Already sent again" in refused and 'name="snapshot"' not in refused
    assert resends(engine) == 1

    drain(engine, live, T0 + timedelta(minutes=2))
    assert statuses(engine, sent) == [("sent", f"day:{q}~r1") for q in (4, 5, 6)]
    day = client.get(f"/reconciliation/mismatches/{mismatch}").get_data(as_text=True)
    assert "3 events (15 units) of this day were sent again since" in day
    assert f'href="/events?audit={audit_id}"' in day
    settings = services_of(live).settings
    gateway = gateway_from(settings)
    assert gateway is not None
    later = reconcile(engine, gateway, settings, trigger="cli", now=T0 + timedelta(hours=2))
    assert later.comparison.mismatches == [] and later.comparison.checked == 1


def test_a_partly_held_day_lists_its_events_and_sends_only_the_ticked_ones(
        live: Flask, engine: Engine, fake: FakeStripe, users: dict[str, str],
        sent: list[int]) -> None:
    fake.forget("cus_acme", "api_requests", LOST.date(), keep=1)
    lost = sorted(int(i) for i, key in zip(sent, ("day:4", "day:5", "day:6"), strict=True)
                  if fake.accepted()[key].lost)
    _, mismatch = find_lost_day(engine, live)
    client = signed_in(live, users["operator"])
    page = client.get("/reconciliation").get_data(as_text=True)
    assert "/resend" not in page                                # no bulk button
    assert "Stripe has part: the events" in page
    day = client.get(f"/reconciliation/mismatches/{mismatch}").get_data(as_text=True)
    assert "Nothing is sent again in bulk" in day and "data-select-all" not in day
    assert all(f'name="ids" value="{i}"' in day for i in sent)
    assert all(f'href="/events/{i}"' in day for i in sent)     # cancel is on each one's page
    assert 'href="/reconciliation/mismatches/' + str(mismatch) + '/resend"' not in day
    # The whole day, asked for by hand, is refused in plain words: nothing to confirm.
    bulk = client.get(f"/reconciliation/mismatches/{mismatch}/resend").get_data(as_text=True)
    assert "never sent again in bulk" in bulk and 'name="snapshot"' not in bulk
    every = "&".join(f"ids={i}" for i in sent)
    too_many = client.get(f"/reconciliation/mismatches/{mismatch}/resend?{every}")
    assert "choose fewer" in too_many.get_data(as_text=True)

    query = "&".join(f"ids={i}" for i in lost)
    preview = client.get(f"/reconciliation/mismatches/{mismatch}/resend?{query}")
    html = preview.get_data(as_text=True)
    assert "These 2 chosen events" in html
    token = TOKEN.search(html)
    assert token
    form = {"snapshot": token.group(1), "csrf_token": csrf_of(client)}
    # The preview is of this mismatch: posted to another, it is refused.
    other = client.post(f"/reconciliation/mismatches/{mismatch + 1}/resend", data=form)
    assert other.status_code == 400 and resends(engine) == 0
    done = client.post(f"/reconciliation/mismatches/{mismatch}/resend", data=form)
    assert done.status_code == 303
    expected = [("pending" if i in lost else "sent") for i in sent]
    assert [s for s, _ in statuses(engine, sent)] == expected
    viewer = signed_in(live, users["viewer"])
    seen = viewer.get(f"/reconciliation/mismatches/{mismatch}").get_data(as_text=True)
    assert 'name="ids"' not in seen and "Preview sending" not in seen
    assert '<dd data-k="stripe">' in seen
