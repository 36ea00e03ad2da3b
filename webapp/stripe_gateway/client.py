"""Our verbs in, plain data and classified outcomes out: send a meter event (or up to 100
through a meter event stream, :mod:`.stream`); list meters; list customers; list
subscriptions and invoices (:mod:`.invoices_sdk`); list and read Stripe's events (API v2);
when customers were deleted (v1 ``customer.deleted`` events);
verify a pushed event notification; read meter event summaries; cancel a meter event. Only
this package imports ``stripe``, and only this module (with :mod:`.errors`, :mod:`.http`,
:mod:`.stream_sdk` and :mod:`.invoices_sdk`, which it loads)
at import time: :mod:`.data` and :mod:`.stream` hold what the rest of the product imports."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import requests
import stripe

from ..outbox import customers
from ..outbox.adjustments import CancelAnswer
from ..outbox.customers import CustomerCheck
from ..outbox.error_reports import StripeReport
from ..outbox.meters import DEFAULT_CUSTOMER_KEY, DEFAULT_VALUE_KEY, MeterInfo
from ..outbox.states import CallResult, Outcome
from ..outbox.tenant_sync import StripeCustomer
from .data import (
    InvalidSignature,
    MeterEvent,
    StripeCallFailed,
    SummaryItem,
    ThinEvent,
    _parse_time,
    _text,
    report_from,
)
from .errors import classify_error
from .http import Urllib3Client
from .invoices_sdk import BillingReads
from .stream import StreamResult
from .stream_sdk import StreamSender


class SdkGateway(BillingReads):
    """The official SDK behind our verbs (the :class:`~.protocol.StripeGateway` of the
    product); never raises for a send's answer.

    The SDK's own retries are off (``max_network_retries=0``): the outbox retries, with the
    right idempotency key for each kind of failure, and one call never outlives the claim.
    ``calls`` counts every HTTP call made through it (pages of lists included).
    """

    def __init__(self, api_key: str, *, api_base: str | None = None,
                 meter_events_base: str | None = None, timeout_seconds: float,
                 connect_timeout_seconds: float = 3.05, pool_size: int = 64,
                 clock: Callable[[], datetime] | None = None) -> None:
        # Stripe serves meter event streams on a host of its own (meter-events.stripe.com);
        # every other call goes to the API's. A base left None is the SDK's own default.
        bases: dict[str, str] = {}
        if api_base:
            bases["api"] = api_base.rstrip("/")
        if meter_events_base:
            bases["meter_events"] = meter_events_base.rstrip("/")
        self._base = bases.get("api", stripe.DEFAULT_API_BASE)
        # Proxy settings are read from the environment once, here (requests would rescan
        # every environment variable on every call).
        proxies = requests.utils.get_environ_proxies(self._base)
        proxy = proxies.get("https" if self._base.startswith("https") else "http")
        self._http = Urllib3Client(connect_timeout_seconds, timeout_seconds, proxy=proxy,
                                   pool_size=max(pool_size, 1))
        # The SDK's client telemetry puts the previous call's request id and latency (and
        # the platform) in a header of the next call. The outbox makes one small call per
        # event, up to 1,000 a second; building that header was several percent of the
        # worker's CPU per call, and nothing billing needs depends on it. (A module-level
        # switch: this package is the only one that imports ``stripe``.)
        stripe.enable_telemetry = False
        self._client = stripe.StripeClient(
            api_key,
            base_addresses=bases,  # type: ignore[arg-type]
            max_network_retries=0,
            http_client=self._http,
        )
        # The meter event stream's session is created on its first use, and shared by every
        # thread sending through this gateway.
        self._stream = StreamSender(self._client, last_request_id=self._http.last_request_id,
                                    clock=clock)

    @property
    def base_addresses(self) -> dict[str, str]:
        """Where the SDK sends each kind of call (``api``, ``meter_events``, …)."""
        return dict(self._client._requestor._options.base_addresses)  # type: ignore[arg-type]

    @property
    def calls(self) -> int:
        """HTTP calls made so far (every page of a list is one)."""
        return self._http.calls

    @property
    def thread_calls(self) -> int:
        """HTTP calls made so far by the calling thread."""
        return self._http.thread_calls

    # -- sending --------------------------------------------------------------------------
    def send(self, event: MeterEvent, idempotency_key: str) -> CallResult:
        """``POST /v1/billing/meter_events``; the classified outcome."""
        try:
            created = self._client.v1.billing.meter_events.create(
                params=event.params(),  # type: ignore[arg-type]
                options={"idempotency_key": idempotency_key})
        except stripe.StripeError as exc:
            return classify_error(exc)
        response = getattr(created, "last_response", None)
        return CallResult(Outcome.DELIVERED, http_status=200,
                          request_id=getattr(response, "request_id", None))

    def send_batch(self, events: Sequence[MeterEvent],
                   idempotency_key: str | None = None) -> StreamResult:
        """``POST /v2/billing/meter_event_stream`` with 1 to 100 events (``ValueError``
        otherwise) on the meter events host, under ``idempotency_key`` (a new one when None):
        each event's classified outcome and the key that carried it (see :mod:`.stream`)."""
        return self._stream.send(events, idempotency_key)

    @property
    def stream_sessions(self) -> int:
        """Meter event sessions created so far."""
        return self._stream.sessions.created

    # -- meters ---------------------------------------------------------------------------
    def list_meters(self) -> list[MeterInfo]:
        """Every meter of the account, every page (there is no filter by event name)."""
        try:
            page = self._client.v1.billing.meters.list(params={"limit": 100})
            return [_meter(m.to_dict()) for m in page.auto_paging_iter()]
        except stripe.StripeError as exc:
            raise StripeCallFailed("listing meters", classify_error(exc)) from exc

    # -- customers ------------------------------------------------------------------------
    def list_customers(self, metadata_key: str, *, page_size: int = 100,
                       pace: Callable[[], object] | None = None) -> list[StripeCustomer]:
        """Every customer of the account (``GET /v1/customers``, page after page with
        ``starting_after`` while ``has_more``), with the value its metadata holds under
        ``metadata_key`` (None without one); deleted customers are left out. ``pace`` is
        called before each page (the process's ceiling on calls per second)."""
        found: list[StripeCustomer] = []
        params: dict[str, Any] = {"limit": page_size}
        what = "listing customers"
        try:
            while True:
                if pace is not None:
                    pace()
                page = self._client.v1.customers.list(params=params)  # type: ignore[arg-type]
                items = [c.to_dict() for c in page.data]
                for c in items:
                    if c.get("deleted"):
                        continue
                    value = (c.get("metadata") or {}).get(metadata_key)
                    found.append(StripeCustomer(str(c["id"]), _text(c.get("name")),
                                                _text(value)))
                if not page.has_more or not items:
                    return found
                params = {"limit": page_size, "starting_after": str(items[-1]["id"])}
        except stripe.StripeError as exc:
            raise StripeCallFailed(what, classify_error(exc)) from exc
        except (AttributeError, KeyError, TypeError) as exc:
            raise StripeCallFailed(what, CallResult(
                Outcome.PERMANENT, error_class="MalformedAnswer",
                message=f"a page could not be read: {exc}")) from exc

    def retrieve_customer(self, customer_id: str) -> CustomerCheck:
        """``GET /v1/customers/{id}``: whether Stripe has the customer (``active``), has it
        deleted (``deleted``: Stripe answers a stub), or has no such customer (``missing``:
        a 404 ``resource_missing``). Any other answer raises :class:`StripeCallFailed`."""
        what = f"looking up customer {customer_id}"
        try:
            found = self._client.v1.customers.retrieve(customer_id)
        except stripe.InvalidRequestError as exc:
            result = classify_error(exc)
            if exc.http_status == 404 and result.error_code == "resource_missing":
                return CustomerCheck(customer_id, customers.MISSING,
                                     request_id=result.request_id)
            raise StripeCallFailed(what, result) from exc
        except stripe.StripeError as exc:
            raise StripeCallFailed(what, classify_error(exc)) from exc
        response = getattr(found, "last_response", None)
        request_id = getattr(response, "request_id", None)
        data = found.to_dict()
        if data.get("deleted"):
            return CustomerCheck(customer_id, customers.DELETED, request_id=request_id)
        return CustomerCheck(customer_id, customers.ACTIVE, name=_text(data.get("name")),
                             request_id=request_id)

    def list_customer_deletions(self, *, created_gte: datetime | None,
                                customer_ids: Collection[str] | None = None,
                                page_size: int = 100,
                                pace: Callable[[], object] | None = None
                                ) -> dict[str, datetime]:
        """When Stripe deleted each customer it lists a ``customer.deleted`` event for
        (``GET /v1/events?type=customer.deleted``, created at or after ``created_gte``; Stripe
        keeps events 30 days), by customer id: the event's ``created`` (Unix seconds), the
        customer at ``data.object.id`` (the fields of the SDK's ``stripe._event.Event``).
        Page after page (``starting_after`` while ``has_more``), ``pace`` called before each;
        with ``customer_ids``, it stops once all of them are found (a customer is deleted
        once). An item that cannot be read is skipped (its customer's time is not had).
        Raises :class:`StripeCallFailed` when Stripe cannot be asked."""
        wanted = set(customer_ids) if customer_ids is not None else None
        found: dict[str, datetime] = {}
        params: dict[str, Any] = {"type": "customer.deleted", "limit": page_size}
        if created_gte is not None:
            params["created"] = {"gte": int(created_gte.timestamp())}
        try:
            while True:
                if pace is not None:
                    pace()
                page = self._client.v1.events.list(params=params)  # type: ignore[arg-type]
                items = [e.to_dict() for e in page.data]
                for e in items:
                    deletion = _deletion(e)
                    if deletion is not None:
                        customer_id, at = deletion
                        # Never two for one customer; were there, the later is the safer.
                        found[customer_id] = max(at, found.get(customer_id, at))
                if (not page.has_more or not items
                        or (wanted is not None and wanted <= set(found))):
                    return found
                params = dict(params, starting_after=str(items[-1]["id"]))
        except stripe.StripeError as exc:
            raise StripeCallFailed("listing deleted customers", classify_error(exc)) from exc
        except (AttributeError, KeyError, TypeError) as exc:
            raise StripeCallFailed("listing deleted customers", CallResult(
                Outcome.PERMANENT, error_class="MalformedAnswer",
                message=f"a page could not be read: {exc}")) from exc

    # -- events ---------------------------------------------------------------------------
    def list_events(self, types: tuple[str, ...], *, created_gte: datetime | None
                    ) -> Iterator[ThinEvent]:
        """Thin events of ``types`` created at or after ``created_gte``, every page."""
        params: dict[str, Any] = {"types": list(types), "limit": 100}
        if created_gte is not None:
            params["created"] = {"gte": _rfc3339(created_gte)}
        try:
            page = self._client.v2.core.events.list(params=params)  # type: ignore[arg-type]
            for ev in page.auto_paging_iter():
                yield ThinEvent(str(ev.id), str(ev.type), _parse_time(ev.created),
                                _related_id(ev))
        except stripe.StripeError as exc:
            raise StripeCallFailed("listing events", classify_error(exc)) from exc

    def retrieve_event(self, event_id: str) -> StripeReport:
        """The whole event (``GET /v2/core/events/{id}``), reduced to what the outbox uses."""
        try:
            event = self._client.v2.core.events.retrieve(event_id)
        except stripe.StripeError as exc:
            raise StripeCallFailed(f"reading event {event_id}", classify_error(exc)) from exc
        return report_from(event.to_dict())

    def parse_notification(self, raw: bytes, signature: str | None,
                           secret: str) -> ThinEvent:
        """A pushed thin event, once its ``Stripe-Signature`` verifies (HMAC-SHA256, 300 s
        tolerance, through the SDK); :class:`InvalidSignature` otherwise."""
        try:
            note = self._client.parse_event_notification(raw, signature, secret)
        except (stripe.SignatureVerificationError, ValueError) as exc:
            raise InvalidSignature(str(exc) or "bad signature") from exc
        return ThinEvent(str(note.id), str(note.type), _parse_time(note.created),
                         _related_id(note))

    # -- summaries and adjustments ----------------------------------------------------------
    def meter_event_summaries(self, meter_id: str, customer: str, *, start: datetime,
                              end: datetime, grouping: str) -> list[SummaryItem]:
        """A customer's usage of a meter over [start, end), per ``day`` or ``hour``, every
        page."""
        params = {"customer": customer, "start_time": int(start.timestamp()),
                  "end_time": int(end.timestamp()), "value_grouping_window": grouping,
                  "limit": 100}
        what = f"reading the summaries of {customer} on {meter_id}"
        try:
            page = self._client.v1.billing.meters.event_summaries.list(
                meter_id, params=params)  # type: ignore[arg-type]
            return [_summary(s) for s in page.auto_paging_iter()]
        except stripe.StripeError as exc:
            raise StripeCallFailed(what, classify_error(exc)) from exc
        except (AttributeError, TypeError, ValueError, OverflowError) as exc:
            # An item that is not a summary (a value that is no finite number, a missing
            # time): that pair cannot be compared; the run goes on and says so.
            raise StripeCallFailed(what, CallResult(
                Outcome.PERMANENT, error_class="MalformedAnswer",
                message=f"an item could not be read: {exc}")) from exc

    def cancel_meter_event(self, event_name: str, identifier: str) -> CancelAnswer:
        """``POST /v1/billing/meter_event_adjustments`` (``type=cancel``): Stripe takes it
        only within 24 hours of receiving the event. The classified outcome and, when Stripe
        took it, the adjustment's status and its id if the answer has one, as Stripe sent
        them."""
        try:
            adjustment = self._client.v1.billing.meter_event_adjustments.create(
                params={"event_name": event_name, "type": "cancel",
                        "cancel": {"identifier": identifier}},
                options={"idempotency_key": f"cancel:{identifier}"})
        except stripe.StripeError as exc:
            return CancelAnswer(classify_error(exc))
        response = getattr(adjustment, "last_response", None)
        body = adjustment.to_dict()
        return CancelAnswer(CallResult(Outcome.DELIVERED, http_status=200,
                                       request_id=getattr(response, "request_id", None)),
                            status=_text(body.get("status")),
                            adjustment_id=_text(body.get("id")))

    def close(self) -> None:
        self._http.close()


