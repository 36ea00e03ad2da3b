"""What a draining process is made of: its name, its policy and gateway from the settings,
and a garbage-collector tweak for long drains."""

from __future__ import annotations

import gc
import os
import socket
from typing import TYPE_CHECKING

from ..config import Settings
from ..outbox.states import Policy

if TYPE_CHECKING:
    from ..stripe_gateway import StripeGateway

_frozen = False


def freeze_startup_objects() -> None:
    """Take what the process loaded at start-up out of the garbage collector's way; once.

    A drain loop allocates thousands of short-lived tuples per batch, and the objects of the
    batches in flight live long enough to be promoted, so full collections come often; each
    walked every object loaded at start-up (SQLAlchemy's metadata and caches, the SDK, the
    modules), none of which will ever be garbage. ``gc.freeze()`` moves them to a generation
    collections skip. Measured by ``bench/``'s drain: about a fifth of the worker's CPU.
    Called by the ``worker`` command once the app is built, before it starts draining (the
    full collection before the freeze takes a moment).
    """
    global _frozen
    if not _frozen:
        _frozen = True
        gc.collect()
        gc.freeze()


def worker_name() -> str:
    """``host:pid:random``: unique per process, readable in the attempts table."""
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(2).hex()}"


def policy_from(settings: Settings) -> Policy:
    """The numbers the state machine's transitions depend on."""
    return Policy(max_attempts=settings.max_attempts,
                  initial_backoff_seconds=settings.initial_backoff_seconds,
                  max_backoff_seconds=settings.max_backoff_seconds,
                  dedupe_window_seconds=settings.dedupe_window_seconds)


def gateway_from(settings: Settings) -> StripeGateway | None:
    """The Stripe gateway, or None without ``STRIPE_API_KEY`` (then nothing is sent). Built
    once per process, by ``Services.gateway()``. The SDK is loaded here, with the first
    gateway: a process without a key never loads it."""
    if not settings.stripe_api_key:
        return None
    from ..stripe_gateway import SdkGateway

    return SdkGateway(settings.stripe_api_key, api_base=settings.stripe_api_base,
                         meter_events_base=settings.meter_events_base,
                         timeout_seconds=settings.stripe_timeout_seconds,
                         pool_size=settings.concurrency)
