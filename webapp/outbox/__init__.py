"""The outbox core, free of Flask: enqueue, claim, record outcomes, rescue, and operations.

The request path needs only ``enqueue_usage`` and its two errors.
"""

from .enqueue import IdempotencyConflict, InvalidUsage, enqueue_usage

__all__ = ["IdempotencyConflict", "InvalidUsage", "enqueue_usage"]
