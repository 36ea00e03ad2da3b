"""Stripe's customers, within the process's ceiling on calls: every customer for the tenant
sync (:func:`stripe_customers`), whether Stripe has a given customer, asked at most once per
customer per refresh (:class:`CustomerDirectory`), when Stripe deleted a deleted one (its
``customer.deleted`` event), and the one rule every way of mapping a tenant follows
(:func:`check_customers`): a tenant is mapped only to a customer Stripe has."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta

from sqlalchemy import Engine

from ..config import Settings
from ..db import reading
from ..models import utcnow
from ..outbox import customers
from ..outbox.customers import ACTIVE, DELETED, CustomerCheck, CustomerVerdicts
from ..outbox.tenant_sync import StripeCustomer
from ..stripe_gateway import StripeCallFailed, StripeGateway
from .throttle import process_limiter

log = logging.getLogger(__name__)


def stripe_customers(engine: Engine, source: StripeGateway, metadata_key: str, *,
                     max_requests_per_second: float, now: datetime) -> list[StripeCustomer]:
    """Every customer (every page), each page drawing on the process's rate limiter, as
    sending and reconciling do; raises ``StripeCallFailed`` when Stripe cannot be asked.

    Those that name a tenant under ``metadata_key`` are kept as ``active`` in
    ``stripe_customer_checks``: Stripe's own listing (which leaves deleted customers out)
    says it has them, so a mapping to one of them within the refresh asks nothing again."""
    limiter = process_limiter(max_requests_per_second)
    listed = source.list_customers(metadata_key, pace=limiter.acquire)
    customers.record_checks(engine, [CustomerCheck(c.id, ACTIVE, name=c.name) for c in listed
                                     if c.tenant_id is not None], now=now)
    return listed


class CustomerDirectory:
    """Whether Stripe has each customer, asked at most once per ``refresh_seconds`` per
    customer across every process (the answers are kept in ``stripe_customer_checks``), each
    question drawing on the process's rate limiter.

    :meth:`checks` answers for many customers at once; a customer Stripe could not be asked
    about (a timeout, a 5xx, a refused key) is left out of the answer, never guessed, and the
    failure is logged once per call. :meth:`with_deletion_times` adds when Stripe deleted
    the deleted ones, where Stripe lists it (remembered by the process: it never changes).
    """

    #: How far back Stripe lists events (``GET /v1/events``).
    EVENTS_KEPT = timedelta(days=30)
    #: Deletion times remembered at most (then forgotten, and listed again when needed).
    MAX_REMEMBERED = 10_000

    def __init__(self, engine: Engine, source: StripeGateway, *, refresh_seconds: float,
                 max_requests_per_second: float,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.engine = engine
        self.source = source
        self.refresh = timedelta(seconds=refresh_seconds)
        self.limiter = process_limiter(max_requests_per_second)
        self.clock = clock
        self._deleted_at: dict[str, datetime] = {}

    def checks(self, customer_ids: Iterable[str], *, recheck_refused: bool = False,
               fresh_after: datetime | None = None) -> dict[str, CustomerCheck]:
        """Stripe's answer about each customer that could be had, by id: kept ones younger
        than ``refresh_seconds``, the others asked now (and kept). ``recheck_refused``: a
        kept answer that the customer is missing or deleted is asked again (a person mapping
        a tenant may just have created the customer in Stripe). ``fresh_after``: a kept
        answer given before then is stale and asked again (an error report counting refusals
        it did not sample makes what was known of its customers before Stripe validated its
        events stale: a customer kept as active may have been deleted since)."""
        wanted = {c for c in customer_ids if c}
        now = self.clock()
        since = now - self.refresh
        if fresh_after is not None:
            since = max(since, fresh_after)
        with reading(self.engine) as conn:
            known = customers.checks_since(conn, wanted, since)
        if recheck_refused:
            known = {c: check for c, check in known.items() if check.exists}
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

    def with_deletion_times(self, answers: Mapping[str, CustomerCheck], *,
                            among: Iterable[str] | None = None) -> dict[str, CustomerCheck]:
        """``answers``, each ``deleted`` one (of ``among``, when given) with when Stripe
        deleted it (:attr:`CustomerCheck.deleted_at`): the ``created`` of its
        ``customer.deleted`` event, listed once for all of them (``GET /v1/events``, the
        last 30 days, within the process's rate limit). Left without one when Stripe lists
        none (deleted longer ago than it keeps events) or could not be asked (logged)."""
        chosen = None if among is None else set(among)
        deleted = sorted(c for c, a in answers.items() if a.state == DELETED
                         and a.deleted_at is None and (chosen is None or c in chosen))
        unknown = [c for c in deleted if c not in self._deleted_at]
        if unknown:
            try:
                found = self.source.list_customer_deletions(
                    created_gte=self.clock() - self.EVENTS_KEPT, customer_ids=unknown,
                    pace=self.limiter.acquire)
            except StripeCallFailed as exc:
                log.warning("Stripe could not be asked when %d customer(s) were deleted "
                            "(%s): %s", len(unknown), ", ".join(unknown[:5]), exc)
                found = {}
            if len(self._deleted_at) + len(found) > self.MAX_REMEMBERED:
                self._deleted_at.clear()
            self._deleted_at.update(found)
        out = dict(answers)
        for c in deleted:
            at = self._deleted_at.get(c)
            if at is not None:
                out[c] = replace(out[c], deleted_at=at)
        return out

    def check(self, customer_id: str) -> CustomerCheck | None:
        """Stripe's answer about one customer, or None when Stripe could not be asked."""
        return self.checks([customer_id]).get(customer_id)


def customer_directory(engine: Engine, gateway: StripeGateway, settings: Settings, *,
                       clock: Callable[[], datetime] = utcnow) -> CustomerDirectory:
    """Whether Stripe has a customer, asked at most once per customer per
    ``STRIPE_METERS_REFRESH_SECONDS``, within the process's rate limit."""
    return CustomerDirectory(engine, gateway, refresh_seconds=settings.meters_refresh_seconds,
                             max_requests_per_second=settings.stripe_max_requests_per_second,
                             clock=clock)


def check_customers(engine: Engine, gateway: StripeGateway | None, settings: Settings,
                    customer_ids: Iterable[str], *,
                    clock: Callable[[], datetime] = utcnow) -> CustomerVerdicts:
    """What Stripe says of the customers a mapping is about to use, asked before anything is
    written (every way of mapping a tenant calls this, and refuses what the verdicts refuse).

    With a gateway (a key is set), each distinct customer is asked about once, or answered
    from what was kept within ``STRIPE_METERS_REFRESH_SECONDS``
    (:func:`customer_directory`); a customer Stripe could not be asked about is refused too,
    never mapped unchecked. Without one (``gateway`` None), nothing is asked: every customer
    maps, and the verdicts say it was not checked."""
    if gateway is None:
        return CustomerVerdicts.unchecked()
    directory = customer_directory(engine, gateway, settings, clock=clock)
    # A customer Stripe said it lacks is asked again: it may have been created since.
    return CustomerVerdicts(checked=True,
                            answers=directory.checks(customer_ids, recheck_refused=True))
