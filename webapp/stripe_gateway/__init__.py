"""The only package that imports ``stripe``: our verbs in, plain data and classified outcomes
out (see docs/stripe.md and ``webapp.outbox.states.Outcome``).

:class:`StripeGateway` (:mod:`.protocol`) is everything the outbox asks of Stripe;
:class:`SdkGateway` is it on the official SDK. The SDK is loaded when its first SDK-bound name
is used (``SdkGateway``, built only with an API key; the error classifiers): the plain data,
the protocol and the stream's halving cost nothing to import, so a command or a page that
never calls Stripe never loads it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .data import (
    InvalidSignature,
    MeterEvent,
    StripeCallFailed,
    SummaryItem,
    ThinEvent,
    report_from,
)
from .protocol import StripeGateway
from .stream import (
    MAX_EVENTS_PER_REQUEST,
    StreamResult,
    split_refused,
)

if TYPE_CHECKING:
    from .client import SdkGateway
    from .errors import DUPLICATE_IDENTIFIER_PREFIX, classify_error, stripe_code
    from .stream_sdk import classify_stream_error
else:
    #: The SDK-bound names, by the module that holds them (loaded on first use).
    _LAZY = {"SdkGateway": "client", "DUPLICATE_IDENTIFIER_PREFIX": "errors",
             "classify_error": "errors", "stripe_code": "errors",
             "classify_stream_error": "stream_sdk"}

    def __getattr__(name: str) -> Any:
        if name not in _LAZY:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        from importlib import import_module

        value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value

__all__ = ["DUPLICATE_IDENTIFIER_PREFIX", "MAX_EVENTS_PER_REQUEST", "InvalidSignature",
           "MeterEvent", "SdkGateway", "StreamResult", "StripeCallFailed", "StripeGateway",
           "SummaryItem", "ThinEvent", "classify_error", "classify_stream_error",
           "report_from", "split_refused", "stripe_code"]
