"""The search box in a real browser, as a support agent uses it: a tenant by part of its name,
the tenants of a Stripe customer (and the link to it in Stripe), events by the start of their
idempotency key, and a miss that keeps the query. Links are found by their visible text;
every page is saved under ``test-artifacts/screenshots/``.

One server (``billing-outbox serve``, drainer off: nothing here is sent) and one browser for
the module, on PostgreSQL; the browser pieces come from ``test_browser_dashboard``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from conftest import _pg_database, worker_env
from sqlalchemy.orm import Session
from support.served import chromium, served
from test_browser_dashboard import PASSWORD, SHOTS, Visitor, _need_browser

from webapp.db import make_engine
from webapp.models import utcnow
from webapp.outbox import enqueue_usage
from webapp.outbox.operations import set_tenant
from webapp.users import create_user

AGENT = "support-agent@example.com"
BOX = "Search tenants, Stripe customers and requests, events"


@dataclass
class SearchStack:
    base: str
    events: dict[str, int]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SearchStack]:
    _need_browser()
    db_gen = _pg_database()
    db_url = next(db_gen)
    engine = make_engine(db_url)
    log_path = tmp_path_factory.mktemp("search") / "serve.log"
    try:
        now = utcnow()
        set_tenant(engine, "t-0042", stripe_customer_id="cus_globex",
                   name="Globex Corporation", now=now)
        set_tenant(engine, "t-0043", stripe_customer_id="cus_globex", name="Globex Europe",
                   now=now)
        set_tenant(engine, "acme", stripe_customer_id="cus_acme", name="Acme", now=now)
        create_user(engine, AGENT, PASSWORD, "viewer", now=now)
        events = {}
        with Session(engine) as db, db.begin():
            for key in ("invoice:2026-11:1", "invoice:2026-11:2", "invoice:2026-12:1"):
                events[key] = enqueue_usage(db, tenant_id="acme", quantity=3,
                                            idempotency_key=key,
                                            occurred_at=now - timedelta(hours=1)).id
        env = worker_env(db_url, DRAINER_ENABLED="false")
        with served(env, log_path) as base:
            yield SearchStack(base, events)
    finally:
        engine.dispose()
        db_gen.close()


@pytest.fixture(scope="module")
def agent(stack: SearchStack) -> Iterator[Visitor]:
    """A viewer signed in, in one headless Chromium for the module."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    with chromium() as browser:
        visitor = Visitor(browser, stack)  # type: ignore[arg-type]
        try:
            visitor.login(AGENT)
            yield visitor
        finally:
            visitor.close()


def search(agent: Visitor, query: str) -> Any:
    """Type into the header's box and press Enter, as a person would."""
    page = agent.page
    box = page.get_by_role("searchbox", name=BOX)
    box.fill(query)
    with page.expect_navigation():
        box.press("Enter")
    return page


def test_a_tenant_by_part_of_its_name(agent: Visitor) -> None:
    page = search(agent, "globex")
    assert page.url.endswith("/search?q=globex")
    assert page.get_by_role("heading", name="Tenants 2").is_visible()
    agent.shot("search-01-by-name")
    with page.expect_navigation():
        page.get_by_role("link", name="t-0043", exact=True).click()
    assert page.url.endswith("/tenants/t-0043")
    page = search(agent, "corporation")  # one hit: straight to it
    assert page.url.endswith("/tenants/t-0042")
    agent.assert_clean()


def test_the_tenants_of_a_stripe_customer_and_the_link_to_it(agent: Visitor) -> None:
    page = search(agent, "cus_acme")
    assert page.url.endswith("/tenants/acme")
    link = page.get_by_role("link", name="open in Stripe (opens Stripe in a new tab)")
    assert link.get_attribute("href") == "https://dashboard.stripe.com/test/customers/cus_acme"
    assert link.get_attribute("target") == "_blank"
    assert link.get_attribute("rel") == "noopener noreferrer"
    agent.shot("search-02-by-customer")
    agent.assert_clean()


def test_events_by_the_start_of_their_key(agent: Visitor, stack: SearchStack) -> None:
    page = search(agent, "invoice:2026-11")
    assert page.get_by_role("heading", name="Events 2").is_visible()
    agent.shot("search-03-by-key-prefix")
    wanted = stack.events["invoice:2026-11:2"]
    with page.expect_navigation():
        page.get_by_role("link", name=f"Event #{wanted}", exact=True).click()
    assert page.url.endswith(f"/events/{wanted}")
    agent.assert_clean()


def test_a_miss_keeps_the_query_and_says_what_to_try(agent: Visitor) -> None:
    page = search(agent, "initech <b>")
    assert page.get_by_role("heading", name="Nothing matches “initech <b>”").is_visible()
    assert page.get_by_role("searchbox", name="Search", exact=True).input_value() == \
        "initech <b>"
    assert page.get_by_text("the tenants billed to a Stripe customer").is_visible()
    agent.shot("search-04-miss")
    agent.assert_clean()



def test_results_fit_a_phone(agent: Visitor) -> None:
    page = agent.page
    page.set_viewport_size({"width": 390, "height": 844})
    try:
        search(agent, "invoice:")
        assert page.get_by_role("heading", name="Events 3").is_visible()
        agent.shot("search-05-phone")  # fails if the page is wider than the window
    finally:
        page.set_viewport_size({"width": 1280, "height": 900})
    agent.assert_clean()
