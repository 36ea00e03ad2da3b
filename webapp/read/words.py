"""Plain words for the codes the dashboard shows: one line for each event state and each call
outcome, why a pre-aggregated meter's events wait, what a cancel at Stripe does and how a
rejection was traced to its event, written for finance and support staff. The one place these
sentences live; the templates reach them through the ``state_words``, ``outcome_words``,
``pre_aggregated_words`` and ``found_by_words`` filters (and ``cancel_words``)."""

from __future__ import annotations

from typing import NamedTuple

from ..outbox.states import Outcome
from ..status import Status

#: What each event state means, in one line.
STATE_WORDS: dict[str, str] = {
    Status.PENDING: "Waiting to be sent to Stripe for the first time.",
    Status.PROCESSING: "Being sent to Stripe right now.",
    Status.RETRYING: "A try did not go through; it is tried again automatically.",
    Status.SENT: "Stripe accepted it; billed on its period's invoice unless Stripe reports "
                 "a problem.",
    Status.DEAD: "Sending stopped: a person must requeue or resolve it.",
    Status.REJECTED: "Stripe accepted it, then refused it: nothing was billed.",
    Status.RESOLVED: "Closed by a person with a reason; it will not be sent.",
    Status.CANCELLED: ("A person cancelled it at Stripe: usage off the meter; a finalized "
                       "invoice is not changed."),
}


class CancelWords(NamedTuple):
    """What a cancel at Stripe (a meter event adjustment) does and does not do: Stripe's own
    promise, no more. The confirm step and the ``cancel`` command say all of it, in order."""

    off_the_meter: str
    finalized_invoice: str
    within_24_hours: str


CANCEL_WORDS = CancelWords(
    off_the_meter="Stripe takes the event's usage off the customer's meter, with an adjustment "
                  "it may apply a little later: until then the meter can still show the usage.",
    finalized_invoice="If that usage is already on an invoice Stripe has finalized, that "
                      "invoice is not changed: credit the customer in Stripe instead.",
    within_24_hours="Stripe accepts a cancel only within 24 hours of accepting the event. It "
                    "cannot be undone here: to bill the usage after all, record it again.",
)

#: What each outcome of one call to Stripe means, in one line.
OUTCOME_WORDS: dict[str, str] = {
    Outcome.DELIVERED: "Stripe accepted the event.",
    Outcome.NOT_EXECUTED: "Stripe was busy or unavailable and did nothing; tried again later.",
    Outcome.UNKNOWN: ("No clear answer: Stripe may have it. Tried again with the same "
                      "identifier, so it is never counted twice."),
    Outcome.PERMANENT: "Stripe refused the event; sending it again cannot help.",
    Outcome.SYSTEMIC: "Nothing can be sent (API key or account problem); sending is held.",
    Outcome.METER_MISSING: "Stripe has no active meter of this name; the event waits for one.",
    # Not a call: the rescuer's note on an event whose worker stopped answering.
    "claim_expired": "The worker sending it stopped answering; it was put back in the queue.",
}

#: The answer "an event already exists with identifier …": delivered, counted once.
DUPLICATE_WORDS = "Stripe already had this event — counted once"
#: What introduces Stripe's own message for that answer: a note about the event, not an error.
ALREADY_AT_STRIPE = "Already at Stripe"
#: What introduces any other answer that carries an error (class, code or message).
STRIPE_ERROR = "Error"


def is_duplicate(outcome: str | None, http_status: int | None) -> bool:
    """Stripe's duplicate-identifier answer: the one error status recorded as delivered
    (``stripe_gateway.errors.classify_error``)."""
    return outcome == Outcome.DELIVERED and http_status is not None and http_status >= 400


def answer_label(outcome: str | None, http_status: int | None, *, error_class: str | None,
                 error_code: str | None, message: str | None) -> str | None:
    """How Stripe's answer to one call is introduced where it is shown:
    :data:`ALREADY_AT_STRIPE` for the duplicate-identifier answer (delivered: its message is a
    note), :data:`STRIPE_ERROR` for any other answer that carries an error, None when the
    answer carries nothing to show (a 200)."""
    if is_duplicate(outcome, http_status):
        return ALREADY_AT_STRIPE
    if error_class or error_code or message:
        return STRIPE_ERROR
    return None


def state_words(status: str | None) -> str:
    """The one-line explanation of an event state ("" for an unknown one)."""
    return STATE_WORDS.get(status or "", "")


def outcome_words(outcome: str | None, http_status: int | None = None) -> str:
    """The one-line explanation of a call's outcome ("" for an unknown one)."""
    if is_duplicate(outcome, http_status):
        return DUPLICATE_WORDS
    return OUTCOME_WORDS.get(outcome or "", "")


def pre_aggregated_words(window: str | None, *, lower: bool = False) -> str:
    """Why the events of a pre-aggregated meter (Stripe's ``event_time_window``, ``day`` or
    ``hour``) are not sent and what sends them, in plain words: "Pre-aggregated (one value
    per day): …". ``lower``: beginning in lower case, to follow "which is"."""
    per = window or "time window"
    words = (f"Pre-aggregated (one value per {per}): Stripe would keep only the last event of "
             f"each {per}, so its events are not sent. They go out once Stripe has a meter "
             "without a time window for their event name (a meter's window cannot be changed: "
             "it takes a new meter).")
    return "p" + words[1:] if lower else words


#: How a rejection was traced to its event (``stripe_usage_outbox.reject_found_by``).
FOUND_BY_WORDS = {
    "sample": "Stripe's report named this event.",
    "request": "Stripe's report named the stream request that carried this event, and what "
               "it said singles this event out.",
    "customer": "Stripe's report counted events refused for a customer it does not have; "
                "asked, Stripe said it has no such customer (or has deleted it), so every "
                "event sent to it was refused.",
}


def found_by_words(found_by: str | None) -> str:
    """How Stripe's refusal was traced to an event, in plain words ("" when not known)."""
    return FOUND_BY_WORDS.get(found_by or "", "")
