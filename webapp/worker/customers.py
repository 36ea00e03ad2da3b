"""Reading Stripe's customers for the tenant sync, within the process's ceiling on calls."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..outbox.tenant_sync import StripeCustomer
from .throttle import process_limiter


class CustomerSource(Protocol):
    """What can list Stripe's customers (the real gateway)."""

    def list_customers(self, metadata_key: str, *, page_size: int = ...,
                       pace: Callable[[], object] | None = ...) -> list[StripeCustomer]: ...


def stripe_customers(source: CustomerSource, metadata_key: str, *,
                     max_requests_per_second: float) -> list[StripeCustomer]:
    """Every customer (every page), each page drawing on the process's rate limiter, as
    sending and reconciling do; raises ``StripeCallFailed`` when Stripe cannot be asked."""
    limiter = process_limiter(max_requests_per_second)
    return source.list_customers(metadata_key, pace=limiter.acquire)
