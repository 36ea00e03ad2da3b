"""What the outbox asks of Stripe, as one protocol: the worker's sends (one event, or up to
100 through a stream), the meters, customers, subscriptions, invoices, events and summaries
that the maintenance services, the reconciler and the commands read, a push's signature, and a
cancel.

:class:`~webapp.stripe_gateway.client.SdkGateway` (the official SDK) is the product's only
implementation: :class:`webapp.services.Services` builds it once per process and hands it to
the drainer, the maintenance services, the pages and the commands. Tests talk to the fake
Stripe through that same class, pointed at the fake's address. Importing this module loads
no SDK."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..outbox.adjustments import CancelAnswer
    from ..outbox.customers import CustomerCheck
    from ..outbox.error_reports import StripeReport
    from ..outbox.invoices import InvoiceInfo, MeteredItem
    from ..outbox.meters import MeterInfo
    from ..outbox.states import CallResult
    from ..outbox.tenant_sync import StripeCustomer
    from .data import MeterEvent, SummaryItem, ThinEvent
    from .stream import StreamResult


class StripeGateway(Protocol):
    """Our verbs in, plain data and classified outcomes out. A send never raises for
    Stripe's answer (it is classified); the reads raise
    :class:`~webapp.stripe_gateway.data.StripeCallFailed` when Stripe cannot be asked."""

    @property
    def calls(self) -> int:
        """HTTP calls made so far by every thread (every page of a list is one)."""
        ...

    @property
    def thread_calls(self) -> int:
        """HTTP calls made so far by the calling thread."""
        ...

    # sending
    def send(self, event: MeterEvent, idempotency_key: str) -> CallResult: ...

    def send_batch(self, events: Sequence[MeterEvent],
                   idempotency_key: str | None = None) -> StreamResult: ...

    # reading
    def list_meters(self) -> list[MeterInfo]: ...

    def list_customers(self, metadata_key: str, *, page_size: int = ...,
                       pace: Callable[[], object] | None = ...) -> list[StripeCustomer]: ...

    def retrieve_customer(self, customer_id: str) -> CustomerCheck: ...

    def list_customer_deletions(self, *, created_gte: datetime | None,
                                customer_ids: Collection[str] | None = ...,
                                page_size: int = ...,
                                pace: Callable[[], object] | None = ...
                                ) -> dict[str, datetime]: ...

    def list_subscriptions(self, *, page_size: int = ...,
                           pace: Callable[[], object] | None = ...) -> list[MeteredItem]: ...

    def list_invoices(self, *, created_gte: datetime, page_size: int = ...,
                      pace: Callable[[], object] | None = ...,
                      status: str | None = ...) -> list[InvoiceInfo]: ...

    def retrieve_invoice(self, invoice_id: str) -> InvoiceInfo | None: ...

    def retrieve_subscription(self, subscription_id: str) -> list[MeteredItem]: ...

    def list_events(self, types: tuple[str, ...], *,
                    created_gte: datetime | None) -> Iterator[ThinEvent]: ...

    def retrieve_event(self, event_id: str) -> StripeReport: ...

    def parse_notification(self, raw: bytes, signature: str | None,
                           secret: str) -> ThinEvent: ...

    def meter_event_summaries(self, meter_id: str, customer: str, *, start: datetime,
                              end: datetime, grouping: str) -> list[SummaryItem]: ...

    # changing what Stripe holds
    def cancel_meter_event(self, event_name: str, identifier: str) -> CancelAnswer: ...

    def close(self) -> None: ...
