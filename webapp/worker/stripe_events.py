"""Reading Stripe's error reports back: polled (``billing-outbox stripe-events poll``, and the
worker and the in-app drainer every ``STRIPE_EVENTS_POLL_SECONDS``) or pushed to
``POST /stripe/webhook``. Either way each event is read in full, stored once by its id and
applied (``webapp.outbox.rejections``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Engine

from ..config import Settings
from ..db import reading
from ..models import utcnow
from ..outbox import rejections, stripe_runs
from ..outbox.customers import CustomerCheck
from ..outbox.error_reports import REPORT_TYPES, StripeReport
from ..stripe_gateway import StripeGateway
from ..stripe_gateway.data import ThinEvent
from .customers import CustomerDirectory, customer_directory
from .invoices import INVOICE_EVENT_TYPES
from .throttle import process_limiter

log = logging.getLogger(__name__)

#: Stripe keeps events for 30 days: a first poll reads that far back.
FIRST_POLL_BACK = timedelta(days=30)


@dataclass
class PollSummary:
    """What a poll did; printed as JSON by ``stripe-events poll``."""

    events: int = 0
    rejected: int = 0
    unmatched: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"events": self.events, "rejected": self.rejected, "unmatched": self.unmatched}


def receive_report(engine: Engine, report: StripeReport, *, source: str, now: datetime,
                   on_meter_codes: Callable[[], object] | None = None,
                   customers: CustomerDirectory | None = None) -> rejections.Applied:
    """Take in one pushed report: Stripe is first asked about the customers the report may be
    about (``customers``, see :func:`ask_customers`), then the report is stored and applied
    (:func:`webapp.outbox.rejections.store_report`) and logged; a report that says a meter is
    missing makes the meters be read again (``on_meter_codes``). A poll stores its reports in
    chunks instead and logs a summary."""
    applied = rejections.store_report(engine, report, source=source, now=now,
                                      customers=ask_customers(engine, [report], customers))
    if applied.stored:
        if applied.rejected:
            log.warning("Stripe reported %d event(s) invalid after accepting them (%s): "
                        "rejected", applied.rejected, report.id)
        if applied.unmatched:
            log.warning("Stripe's report %s names %d event(s) that are not ours", report.id,
                        applied.unmatched)
    if applied.stored and report.meter_codes and on_meter_codes is not None:
        _read_meters(on_meter_codes, report.id)
    return applied


def ask_customers(engine: Engine, reports: list[StripeReport],
                  directory: CustomerDirectory | None) -> dict[str, CustomerCheck]:
    """Stripe's answers about the customers these reports may be about (a sample saying a
    customer was not found, naming a stream request of several customers' events; a report
    counting such refusals it did not sample); none without a directory. For the latter, an
    answer kept from before Stripe began validating the report's events is asked again, and
    a deleted customer comes with when Stripe deleted it, where that can be had. Asked before
    the reports' transaction: no call is made with one open."""
    if directory is None:
        return {}
    with reading(engine) as conn:
        wanted = rejections.customers_to_ask(conn, reports)
    if not wanted:
        return {}
    by_time: dict[datetime | None, set[str]] = {}
    for customer, fresh in wanted.items():
        by_time.setdefault(fresh, set()).add(customer)
    answers: dict[str, CustomerCheck] = {}
    for fresh, group in by_time.items():
        answers.update(directory.checks(group, fresh_after=fresh))
    return directory.with_deletion_times(
        answers, among=[c for c, fresh in wanted.items() if fresh is not None])


def _read_meters(on_meter_codes: Callable[[], object], report_id: str) -> None:
    try:
        on_meter_codes()
    except Exception:
        log.exception("reading Stripe's meters after report %s failed", report_id)


