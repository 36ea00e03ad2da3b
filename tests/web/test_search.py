"""The search box: every kind of thing it finds, one hit straight to it, several grouped by
kind, a miss that keeps the query and says what to try, bad input, roles — and the links to
Stripe's dashboard (``/test/`` unless the key is a live one) wherever an id of Stripe's is
shown."""

from __future__ import annotations

import re
from html import unescape
from typing import Any

import pytest
from conftest import make_settings
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import Engine

from webapp import create_app
from webapp.read.search import GROUP_LIMIT, search

from .conftest import login


def hrefs(html: str) -> list[str]:
    return [unescape(h) for h in re.findall(r'href="([^"]+)"', html)]


def section(html: str, kind: str) -> str:
    found = re.search(rf'<section class="panel" id="search-{kind}">(.*?)</section>', html,
                      re.DOTALL)
    assert found, f"no {kind} group in the page"
    return found.group(1)


@pytest.fixture
def viewer(client_as) -> FlaskClient:
    return client_as("viewer")


def test_a_tenant_by_exact_id_goes_straight_to_it(viewer, seed) -> None:
    seed.tenant("globex", "cus_globex", "Globex Corporation")
    resp = viewer.get("/search?q=globex")
    assert resp.status_code == 302
    assert resp.headers["Location"] == "/tenants/globex"


def test_a_tenant_by_part_of_its_name_ignoring_capitals(viewer, seed) -> None:
    seed.tenant("t-0001", "cus_1", "Globex Corporation")
    assert viewer.get("/search?q=CORPOR").headers["Location"] == "/tenants/t-0001"


def test_a_tenant_by_the_start_of_its_id(viewer, seed) -> None:
    seed.tenant("umbrella-eu", None, None)
    seed.tenant("umbrellas", None, None)  # not a prefix match of "umbrella-"
    assert viewer.get("/search?q=umbrella-").headers["Location"] == "/tenants/umbrella-eu"


def test_tenants_billed_to_a_customer(viewer, seed) -> None:
    seed.tenant("acme", "cus_acme", "Acme")
    seed.tenant("acme-eu", "cus_acme", "Acme Europe")
    seed.tenant("other", "cus_other", "Other")
    seed.tenant("fan", None, "The cus_other fan club")  # a Stripe id is not looked for in names
    assert viewer.get("/search?q=cus_other").headers["Location"] == "/tenants/other"
    html = viewer.get("/search?q=cus_acme").get_data(as_text=True)
    group = section(html, "tenants")
    assert "/tenants/acme" in hrefs(group) and "/tenants/acme-eu" in hrefs(group)
    assert "/tenants/other" not in hrefs(group)
    assert "billed to this customer" in group


def test_an_event_by_id_key_prefix_and_stripe_identifier(viewer, seed) -> None:
    by_id = seed.event(idempotency_key="invoice:1")
    keyed = seed.event(idempotency_key="usage_log:981")
    requeued = seed.event(idempotency_key="usage_log:77", stripe_identifier="usage_log:77~r1",
                          identifier_generation=1)
    assert viewer.get(f"/search?q={by_id}").headers["Location"] == f"/events/{by_id}"
    assert viewer.get("/search?q=usage_log:981").headers["Location"] == f"/events/{keyed}"
    assert viewer.get("/search?q=usage_log:98").headers["Location"] == f"/events/{keyed}"
    assert (viewer.get("/search?q=usage_log:77~r1").headers["Location"]
            == f"/events/{requeued}")
    # The idempotency key of a call retried after a 5xx: <identifier>:rN:<digest>.
    assert (viewer.get("/search?q=usage_log:77~r1:r2:0123456789ab").headers["Location"]
            == f"/events/{requeued}")
    assert (viewer.get("/search?q=invoice:1:r1:0123456789ab").headers["Location"]
            == f"/events/{by_id}")


def test_a_stripe_request_id_leads_to_its_call(viewer, seed) -> None:
    ev = seed.event(status="sent")
    seed.attempt(ev, stripe_request_id="req_first")
    other = seed.event(status="dead")
    seed.attempt(other, stripe_request_id="req_second", outcome="permanent", http_status=400)
    resp = viewer.get("/search?q=req_second")
    assert resp.status_code == 302
    location = resp.headers["Location"]
    assert re.fullmatch(rf"/events/{other}#attempt-\d+", location)
    page = viewer.get(f"/events/{other}").get_data(as_text=True)
    assert f'id="{location.split("#")[1]}"' in page


