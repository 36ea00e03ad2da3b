"""The loopback fake of Stripe (see :mod:`.fake`)."""

from .fake import FakeStripe, main
from .meter_events import AcceptedEvent, AsyncError, FakeMeter
from .reports import signature_header

__all__ = ["AcceptedEvent", "AsyncError", "FakeMeter", "FakeStripe", "main", "signature_header"]