def _related_id(event: Any) -> str | None:
    """A thin event's ``related_object.id`` (None without one)."""
    related = getattr(event, "related_object", None)
    found = getattr(related, "id", None)
    return None if found is None else str(found)


def _deletion(event: Any) -> tuple[str, datetime] | None:
    """A ``customer.deleted`` event's customer and when it was deleted; None for anything
    else, or an item whose customer or time cannot be read as Stripe documents them."""
    if not isinstance(event, dict) or event.get("type") != "customer.deleted":
        return None
    data = event.get("data")
    obj = data.get("object") if isinstance(data, dict) else None
    customer_id = obj.get("id") if isinstance(obj, dict) else None
    created = event.get("created")
    if (not isinstance(customer_id, str) or not customer_id
            or not isinstance(created, int) or isinstance(created, bool) or created <= 0):
        return None
    try:
        return customer_id, datetime.fromtimestamp(created, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def _summary(s: Any) -> SummaryItem:
    value = float(s.aggregated_value)
    if not math.isfinite(value):
        raise ValueError(f"aggregated_value {value!r} is not a finite number")
    return SummaryItem(datetime.fromtimestamp(int(s.start_time), UTC),
                       datetime.fromtimestamp(int(s.end_time), UTC), value)


def _meter(m: dict[str, Any]) -> MeterInfo:
    mapping = m.get("customer_mapping") or {}
    value = m.get("value_settings") or {}
    aggregation = m.get("default_aggregation") or {}
    return MeterInfo(event_name=str(m.get("event_name") or ""), meter_id=_text(m.get("id")),
                     status=str(m.get("status") or "inactive"),
                     customer_key=str(mapping.get("event_payload_key") or DEFAULT_CUSTOMER_KEY),
                     value_key=str(value.get("event_payload_key") or DEFAULT_VALUE_KEY),
                     formula=str(aggregation.get("formula") or "sum"),
                     display_name=_text(m.get("display_name")),
                     # ``day`` or ``hour`` on a pre-aggregated meter; null on an ordinary one.
                     event_time_window=_text(m.get("event_time_window")) or None)


def _rfc3339(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
