"""The plain words: one line for every state and every outcome, the duplicate answer apart."""

from __future__ import annotations

import pytest

from webapp.outbox.states import ALL_STATUSES, Outcome
from webapp.read.words import (
    DUPLICATE_WORDS,
    OUTCOME_WORDS,
    STATE_WORDS,
    is_duplicate,
    outcome_words,
    state_words,
)


@pytest.mark.parametrize("status", ALL_STATUSES)
def test_every_state_has_one_line(status: str) -> None:
    words = state_words(status)
    assert words and "\n" not in words and len(words) <= 90, words
    assert status not in words.lower().split()[0], "the words explain, not repeat, the code"


@pytest.mark.parametrize("outcome", [o.value for o in Outcome] + ["claim_expired"])
def test_every_outcome_has_one_line(outcome: str) -> None:
    words = outcome_words(outcome)
    assert words and "\n" not in words and len(words) <= 110, words


def test_the_tables_name_only_real_codes() -> None:
    assert set(STATE_WORDS) == set(ALL_STATUSES)
    assert set(OUTCOME_WORDS) == {o.value for o in Outcome} | {"claim_expired"}


def test_the_duplicate_answer_is_a_delivery_counted_once() -> None:
    # classify_error records "An event already exists with identifier" as delivered, with
    # Stripe's 400: the only delivery with an error status.
    assert is_duplicate("delivered", 400)
    assert outcome_words("delivered", 400) == DUPLICATE_WORDS
    assert DUPLICATE_WORDS == "Stripe already had this event — counted once"
    for outcome, status in (("delivered", 200), ("delivered", None), ("permanent", 400),
                            ("unknown", 500), (None, 400)):
        assert not is_duplicate(outcome, status)
    assert outcome_words("delivered", 200) == OUTCOME_WORDS["delivered"]


def test_unknown_codes_have_no_words() -> None:
    assert state_words("no-such-state") == "" and state_words(None) == ""
    assert outcome_words("no-such-outcome") == "" and outcome_words(None) == ""
