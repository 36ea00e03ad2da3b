"""Every refused unit found: Stripe counts every event it refused and samples three. For a
customer Stripe does not have, every event sent to it in the report's window was refused; for
one it has deleted, every event sent after the deletion: asked about the customers, the
outbox rejects each of them, never more than Stripe counted, and none of a customer Stripe
has. Through the real SDK against the fake, on SQLite and PostgreSQL (more in
``tests/worker/test_refusals_by_asking.py``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from conftest import make_settings
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session
from support.fake_stripe import FakeStripe
from support.loop import drain_all, poll_reports

from webapp.config import Settings
from webapp.models import OutboxEvent, StripeErrorSample, utcnow
from webapp.outbox import enqueue_usage, operations, refused
from webapp.worker import Drainer, gateway_from

T = OutboxEvent.__table__
S = StripeErrorSample.__table__


@pytest.fixture
def fake() -> Iterator[FakeStripe]:
    with FakeStripe() as f:
        f.create_customer("cus_keep", name="Keep")
        f.create_customer("cus_gone", name="Gone")
        yield f


@pytest.fixture
def settings(db_url: str, fake: FakeStripe) -> Settings:
    return make_settings(db_url, stripe_api_base=fake.base_url)


@pytest.fixture
def drainer(engine: Engine, settings: Settings) -> Iterator[Drainer]:
    d = Drainer(engine, settings, gateway_from(settings))
    yield d
    d.close()


def enqueue(engine: Engine, tenant: str, n: int, prefix: str) -> list[int]:
    with Session(engine) as db, db.begin():
        return [int(enqueue_usage(db, tenant_id=tenant, quantity=2,
                                  idempotency_key=f"{prefix}-{i}").id) for i in range(n)]






def past_the_deletion(fake: FakeStripe, customer: str) -> None:
    """Wait until an event sent now is after the customer's deletion for the outbox: Stripe's
    deletion time is whole seconds, and the seconds around it are left alone
    (``refused.AFTER_DELETION``)."""
    [created] = [e["created"] for e in fake.deleted_customer_events()
                 if e["data"]["object"]["id"] == customer]
    time.sleep(max(0.0, created + refused.AFTER_DELETION.total_seconds() + 0.05 - time.time()))


def statuses(engine: Engine, ids: list[int]) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(select(T.c.status, T.c.reject_found_by).where(T.c.id.in_(ids)))
        out: dict[str, int] = {}
        for status, how in rows:
            key = status if how is None else f"{status}:{how}"
            out[key] = out.get(key, 0) + 1
        return out


def test_a_customer_deleted_after_mapping_has_every_refused_event_rejected(
        engine: Engine, fake: FakeStripe, settings: Settings, drainer: Drainer,
        client_as: Any) -> None:
    for tenant in ("keep", "gone"):
        operations.set_tenant(engine, tenant, stripe_customer_id=f"cus_{tenant}", name=None,
                              now=utcnow())
    before = enqueue(engine, "gone", 5, "before")
    drain_all(drainer)
    with engine.begin() as conn:  # billed long before the customer was deleted
        conn.execute(update(T).where(T.c.id.in_(before))
                     .values(sent_at=utcnow() - timedelta(hours=3)))
    fake.delete_customer("cus_gone")
    past_the_deletion(fake, "cus_gone")
    gone = enqueue(engine, "gone", 50, "gone")
    keep = enqueue(engine, "keep", 10, "keep")
    drain_all(drainer)
    assert statuses(engine, gone + keep) == {"sent": 60}      # Stripe answered 200
    fake.flush_reports()
    [report] = fake.events()
    assert report["data"]["reason"]["error_count"] == 50
    assert len(report["data"]["reason"]["error_types"][0]["sample_errors"]) == 3
    summary = poll_reports(engine, settings)
    assert summary.rejected == 50
    assert statuses(engine, gone) == {"rejected:sample": 3, "rejected:customer": 47}
    assert statuses(engine, keep) == {"sent": 10}
    assert statuses(engine, before) == {"sent": 5}
    with engine.connect() as conn:
        found = conn.execute(select(S.c.outcome, S.c.identifier).where(
            S.c.stripe_event_id == report["id"])).all()
    assert sum(1 for o, i in found if o == "rejected" and i is None) == 47
    assert fake.customer_lookups == {"cus_keep": 1, "cus_gone": 1}
    # The Stripe page's columns add up: 50 counted, 50 found here, none left; the figure
    # leads to the 50 events.
    viewer = client_as("viewer")
    page = viewer.get("/stripe").get_data(as_text=True)
    row = page[page.index(report["id"]):].split("</tr>")[0]
    assert 'data-k="found"><a' in row and ">50</a>" in row
    assert 'data-k="unfound">0<' in row
    listed = viewer.get(f"/events?report={report['id']}&limit=200").get_data(as_text=True)
    assert listed.count('<td><a href="/events/') == 50, listed.count('<td><a href="/events/')
    assert "found from Stripe&#39;s report" in listed


def test_nothing_is_marked_by_asking_beyond_what_stripe_counted(
        engine: Engine, fake: FakeStripe, settings: Settings, drainer: Drainer,
        client_as: Any) -> None:
    """Asking finds more events sent to the deleted customer after its deletion in a report's
    window than the report counts (its window reaches into the next report's events): none
    is marked by asking. Those billed before the deletion are never counted in."""
    operations.set_tenant(engine, "gone", stripe_customer_id="cus_gone", name=None,
                          now=utcnow())
    billed = enqueue(engine, "gone", 6, "billed")
    drain_all(drainer)
    fake.delete_customer("cus_gone")
    past_the_deletion(fake, "cus_gone")
    first = enqueue(engine, "gone", 5, "refused")
    drain_all(drainer)
    fake.flush_reports()          # counts 5, samples 3
    then = enqueue(engine, "gone", 4, "then")
    drain_all(drainer)
    fake.flush_reports()          # counts 4, samples 3; both windows hold all 9
    assert poll_reports(engine, settings).rejected == 6
    assert statuses(engine, first) == {"rejected:sample": 3, "sent": 2}
    assert statuses(engine, then) == {"rejected:sample": 3, "sent": 1}
    assert statuses(engine, billed) == {"sent": 6}
    page = client_as("viewer").get("/stripe").get_data(as_text=True)
    assert 'data-k="unfound"><strong>2</strong>' in page   # "N refused, M found" stays
    assert 'data-k="unfound"><strong>1</strong>' in page
