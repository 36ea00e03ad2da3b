"""Stripe's error reports as the outbox reads them: plain data, built by the gateway from
``GET /v2/core/events/{id}`` and applied by :mod:`webapp.outbox.rejections`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from .tracing import METER_CODES

ERROR_REPORT = "v1.billing.meter.error_report_triggered"
NO_METER_FOUND = "v1.billing.meter.no_meter_found"
#: The event types the outbox reads; others are acknowledged and ignored.
REPORT_TYPES = (ERROR_REPORT, NO_METER_FOUND)


@dataclass(frozen=True)
class ErrorSample:
    """One sample error of a report."""

    code: str | None
    message: str | None
    identifier: str | None


@dataclass(frozen=True)
class StripeReport:
    """A Stripe event as read in full (``GET /v2/core/events/{id}``), reduced to what the
    outbox uses; ``body`` is the whole event as JSON, kept for the record."""

    id: str
    type: str
    created: datetime
    meter_id: str | None = None
    error_count: int = 0
    summary: str | None = None
    samples: tuple[ErrorSample, ...] = ()
    body: str | None = None
    #: When Stripe validated the events it reports on (``data.validation_start`` / ``_end``).
    validation_start: datetime | None = None
    validation_end: datetime | None = None
    #: How many errors of each code Stripe counted (``error_types[].error_count``): more than
    #: it samples.
    code_counts: tuple[tuple[str, int], ...] = ()

    def count_of(self, code: str) -> int:
        """How many errors of ``code`` Stripe counted (0 when it named none)."""
        return sum(n for c, n in self.code_counts if c == code)

    @property
    def meter_codes(self) -> bool:
        """Whether it says a meter is missing or archived (the meter list is stale)."""
        return self.type == NO_METER_FOUND or any(s.code in METER_CODES for s in self.samples)
