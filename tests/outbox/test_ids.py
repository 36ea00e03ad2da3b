"""One rule for a tenant id and one for a Stripe customer id, whichever door a value comes
through: what enqueue refuses, no mapping accepts (and the reverse), and the import, the
mapping and the events page's filter agree on what a customer id is."""

from __future__ import annotations

import re

import pytest

from webapp.models import utcnow
from webapp.outbox.enqueue import InvalidUsage, validate_usage
from webapp.outbox.ids import CUSTOMER_ID_PATTERN
from webapp.outbox.operations import mapping_problem
from webapp.outbox.tenant_import import refused
from webapp.web.events import CUSTOMER

TENANTS = ["acme", "Ünïcode GmbH", "a" * 100, " acme", "acme ", "", "a" * 101, "tab\there",
           "nul\x00"]
CUSTOMERS = ["cus_ABC123", "cus_with_underscore", "cus_", "cus_bad id", "cus_x;drop",
             "CUS_abc", "acct_123", "cus_" + "a" * 252]


def enqueue_refuses(tenant: str) -> bool:
    try:
        validate_usage(tenant_id=tenant, quantity=1, idempotency_key="k", meter="m",
                       occurred_at=utcnow(), now=utcnow())
    except InvalidUsage as exc:
        assert exc.field == "tenant_id"
        return True
    return False


@pytest.mark.parametrize("tenant", TENANTS)
def test_a_tenant_id_enqueue_refuses_cannot_be_mapped(tenant: str) -> None:
    refused_by_enqueue = enqueue_refuses(tenant)
    assert refused_by_enqueue == (mapping_problem(tenant, "cus_ok") is not None)
    assert refused_by_enqueue == (refused(tenant, "cus_ok") is not None)
    assert refused_by_enqueue == (tenant not in ("acme", "Ünïcode GmbH", "a" * 100))


@pytest.mark.parametrize("customer", CUSTOMERS)
def test_every_door_agrees_on_a_customer_id(customer: str) -> None:
    good = customer in ("cus_ABC123", "cus_with_underscore")
    assert (mapping_problem("acme", customer) is None) == good
    assert (refused("acme", customer) is None) == good
    assert bool(re.fullmatch(CUSTOMER_ID_PATTERN, customer)) == (good or len(customer) > 255)
    assert CUSTOMER.pattern is not None and CUSTOMER.pattern.pattern == CUSTOMER_ID_PATTERN
