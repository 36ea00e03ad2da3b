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

__all__ = ["DUPLICATE_IDENTIFIER_PREFIX", "Gateway", "InvalidSignature", "MeterEvent",
           "StripeCallFailed", "StripeGateway", "SummaryItem", "ThinEvent", "classify_error",
           "report_from", "stripe_code"]
