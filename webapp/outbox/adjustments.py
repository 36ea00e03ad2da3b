"""Stripe's answer to a cancel (``POST /v1/billing/meter_event_adjustments``, ``type=cancel``)
and what of it an event keeps.

The gateway makes a :class:`CancelAnswer`, texts as Stripe sent them. An event keeps it as
:func:`kept` says: the adjustment's status (``pending`` until Stripe has applied it to the
meter, then ``complete``) and a reference support can quote to Stripe, each cleaned and cut
to its column, so that whatever Stripe sends, recording the cancel never fails.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..models import fit
from .sql import T
from .states import CallResult


@dataclass(frozen=True)
class CancelAnswer:
    """Stripe's answer to one event's cancel: the classified call (``DELIVERED`` when Stripe
    took the adjustment) and then the adjustment's ``status`` and, when the answer carries
    one, its ``adjustment_id`` (Stripe's v1 object documents none)."""

    call: CallResult
    status: str | None = None
    adjustment_id: str | None = None


@dataclass(frozen=True)
class KeptAdjustment:
    """Stripe's answer to a cancel as an event keeps it (``cancel_adjustment_status`` and
    ``cancel_adjustment_id``)."""

    status: str | None
    reference: str | None

    def words(self) -> str:
        """The answer in a phrase: ``adjustment pending, id req_…``."""
        said = f"adjustment {self.status or 'status not given'}"
        return f"{said}, id {self.reference}" if self.reference else said


def kept(answer: CancelAnswer) -> KeptAdjustment:
    """What an event keeps of Stripe's answer to its cancel: the adjustment's status, and as
    its reference the adjustment's id when the answer carries one, else the request id of
    the call. Both are cleaned and cut to their columns (never refused)."""
    return KeptAdjustment(
        status=fit(T.c.cancel_adjustment_status, answer.status or None),
        reference=fit(T.c.cancel_adjustment_id, answer.adjustment_id or answer.call.request_id))
