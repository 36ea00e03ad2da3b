"""The only package that imports ``stripe``: our verbs in, plain data and classified outcomes
out (see STRIPE.md's table and ``webapp.outbox.states.Outcome``)."""

from .client import (
    Gateway,
    InvalidSignature,
    MeterEvent,
    StripeCallFailed,
    StripeGateway,
    SummaryItem,
    ThinEvent,
    report_from,
)
from .errors import DUPLICATE_IDENTIFIER_PREFIX, classify_error, stripe_code
from .stream import (
    MAX_EVENTS_PER_REQUEST,
    StreamGateway,
    StreamResult,
    classify_stream_error,
    split_refused,
)

__all__ = ["DUPLICATE_IDENTIFIER_PREFIX", "MAX_EVENTS_PER_REQUEST", "Gateway",
           "InvalidSignature", "MeterEvent", "StreamGateway", "StreamResult", "StripeCallFailed",
           "StripeGateway", "SummaryItem", "ThinEvent", "classify_error", "classify_stream_error",
           "report_from", "split_refused", "stripe_code"]
