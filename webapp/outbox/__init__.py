"""The outbox core, free of Flask: the state machine (``states``), enqueue (``enqueue``),
the claim statement and its release and rescue (``claims``), recording outcomes under the
claim (``record``), the sending switch (``control``), the rollups (``rollups``), what people
do (``operations``), and the SQL they share (``sql``). Only this package writes ``status``.

The request path needs only ``enqueue_usage`` and its two errors.
"""

from .enqueue import IdempotencyConflict, InvalidUsage, enqueue_usage

__all__ = ["IdempotencyConflict", "InvalidUsage", "enqueue_usage"]
