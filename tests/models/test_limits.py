"""Fitting outside text to its columns (``webapp.models.limits``): lengths read from the
column types, texts bounded, NUL and lone surrogates replaced, integers clamped, keys never
merged, JSON lists that still parse."""

from __future__ import annotations

import json

import pytest

from webapp.models import (
    TEXT_LIMIT,
    ReconciliationRun,
    StripeEvent,
    clean,
    fit,
    fit_json_list,
    fit_key,
    fits,
    limit_of,
)
from webapp.models.limits import REPLACEMENT
from webapp.outbox.sql import ATTEMPTS, STRIPE_EVENTS, T

RUNS = ReconciliationRun.__table__.c


def test_lengths_come_from_the_column_types() -> None:
    assert limit_of(T.c.last_error_code) == 100
    assert limit_of(T.c.last_request_id) == 255
    assert limit_of(T.c.last_error_message) == TEXT_LIMIT          # Text: bounded here
    assert limit_of(STRIPE_EVENTS.c.body) == 65536                 # its info says otherwise
    assert limit_of(StripeEvent.__table__.c.body) == 65536
    with pytest.raises(TypeError):
        limit_of(T.c.attempt_count)
    with pytest.raises(TypeError):
        limit_of(T.c.created_at)                                   # a TypeDecorator


def test_texts_keep_their_start_and_lose_what_no_database_stores() -> None:
    assert fit(T.c.last_error_code, "c" * 300) == "c" * 100
    assert fit(ATTEMPTS.c.error_message, "m" * 10_000_000) == "m" * TEXT_LIMIT
    assert fit(T.c.last_error_code, "a\x00b😀\ud800") == f"a{REPLACEMENT}b😀{REPLACEMENT}"
    assert fit(T.c.last_error_code, None) is None
    assert fit(T.c.last_error_code, 42) == "42"
    assert clean("plain") == "plain" and clean("é😀") == "é😀"


def test_integers_are_clamped_to_their_column() -> None:
    assert fit(T.c.last_http_status, 10**12) == 2**31 - 1
    assert fit(T.c.last_http_status, -(10**12)) == -(2**31)
    assert fit(T.c.quantity, 10**30) == 2**63 - 1
    assert fit(T.c.last_http_status, "nonsense") == 0
    assert fit(T.c.last_http_status, float("nan")) == 0


def test_keys_are_never_merged() -> None:
    column = STRIPE_EVENTS.c.id
    assert fit_key(column, "evt_123") == "evt_123"
    a, b = "evt_" + "x" * 400, "evt_" + "x" * 400 + "y"
    ka, kb = fit_key(column, a), fit_key(column, b)
    assert ka != kb and len(ka) == len(kb) == 255
    assert ka.startswith(a[:200]) and fit_key(column, a) == ka      # deterministic
    assert fit_key(column, ka) == ka                                 # a key is its own key
    assert fit_key(column, "nul\x00") != "nul\x00" and fits(column, fit_key(column, "nul\x00"))
    assert fits(column, "x" * 255) and not fits(column, "x" * 256)


@pytest.mark.parametrize("n", [0, 1, 5, 39, 40, 41, 200])
@pytest.mark.parametrize("size", [10, 480, 5000])
def test_json_lists_fit_and_parse(n: int, size: int) -> None:
    items = [f"error {i}: " + "é\x00" * size for i in range(n)]
    out = fit_json_list(RUNS.errors, items)
    assert len(out) <= limit_of(RUNS.errors)
    got = json.loads(out)
    if len(got) < n:
        assert got[-1] == f"… and {n - len(got) + 1} more"
        got = got[:-1]
    assert all(g == clean(items[i])[:500] for i, g in enumerate(got))
