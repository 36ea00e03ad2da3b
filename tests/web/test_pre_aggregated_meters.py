"""A pre-aggregated meter (``event_time_window`` ``day`` or ``hour``): Stripe keeps one value
per customer and window, the last one sent, so the outbox, which sends one event per unit of
work, sends none to it. Its events wait, the status line and the event page say why, and once
Stripe lists the event name's meter without a window (a new meter: Stripe cannot change a
meter's window), a refresh of the meters makes them due and a drain sends each once.

Through the real SDK against the fake, in ``v1`` and ``v2_stream``, on SQLite and PostgreSQL;
the pages as a person reads them."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from conftest import make_settings
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session
from support.fake_stripe import FakeStripe
from support.loop import drain_all

from webapp import create_app
from webapp.config import Settings
from webapp.db import reading
from webapp.models import OutboxEvent, utcnow
from webapp.outbox import enqueue_usage, operations
from webapp.outbox.deferred import DEFER_AFTER, DEFER_FOR
from webapp.read.health import health
from webapp.worker import Drainer, gateway_from
from webapp.worker.deferrer import Deferrer

from .conftest import login

T = OutboxEvent.__table__
SEATS = [f"seats:{i}" for i in range(3)]
WHY = ("pre-aggregated (one value per day): Stripe would keep only the last event of each "
       "day, so its events are not sent.")


@pytest.fixture
def fake() -> Iterator[FakeStripe]:
    with FakeStripe(customers=("cus_known",)) as f:
        yield f


@pytest.fixture(params=["v1", "v2_stream"])
def settings(request: pytest.FixtureRequest, db_url: str, fake: FakeStripe) -> Settings:
    return make_settings(db_url, stripe_api_base=fake.base_url, meter_event_api=request.param)


@pytest.fixture
def drainer(engine: Engine, settings: Settings) -> Iterator[Drainer]:
    d = Drainer(engine, settings, gateway_from(settings))
    yield d
    d.close()


@pytest.fixture
def viewer(engine: Engine, settings: Settings, users: dict[str, str]) -> FlaskClient:
    app: Flask = create_app({"TESTING": True}, settings=settings, engine=engine,
                            start_drainer=False)
    client = app.test_client()
    assert login(client, users["viewer"]).status_code == 303
    return client


def enqueue(engine: Engine, key: str, meter: str) -> int:
    with Session(engine) as db, db.begin():
        return int(enqueue_usage(db, tenant_id="known", quantity=2, idempotency_key=key,
                                 meter=meter).id)


def rows(engine: Engine, ids: list[int]) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(select(T).where(T.c.id.in_(ids)).order_by(T.c.id)))




def status_line(html: str) -> str:
    found = re.search(r'<span class="status-detail">(.*?)</span>', html, re.S)
    assert found, "every page has the status line"
    return found.group(1)


def test_a_pre_aggregated_meters_events_wait_and_go_out_once_it_is_ordinary(
        engine: Engine, fake: FakeStripe, settings: Settings, drainer: Drainer,
        viewer: FlaskClient) -> None:
    operations.set_tenant(engine, "known", stripe_customer_id="cus_known", name=None,
                          now=utcnow())
    first = fake.add_meter("seats", event_time_window="day")
    ids = [enqueue(engine, key, "seats") for key in SEATS]
    other = enqueue(engine, "calls:1", "api_requests")
    drain_all(drainer)

    # Not sent: Stripe took only the ordinary meter's event, and was never asked for these.
    assert set(fake.accepted()) == {"calls:1"} and fake.accept_count() == 1
    assert [(r.status, r.call_count, r.attempt_count, r.last_outcome)
            for r in rows(engine, ids)] == [("pending", 0, 0, None)] * 3
    assert rows(engine, [other])[0].status == "sent"
    line = status_line(viewer.get("/").get_data(as_text=True))
    assert "3 events wait for the meter “seats”, which is " + WHY in line
    page = viewer.get(f"/events/{ids[0]}").get_data(as_text=True)
    assert 'data-why="pre-aggregated"' in page and WHY in page
    stripe_page = viewer.get("/stripe").get_data(as_text=True)
    assert "1 pre-aggregated (not sent to)" in stripe_page

    # The deferrer puts them off as for a missing meter; the line still says why.
    later = utcnow() + DEFER_AFTER + timedelta(minutes=1)
    assert Deferrer(engine, clock=lambda: later).run_once() == 3
    assert all(r.next_attempt_at >= later + DEFER_FOR - timedelta(seconds=1)
               for r in rows(engine, ids))
    with reading(engine) as conn:
        h = health(conn, now=later, api_key_here=True)
    assert (h.state, h.meter) == ("meter_missing", "seats") and WHY in h.detail
    drain_all(drainer)
    assert fake.accept_count() == 1

    # Stripe now has an ordinary meter for the event name: the next listing makes them due,
    # and a drain sends each once.
    second = fake.add_meter("seats")
    assert second != first
    assert drainer.meters is not None
    drainer.meters.refresher.run_once()
    drainer.meters.invalidate()
    assert all(r.next_attempt_at <= utcnow() for r in rows(engine, ids))
    drain_all(drainer)
    assert [r.status for r in rows(engine, ids)] == ["sent"] * 3
    accepted = fake.accepted()
    assert {k: (accepted[k].event_name, accepted[k].customer, accepted[k].value)
            for k in SEATS} == {k: ("seats", "cus_known", "2") for k in SEATS}
    assert fake.accept_count() == 4 and fake.also_accepted() == []
    assert fake.duplicate_identifier_rejections() == 0
    if settings.meter_event_api == "v1":
        assert sorted(e["identifier"] for e in fake.request_log()
                      if e["identifier"] in SEATS) == SEATS
    else:
        assert fake.stream_duplicates() == 0
        assert sorted(i for e in fake.stream_log() for i in e["identifiers"]
                      if i in SEATS) == SEATS
    assert "“seats”" not in status_line(viewer.get("/").get_data(as_text=True))
    assert 'id="waits-for-meter"' not in viewer.get(f"/events/{ids[0]}").get_data(as_text=True)