def test_several_hits_are_grouped_by_kind_with_counts(viewer, seed) -> None:
    seed.tenant("order", None, "Order Desk")
    seed.tenant("orders-2", None, None)
    evs = [seed.event(idempotency_key=f"order:{i}") for i in range(3)]
    resp = viewer.get("/search?q=order")
    assert resp.status_code == 200
    html = resp.get_data(as_text=True)
    tenants, events = section(html, "tenants"), section(html, "events")
    assert re.search(r"<h2>Tenants <span class=\"muted\">2</span>", tenants)
    assert re.search(r"<h2>Events <span class=\"muted\">3</span>", events)
    assert {f"/events/{e}" for e in evs} <= set(hrefs(events))
    assert {"/tenants/order", "/tenants/orders-2"} <= set(hrefs(tenants))
    assert 'id="search-requests"' not in html


def test_a_big_group_is_capped_and_says_so(viewer, seed) -> None:
    for i in range(GROUP_LIMIT + 3):
        seed.event(idempotency_key=f"batch:{i:03}")
    html = viewer.get("/search?q=batch:").get_data(as_text=True)
    events = section(html, "events")
    assert len(re.findall(r'href="/events/\d+"', events)) == GROUP_LIMIT
    assert f"showing the first {GROUP_LIMIT}" in events


def test_a_miss_repeats_the_query_escaped_and_says_what_to_try(viewer, seed) -> None:
    seed.tenant("acme", "cus_acme", "Acme")
    resp = viewer.get("/search?q=%3Cb%3Enope%22")
    assert resp.status_code == 200
    html = resp.get_data(as_text=True)
    assert "<b>nope" not in html
    assert 'value="&lt;b&gt;nope&#34;"' in html
    assert "Nothing matches “&lt;b&gt;nope&#34;”" in html
    for example in ("cus_", "req_", "idempotency key"):
        assert example in section(html, "miss")


def test_wildcards_in_the_query_are_literal(viewer, seed) -> None:
    seed.tenant("a_b", None, "Under_score")
    seed.tenant("axb", None, "Underxscore")
    seed.event(idempotency_key="k%1")
    seed.event(idempotency_key="kx1")
    assert viewer.get("/search?q=a_").headers["Location"] == "/tenants/a_b"
    assert viewer.get("/search?q=r_s").headers["Location"] == "/tenants/a_b"
    html = viewer.get("/search?q=%25").get_data(as_text=True)
    assert "Nothing matches" in html
    assert viewer.get("/search?q=k%25").status_code == 302


#: Other digits for the ASCII ones: Python's isdigit() is true for all of them.
SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")
ARABIC_INDIC = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")
FULLWIDTH = str.maketrans("0123456789", "０１２３４５６７８９")


@pytest.mark.parametrize("digits", [SUPERSCRIPT, ARABIC_INDIC, FULLWIDTH],
                         ids=["superscript", "arabic-indic", "fullwidth"])
def test_digits_other_than_ascii_are_text_not_an_event_id(viewer, seed, engine: Engine,
                                                          digits: dict[int, str]) -> None:
    """``int()`` refuses "²" (a 500 once) and reads "٣" as 3: such a query is text, looked
    for in names and keys like any other, and never an event's id."""
    ev = seed.event(idempotency_key="plain:1")
    q = str(ev).translate(digits)
    assert q != str(ev)
    assert search(engine, q).events.rows == []
    resp = viewer.get(f"/search?q={q}")
    assert resp.status_code == 200
    assert f"Nothing matches “{q}”" in resp.get_data(as_text=True)
    seed.tenant("suite", None, f"Suite {q}")
    keyed = seed.event(idempotency_key=f"{q}:room")
    html = viewer.get(f"/search?q={q}").get_data(as_text=True)
    assert "/tenants/suite" in hrefs(section(html, "tenants"))
    assert hrefs(section(html, "events")) == [f"/events/{keyed}"]
    assert f"/events/{ev}" not in hrefs(html)


def test_an_empty_query_shows_the_box(viewer) -> None:
    resp = viewer.get("/search")
    assert resp.status_code == 200
    html = resp.get_data(as_text=True)
    assert 'id="search-q"' in html and "Nothing matches" not in html


