"""The gateway's plain data: what goes to Stripe (:class:`MeterEvent`), what comes back
(thin events, summaries, error reports), the failures a call raises, and the protocol the
drainer sends through. No SDK here: the worker, the web and the commands import these without
loading ``stripe``, which only :class:`~.client.StripeGateway` (built when there is a key)
needs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

from ..outbox.error_reports import ErrorSample, StripeReport
from ..outbox.meters import DEFAULT_CUSTOMER_KEY, DEFAULT_VALUE_KEY
from ..outbox.states import CallResult


class MeterEvent(NamedTuple):
    """Exactly what goes to ``POST /v1/billing/meter_events`` for one outbox event."""

    event_name: str
    stripe_customer_id: str
    value: int
    identifier: str
    occurred_at: datetime
    customer_key: str = DEFAULT_CUSTOMER_KEY
    value_key: str = DEFAULT_VALUE_KEY

    def params(self) -> dict[str, object]:
        return {
            "event_name": self.event_name,
            "payload": {self.customer_key: self.stripe_customer_id,
                        self.value_key: str(self.value)},
            "identifier": self.identifier,
            "timestamp": int(self.occurred_at.timestamp()),
        }


class StripeCallFailed(Exception):  # noqa: N818 - the outcome, not a programming error
    """A call other than sending failed; ``result`` says how (as for a send)."""

    def __init__(self, what: str, result: CallResult) -> None:
        detail = f"HTTP {result.http_status}" if result.http_status else result.error_class
        super().__init__(f"{what}: Stripe answered {detail}: {result.message or ''}".strip()
                         + (f" (request {result.request_id})" if result.request_id else ""))
        self.result = result


class InvalidSignature(Exception):  # noqa: N818 - the refusal itself
    """A pushed event whose signature does not verify (or is missing)."""


@dataclass(frozen=True)
class ThinEvent:
    """A thin event: what the list and a push carry (read the rest with ``retrieve_event``)."""

    id: str
    type: str
    created: datetime
    #: The object it is about (``related_object.id``: an invoice's id for invoice events).
    related_id: str | None = None


@dataclass(frozen=True)
class SummaryItem:
    """One meter event summary: a customer's aggregated value over [start, end)."""

    start: datetime
    end: datetime
    value: float


def report_from(event: dict[str, Any]) -> StripeReport:
    """A v2 event (as a dict) as the outbox keeps it: its samples flattened, every field
    Stripe may leave out defaulted."""
    data = event.get("data") or {}
    reason = data.get("reason") or {}
    related = event.get("related_object") or {}
    samples = []
    counts: list[tuple[str, int]] = []
    for error_type in reason.get("error_types") or []:
        code = _text(error_type.get("code"))
        if code is not None:
            counts.append((code, _count(error_type.get("error_count"))))
        for sample in error_type.get("sample_errors") or []:
            request = sample.get("request") or {}
            samples.append(ErrorSample(code=code,
                                       message=_text(sample.get("error_message")),
                                       identifier=_text(request.get("identifier"))))
    error_count = _count(reason.get("error_count"))
    # Lengths are the store's business (``webapp.models.limits``): texts come out whole.
    return StripeReport(
        id=str(event["id"]), type=str(event.get("type") or ""),
        created=_parse_time(event.get("created")),
        meter_id=_text(related.get("id")), error_count=error_count,
        summary=_text(data.get("developer_message_summary")), samples=tuple(samples),
        body=json.dumps(event, default=str),
        validation_start=_time_or_none(data.get("validation_start")),
        validation_end=_time_or_none(data.get("validation_end")), code_counts=tuple(counts))


def _count(value: Any) -> int:
    """A count of Stripe's, or 0 for anything that is not a whole number."""
    try:
        return max(int(value or 0), 0)
    except (TypeError, ValueError, OverflowError):
        return 0


def _time_or_none(value: Any) -> datetime | None:
    """A time of Stripe's, or None when absent or unreadable."""
    if value is None:
        return None
    try:
        return _parse_time(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _text(value: Any) -> str | None:
    """A text field of Stripe's as text (None stays None, anything else its ``str``)."""
    return None if value is None else str(value)


def _parse_time(value: Any) -> datetime:
    """Stripe's v2 times are RFC 3339 strings; v1's are Unix seconds."""
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC)
    parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
