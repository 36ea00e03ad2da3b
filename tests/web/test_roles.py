"""The role matrix: every page and every action, for anonymous, viewer, operator and admin.

Viewers see every page but Users and act on nothing; operators also requeue, resolve, pause
and resume; admins also manage users and tenant mappings. A refused action answers 403 and
changes nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

from webapp.models import utcnow
from webapp.users import ROLE_RANK

from .conftest import csrf_of

#: (path, the least role that may see it)
PAGES = [
    ("/", "viewer"), ("/retries", "viewer"), ("/retries?split=code", "viewer"),
    ("/tenants", "viewer"), ("/tenants.csv", "viewer"), ("/tenants/acme", "viewer"),
    ("/mappings", "viewer"),
    ("/dead-letters", "viewer"), ("/dead-letters?status=resolved", "viewer"),
    ("/dead-letters/groups", "viewer"), ("/events/{dead}", "viewer"), ("/audit", "viewer"),
    ("/audit.csv", "viewer"), ("/dead-letters/requeue-all", "operator"), ("/users", "admin"),
    ("/rejected", "viewer"), ("/rejected?code=meter_event_customer_not_found", "viewer"),
    ("/rejected/requeue-all", "operator"), ("/reconciliation", "viewer"), ("/stripe", "viewer"),
    ("/events/{sent}", "viewer"), ("/events/{sent}/cancel", "operator"),
    ("/events", "viewer"), ("/events?status=dead&attempts=1", "viewer"),
    ("/events.csv", "viewer"), ("/events.csv?status=dead", "viewer"),
    ("/search", "viewer"), ("/search?q=key-", "viewer"),
    ("/reconciliation/mismatches/{mismatch}", "viewer"),
    ("/reconciliation/mismatches/{mismatch}/resend", "operator"),
]


def seeded(seed: Any) -> dict[str, int]:
    """A dead event, a sent one, and a day reconciliation found Stripe holding none of."""
    return {"dead": seed.event(status="dead"), "sent": seed.event(status="sent"),
            "mismatch": seed.lost_day(utcnow())}


def actions(ids: dict[str, int], users: dict[str, str]) -> list[tuple[str, dict[str, Any], str]]:
    """(path, form, the least role that may do it)."""
    return [
        ("/dead-letters/requeue", {"ids": [ids["dead"]]}, "operator"),
        ("/dead-letters/resolve", {"ids": [ids["dead"]], "reason": "written_off",
                                   "note": "test"}, "operator"),
        ("/dead-letters/requeue-all", {"snapshot": "x"}, "operator"),
        ("/sending/pause", {"reason": "test"}, "operator"),
        ("/sending/resume", {}, "operator"),
        ("/tenants/mapping", {"tenant_id": "acme", "stripe_customer_id": "cus_123"}, "admin"),
        ("/users", {"email": "x@example.com", "role": "viewer",
                    "password": "long-enough-password"}, "admin"),
        ("/users/1/deactivate", {}, "admin"),
        ("/users/1/activate", {}, "admin"),
        ("/rejected/requeue-all", {"snapshot": "x"}, "operator"),
        ("/reconciliation/run", {}, "operator"),
        (f"/events/{ids['sent']}/cancel", {"reason": "other", "note": "x", "confirm": "yes"},
         "operator"),
        (f"/reconciliation/mismatches/{ids['mismatch']}/resend", {"snapshot": "x"}, "operator"),
    ]


def allowed(role: str, needed: str) -> bool:
    return ROLE_RANK[role] >= ROLE_RANK[needed]


@pytest.mark.parametrize("role", [None, "viewer", "operator", "admin"])
def test_every_page(role: str | None, client_as, seed) -> None:
    ids = seeded(seed)
    client = client_as(role)
    for path, needed in PAGES:
        path = path.format(**ids)
        resp = client.get(path)
        if role is None:
            assert resp.status_code == 302 and "/login" in resp.headers["Location"], path
        elif allowed(role, needed):
            assert resp.status_code == 200, (path, resp.status_code)
        else:
            assert resp.status_code == 403, (path, resp.status_code)
            assert "Nothing was changed" in resp.get_data(as_text=True)


@pytest.mark.parametrize("role", ["viewer", "operator", "admin"])
def test_every_action_refused_below_its_role_changes_nothing(role: str, client_as, seed,
                                                             users) -> None:
    ids = seeded(seed)
    client = client_as(role)
    token = csrf_of(client)
    refused = [(p, f) for p, f, needed in actions(ids, users) if not allowed(role, needed)]
    if role == "admin":
        assert refused == []
    for path, form in refused:
        before = seed.snapshot()
        resp = client.post(path, data={**form, "csrf_token": token})
        assert resp.status_code == 403, (path, resp.status_code)
        assert seed.snapshot() == before, path


def test_anonymous_actions_change_nothing(client_as, seed, users) -> None:
    ids = seeded(seed)
    client = client_as(None)
    token = csrf_of(client, "/login")
    for path, form, _needed in actions(ids, users):
        before = seed.snapshot()
        resp = client.post(path, data={**form, "csrf_token": token})
        assert resp.status_code == 302 and "/login" in resp.headers["Location"], path
        assert seed.snapshot() == before, path


def test_navigation_follows_the_role(client_as) -> None:
    assert ">Users</a>" not in client_as("operator").get("/").get_data(as_text=True)
    assert ">Users</a>" in client_as("admin").get("/").get_data(as_text=True)
    viewer_page = client_as("viewer").get("/dead-letters").get_data(as_text=True)
    assert "Pause sending" not in client_as("viewer").get("/").get_data(as_text=True)
    assert "Requeue selected" not in viewer_page
    assert "Pause sending" in client_as("operator").get("/").get_data(as_text=True)


#: POSTs any signed-in person makes about themselves (changing their own password).
SELF_SERVICE = {"account.password"}
#: POSTs that change nothing that is billed: a viewer asks the dashboard to prepare figures
#: (summing a long period's usage into a report that anyone then reads), or to compare a
#: period with Stripe (reading Stripe's summaries and writing only the comparison).
PREPARED_READS = {"tenants.prepare_report", "tenants.check_with_stripe"}


def test_every_endpoint_is_public_by_intent_or_needs_a_role(app) -> None:
    """A new view without ``require_role`` fails here instead of shipping unauthenticated."""
    public = {"static", "health.healthz", "health.readyz", "health.health", "metrics.metrics",
              "auth.login", "auth.logout", "webhook.receive",
              # A bearer token of its own, never a session (tests/web/test_ingest_api.py).
              "api.ingest_usage", "api.openapi"}
    for rule in app.url_map.iter_rules():
        view = app.view_functions[rule.endpoint]
        if rule.endpoint in public:
            continue
        assert getattr(view, "required_role", None) in ("viewer", "operator", "admin"), \
            rule.endpoint
        if rule.methods and "POST" in rule.methods and rule.endpoint not in (
                SELF_SERVICE | PREPARED_READS):
            assert view.required_role in ("operator", "admin"), rule.endpoint
