"""Stripe's customers, within the process's ceiling on calls: every customer for the tenant
sync (:func:`stripe_customers`), and whether Stripe has a given customer, asked at most once per
customer per refresh (:class:`CustomerDirectory`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Protocol

from sqlalchemy import Engine

from ..db import reading
from ..models import utcnow
from ..outbox import customers
from ..outbox.customers import CustomerCheck
from ..outbox.tenant_sync import StripeCustomer
from ..stripe_gateway import StripeCallFailed
from .throttle import process_limiter

log = logging.getLogger(__name__)


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


class CustomerLookup(Protocol):
    """What can ask Stripe about one customer (the real gateway)."""

    def retrieve_customer(self, customer_id: str) -> CustomerCheck: ...


class CustomerDirectory:
    """Whether Stripe has each customer, asked at most once per ``refresh_seconds`` per
    customer across every process (the answers are kept in ``stripe_customer_checks``), each
    question drawing on the process's rate limiter.

    :meth:`checks` answers for many customers at once; a customer Stripe could not be asked
    about (a timeout, a 5xx, a refused key) is left out of the answer, never guessed, and the
    failure is logged once per call.
    """

    def __init__(self, engine: Engine, source: CustomerLookup, *, refresh_seconds: float,
                 max_requests_per_second: float,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.engine = engine
        self.source = source
        self.refresh = timedelta(seconds=refresh_seconds)
        self.limiter = process_limiter(max_requests_per_second)
        self.clock = clock

    def checks(self, customer_ids: Iterable[str]) -> dict[str, CustomerCheck]:
        """Stripe's answer about each customer that could be had, by id: kept ones younger
        than ``refresh_seconds``, the others asked now (and kept)."""
        wanted = {c for c in customer_ids if c}
        now = self.clock()
        with reading(self.engine) as conn:
            known = customers.checks_since(conn, wanted, now - self.refresh)
        asked: list[CustomerCheck] = []
        failed: list[str] = []
        for customer_id in sorted(wanted - set(known)):
            self.limiter.acquire()
            try:
                asked.append(self.source.retrieve_customer(customer_id))
            except StripeCallFailed as exc:
                failed.append(f"{customer_id}: {exc}")
        customers.record_checks(self.engine, asked, now=now)
        if failed:
            log.warning("Stripe could not be asked about %d customer(s): %s", len(failed),
                        "; ".join(failed[:5]))
        known.update((c.customer_id, c) for c in asked)
        return known

    def check(self, customer_id: str) -> CustomerCheck | None:
        """Stripe's answer about one customer, or None when Stripe could not be asked."""
        return self.checks([customer_id]).get(customer_id)