@pytest.mark.parametrize("raw, field_problem", [
    ("%00", "NUL"), ("a%0Ab", "control character"), ("%FF", "UTF-8"), ("x" * 256, "longer"),
])
def test_bad_input_is_a_400_naming_the_field(viewer, raw: str, field_problem: str) -> None:
    resp = viewer.get(f"/search?q={raw}")
    assert resp.status_code == 400
    text = resp.get_data(as_text=True)
    assert "“q”" in text and field_problem in text


def test_anonymous_is_sent_to_log_in(client_as) -> None:
    resp = client_as(None).get("/search?q=acme")
    assert resp.status_code in (302, 303)
    assert "/login" in resp.headers["Location"]


@pytest.mark.parametrize("role", ["viewer", "operator", "admin"])
def test_every_role_may_search(client_as, seed, role: str) -> None:
    seed.tenant("acme", "cus_acme", "Acme")
    assert client_as(role).get("/search?q=cus_acme").headers["Location"] == "/tenants/acme"


def test_the_header_box_searches_on_every_page(viewer) -> None:
    html = viewer.get("/").get_data(as_text=True)
    form = re.search(r'<form class="jump" action="([^"]+)"', html)
    assert form and form.group(1) == "/search"
    assert 'placeholder="Search: tenant, cus_…, req_…, event id, key"' in html


def test_search_reads_are_bounded(engine: Engine, seed: Any) -> None:
    for i in range(GROUP_LIMIT * 2):
        seed.tenant(f"bulk-{i:03}", None, f"Bulk {i}")
    found = search(engine, "bulk-")
    assert len(found.tenants.rows) == GROUP_LIMIT and found.tenants.more
    assert found.only() is None
    with pytest.raises(ValueError):
        search(engine, " ")


# -- links to Stripe's dashboard -------------------------------------------------------------------

STRIPE_LINK = re.compile(r'<a class="stripe-link" href="([^"]+)" target="_blank" '
                         r'rel="noopener noreferrer">[^<]*<span class="visually-hidden"> '
                         r'\(opens Stripe in a new tab\)</span></a>')


def app_with_key(db_url: str, engine: Engine, key: str) -> Flask:
    return create_app({"TESTING": True}, settings=make_settings(db_url, stripe_api_key=key),
                      engine=engine, start_drainer=False)


@pytest.mark.parametrize("key, base", [
    ("sk_test_billingoutbox_0123456789", "https://dashboard.stripe.com/test/"),
    ("sk_live_billingoutbox_0123456789", "https://dashboard.stripe.com/"),
    ("rk_live_billingoutbox_0123456789", "https://dashboard.stripe.com/"),
])
def test_stripe_links_follow_the_key_mode(db_url: str, engine: Engine, users, seed,
                                          key: str, base: str) -> None:
    seed.tenant("acme", "cus_acme", "Acme")
    ev = seed.event(status="sent", stripe_customer_id="cus_acme", last_request_id="req_last")
    seed.attempt(ev, stripe_request_id="req_call")
    client = app_with_key(db_url, engine, key).test_client()
    assert login(client, users["viewer"]).status_code == 303
    pages = {
        "/tenants/acme": {"customers/cus_acme"},
        "/mappings": {"customers/cus_acme"},
        "/tenants": {"customers/cus_acme"},
        f"/events/{ev}": {"customers/cus_acme", "logs/req_last", "logs/req_call"},
        "/search?q=acme": {"customers/cus_acme"},
        "/search?q=req_nothing": {"logs/req_nothing"},
        "/search?q=cus_nobody": {"customers/cus_nobody"},
    }
    seed.tenant("acme-2", None, None)  # so that "acme" has two hits: a results page
    for path, wanted in pages.items():
        html = client.get(path).get_data(as_text=True)
        links = {unescape(h) for h in STRIPE_LINK.findall(html)}
        assert {base + w for w in wanted} <= links, (path, links)
        assert all(link.startswith(base) for link in links), (path, links)
        assert key not in html


def test_a_request_id_in_the_results_links_to_stripe(viewer, seed) -> None:
    for n in range(2):
        ev = seed.event(status="retrying")
        seed.attempt(ev, stripe_request_id="req_shared", outcome="server_error",
                     http_status=500)
    html = viewer.get("/search?q=req_shared").get_data(as_text=True)
    group = section(html, "requests")
    assert len(re.findall(r'href="/events/\d+#attempt-\d+"', group)) == 2
    assert ("https://dashboard.stripe.com/test/logs/req_shared"
            in {unescape(h) for h in STRIPE_LINK.findall(group)})
