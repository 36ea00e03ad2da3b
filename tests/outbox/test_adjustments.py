"""What an event keeps of Stripe's answer to its cancel: the status as answered, and the
adjustment's id when the answer carries one, else the call's request id; cut to the columns."""

from __future__ import annotations

from webapp.outbox.adjustments import CancelAnswer, KeptAdjustment, kept
from webapp.outbox.states import CallResult, Outcome

TAKEN = CallResult(Outcome.DELIVERED, http_status=200, request_id="req_1")


def test_the_adjustments_id_is_kept_before_the_request_id() -> None:
    assert kept(CancelAnswer(TAKEN, "complete", "mea_9")) == KeptAdjustment("complete", "mea_9")
    assert kept(CancelAnswer(TAKEN, "pending")) == KeptAdjustment("pending", "req_1")
    assert kept(CancelAnswer(TAKEN, "pending", "")) == KeptAdjustment("pending", "req_1")
    assert kept(CancelAnswer(CallResult(Outcome.DELIVERED), "")) == KeptAdjustment(None, None)


def test_what_stripe_sends_is_cleaned_and_cut_never_refused() -> None:
    answer = CancelAnswer(TAKEN, "pending\x00" + "p" * 50, "mea_\ud800" + "i" * 300)
    assert kept(answer) == KeptAdjustment("pending\ufffd" + "p" * 12,
                                          ("mea_\ufffd" + "i" * 300)[:255])


def test_the_answer_in_a_phrase() -> None:
    assert KeptAdjustment("pending", "req_1").words() == "adjustment pending, id req_1"
    assert KeptAdjustment("complete", None).words() == "adjustment complete"
    assert KeptAdjustment(None, "req_2").words() == "adjustment status not given, id req_2"
