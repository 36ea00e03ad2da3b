"""Plain words on the pages: each state and outcome shown with its one-line explanation, the
duplicate-identifier answer as a neutral "counted once", and times relative and absolute."""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape

from webapp.read.words import DUPLICATE_WORDS, OUTCOME_WORDS, STATE_WORDS

DUPLICATE = "An event already exists with identifier key-dup"


def text(html: str) -> str:
    return unescape(re.sub(r"\s+", " ", html))


def test_the_duplicate_answer_reads_counted_once_in_a_neutral_colour(client_as, seed,
                                                                      now) -> None:
    ev = seed.event(status="sent", idempotency_key="key-dup", attempt_count=2, call_count=2)
    seed.attempt(ev, attempted_at=now - timedelta(minutes=8), outcome="unknown",
                 http_status=500, error_class="APIError", error_message="boom")
    seed.attempt(ev, attempted_at=now - timedelta(minutes=3), outcome="delivered",
                 http_status=400, error_class="InvalidRequestError", error_message=DUPLICATE)
    html = client_as("viewer").get(f"/events/{ev}").get_data(as_text=True)
    rows = re.findall(r"<tr\b.*?</tr>", html[html.index('id="attempts"'):], re.S)
    dup_row = next(r for r in rows if DUPLICATE in r)
    assert DUPLICATE_WORDS in unescape(dup_row)
    assert "outcome-duplicate" in dup_row
    # Neutral: not the outcome's green "delivered", nor an error's red, nor shown as an error.
    for cls in ("outcome-delivered", "outcome-permanent", "bad", "err", "badge-danger"):
        assert not re.search(rf'class="[^"]*\b{cls}\b', dup_row), cls
    unknown_row = next(r for r in rows if "boom" in r)
    assert OUTCOME_WORDS["unknown"] in unescape(unknown_row)
    # The state is explained next to its code.
    assert STATE_WORDS["sent"] in text(html)


def test_each_page_with_states_or_outcomes_explains_them(client_as, seed, now) -> None:
    seed.tenant("acme", "cus_acme", "Acme")
    seed.event(status="dead")
    seed.event(status="retrying")
    seed.event(status="rejected", rejected_at=now, reject_code="x", sent_at=now)
    seed.attempt(seed.event(status="sent"), outcome="delivered")
    viewer = client_as("viewer")
    pages = {
        "/": [STATE_WORDS[s] for s in STATE_WORDS] + [OUTCOME_WORDS["delivered"]],
        "/retries": [STATE_WORDS["retrying"], OUTCOME_WORDS["not_executed"]],
        "/dead-letters": [STATE_WORDS["dead"]],
        "/dead-letters?status=resolved": [STATE_WORDS["resolved"]],
        "/rejected": [STATE_WORDS["rejected"]],
        "/tenants/acme": [STATE_WORDS["dead"], STATE_WORDS["retrying"],
                          OUTCOME_WORDS["permanent"]],
    }
    for path, expected in pages.items():
        page = text(viewer.get(path).get_data(as_text=True))
        for words in expected:
            assert words in page, (path, words)


def test_times_are_relative_then_absolute_in_a_time_element(client_as, seed, now) -> None:
    at = now - timedelta(minutes=5, seconds=10)
    ev = seed.event(status="dead", dead_at=at)
    html = client_as("viewer").get(f"/events/{ev}").get_data(as_text=True)
    iso = at.isoformat()
    found = re.search(rf'<time datetime="{re.escape(iso)}"[^>]*>(.*?)</time>', html)
    assert found, "dead_at in a <time datetime>"
    shown = re.sub(r"<[^>]+>", "", found.group(1))
    assert shown == f"5 min ago · {at.strftime('%Y-%m-%d %H:%M:%S')} UTC", shown
