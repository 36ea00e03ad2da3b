"""What a tenant id and a Stripe customer id may be: one rule each, asked by every door that
takes one (``enqueue_usage``, ``tenants set``, the mappings page, the file import, the sync
from Stripe, the events page's filter), so that nothing can be mapped that could never be
billed, and nothing enqueued that no mapping could name.

Each ``…_problem`` function says in plain words why a value is refused, or returns None.
"""

from __future__ import annotations

import re

from ..models import fits, limit_of
from .sql import TENANTS

#: Stripe's customer ids: ``cus_`` then letters and digits (underscores are let through).
CUSTOMER_ID_PATTERN = r"cus_[A-Za-z0-9_]+"
_CUSTOMER_ID = re.compile(CUSTOMER_ID_PATTERN + r"\Z")
#: Tenant ids, idempotency keys and meter names are at most this many characters.
TEXT_LIMIT = 100


def text_problem(value: object, *, ascii_only: bool = False) -> str | None:
    """Why ``value`` is not a usable id (a tenant id, a meter name; ``ascii_only``: an
    idempotency key, which goes to Stripe as an identifier), or None."""
    if not isinstance(value, str) or value == "":
        return "must be a non-empty string"
    if len(value) > TEXT_LIMIT:
        return f"must be at most {TEXT_LIMIT} characters (got {len(value)})"
    if ascii_only and not all(" " <= ch <= "~" for ch in value):
        return "must be printable ASCII"
    if not value.isprintable() or value.strip() != value:
        return "must be printable, without surrounding spaces"
    return None


def tenant_id_problem(tenant_id: str) -> str | None:
    """Why this tenant id can be neither enqueued nor mapped, or None."""
    if tenant_id == "":
        return "the tenant id is empty"
    problem = text_problem(tenant_id)
    return f"tenant id {tenant_id[:40]!r} {problem}" if problem else None


def customer_id_problem(customer_id: str) -> str | None:
    """Why this is not a Stripe customer id we can store (never cut: a cut id would bill
    another customer, or none), or None."""
    if not _CUSTOMER_ID.match(customer_id):
        return (f"Stripe customer id {customer_id[:40]!r} is not cus_ followed by letters and "
                "digits")
    if not fits(TENANTS.c.stripe_customer_id, customer_id):
        return (f"a Stripe customer id is at most {limit_of(TENANTS.c.stripe_customer_id)} "
                "characters")
    return None


__all__ = ["CUSTOMER_ID_PATTERN", "TEXT_LIMIT", "customer_id_problem", "tenant_id_problem",
           "text_problem"]