class EventPoller:
    """Reads the error reports created since the last one stored. A maintenance service.

    A poll lists every page first, then reads and stores the new events oldest first
    (``CHUNK`` to a transaction), so the mark the next poll starts from (the newest stored)
    never passes an event not yet stored, whatever order Stripe lists them in; and it starts
    ``OVERLAP`` before that mark, so an event Stripe lists late is still found (those already
    stored are skipped by id). Events are read ``parallel`` at a time (Stripe's latency, not
    its limit, bounds one at a time), at most ``max_requests_per_second`` when given."""

    name = "stripe-events"

    #: How far before the newest stored event a poll starts listing again.
    OVERLAP = timedelta(minutes=10)
    #: Events read in flight at most; they are stored in order as they come back.
    PARALLEL = 8
    #: Events stored and applied per transaction.
    CHUNK = 50

    def __init__(self, engine: Engine, source: StripeGateway, *,
                 clock: Callable[[], datetime] = utcnow,
                 on_meter_codes: Callable[[], object] | None = None,
                 max_requests_per_second: float | None = None,
                 parallel: int = PARALLEL,
                 customers: CustomerDirectory | None = None,
                 on_invoice_events: Callable[[list[ThinEvent]], object] | None = None
                 ) -> None:
        self.engine = engine
        #: Given Stripe's invoice events listed since the last read of the invoices.
        self.on_invoice_events = on_invoice_events
        self.source = source
        self.clock = clock
        self.on_meter_codes = on_meter_codes
        self.customers = customers
        self.limiter = (None if max_requests_per_second is None
                        else process_limiter(max_requests_per_second))
        self.parallel = max(1, parallel)

    def _retrieve(self, event_id: str) -> StripeReport:
        if self.limiter is not None:
            self.limiter.acquire()
        return self.source.retrieve_event(event_id)

    def run_once(self) -> PollSummary:
        """One poll: list (every page), read each new event in full, store and apply it;
        then apply the samples that were waiting for their event to be sent."""
        now = self.clock()
        summary = PollSummary()
        with reading(self.engine) as conn:
            mark = rejections.last_report_created(conn)
        since = now - FIRST_POLL_BACK if mark is None else mark - self.OVERLAP
        try:
            listed = sorted(self.source.list_events(REPORT_TYPES, created_gte=since),
                            key=lambda t: (t.created, t.id))
            with reading(self.engine) as conn:
                stored = rejections.stored_ids(conn, [t.id for t in listed])
            new = list(dict.fromkeys(t.id for t in listed if t.id not in stored))
            meters_named: str | None = None
            chunk: list[StripeReport] = []

            def flush() -> None:
                nonlocal meters_named
                asked = ask_customers(self.engine, chunk, self.customers)
                for report, applied in zip(chunk, rejections.store_reports(
                        self.engine, chunk, source="poll", now=self.clock(), customers=asked),
                        strict=True):
                    if applied.stored:
                        summary.events += 1
                        summary.rejected += applied.rejected
                        summary.unmatched += applied.unmatched
                        if report.meter_codes:
                            meters_named = report.id
                chunk.clear()

            with ThreadPoolExecutor(max_workers=self.parallel,
                                    thread_name_prefix="stripe-events") as pool:
                try:
                    for report in pool.map(self._retrieve, new):
                        chunk.append(report)
                        if len(chunk) >= self.CHUNK:
                            flush()
                finally:
                    if chunk:      # what was read before a failure is kept, in order
                        flush()
        except Exception as exc:
            stripe_runs.record_run(self.engine, stripe_runs.EVENTS, ok=False, detail=str(exc),
                                   now=now)
            raise
        if meters_named is not None and self.on_meter_codes is not None:
            _read_meters(self.on_meter_codes, meters_named)      # once a poll, not per report
        summary.rejected += rejections.apply_waiting(self.engine, now=self.clock())
        if summary.rejected or summary.unmatched:
            log.warning("Stripe reported events invalid after accepting them: %d rejected, "
                        "%d samples not ours (%d new reports)", summary.rejected,
                        summary.unmatched, summary.events)
        stripe_runs.record_run(self.engine, stripe_runs.EVENTS, ok=True,
                               detail=f"{summary.events} new events, {summary.rejected} "
                               f"rejected, {summary.unmatched} unmatched samples", now=now)
        if self.on_invoice_events is not None:
            self._invoice_events(now)
        return summary

    def _invoice_events(self, now: datetime) -> None:
        """List the invoice events since the invoices were last read, and hand them on."""
        assert self.on_invoice_events is not None
        with reading(self.engine) as conn:
            mark = stripe_runs.run_status(conn, stripe_runs.INVOICES_MARK).ran_at
        if mark is None:        # never read: the billing refresher reads them at its start
            return
        listed = list(self.source.list_events(INVOICE_EVENT_TYPES,
                                              created_gte=mark - self.OVERLAP))
        if listed:
            self.on_invoice_events(listed)


def event_poller(engine: Engine, gateway: StripeGateway, settings: Settings, *,
                 clock: Callable[[], datetime] = utcnow,
                 on_meter_codes: Callable[[], object] | None = None,
                 on_invoice_events: Callable[[list[ThinEvent]], object] | None = None
                 ) -> EventPoller:
    """The poller every draining process and ``stripe-events poll`` run: within the process's
    rate limit, asking Stripe about customers as its reports need, and handing on Stripe's
    invoice events (``on_invoice_events``: the billing refresher's)."""
    return EventPoller(engine, gateway, clock=clock, on_meter_codes=on_meter_codes,
                       on_invoice_events=on_invoice_events,
                       max_requests_per_second=settings.stripe_max_requests_per_second,
                       customers=customer_directory(engine, gateway, settings, clock=clock))
