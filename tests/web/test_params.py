"""The input layer (``webapp.web.params``): a bad parameter is a 400 that names it, as a page
or as an htmx fragment; bad UTF-8 (which Werkzeug turns into U+FFFD), NUL and control
characters are refused; numbers, dates and page positions keep to their ranges; path ids
past 64 bits are a 404; and a view cannot read a field it did not declare."""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask

from webapp.read.numbers import ascii_int
from webapp.read.paging import Cursor
from webapp.web.params import MAX_ID, Day, Int, Text, accepts, text_problem

from .conftest import csrf_of


@pytest.mark.parametrize(("query", "field"), [
    ("limit=abc", "limit"), (f"limit={2**63}", "limit"), ("limit=%EF%BC%91", "limit"),
    # "²" passes isdigit() and int() refuses it; int() reads "٣" as 3 and "１２" as 12
    ("limit=%C2%B2", "limit"), ("limit=%D9%A3", "limit"), ("limit=%EF%BC%91%EF%BC%92", "limit"),
    ("limit=1_0", "limit"),
    ("tenant=%00", "tenant"), ("tenant=a%0D%0Ab", "tenant"), ("tenant=%FF%FE", "tenant"),
    ("tenant=" + "a" * 201, "tenant"), ("age=forever", "age"),
    ("after=2026-01-01T00:00:00Z~" + str(2**64), "after"),
    ("after=1999-12-31T23:00:00Z~5", "after"), ("before=garbage", "before"),
    ("after=2026-01-01T00:00:00Z~%D9%A3", "after"),
    ("before=2026-01-01T00:00:00Z~%C2%B2", "before"),
    ("after=2026-01-01T00:00:00Z~%EF%BC%91%EF%BC%92", "after"),
])
def test_a_bad_parameter_is_a_400_naming_it(client_as: Any, query: str, field: str) -> None:
    client = client_as("viewer")
    page = client.get(f"/dead-letters?{query}")
    assert page.status_code == 400
    html = page.get_data(as_text=True)
    assert f"“{field}”" in html and "<html" in html.lower()
    fragment = client.get(f"/dead-letters?{query}", headers={"HX-Request": "true"})
    assert fragment.status_code == 400
    text = fragment.get_data(as_text=True)
    assert f"“{field}”" in text and "<html" not in text.lower()


@pytest.mark.parametrize(("query", "ok"), [
    ("from=2000-01-01&to=2000-01-31", True), ("from=2100-12-01&to=2100-12-31", True),
    ("from=1999-12-31", False), ("to=2101-01-01", False), ("from=0001-01-01", False),
    ("to=9999-12-31", False), ("to=10000-01-01", False), ("from=2026-02-30", False),
    ("from=20260101", False),
])
def test_dates_keep_to_their_range(client_as: Any, query: str, ok: bool) -> None:
    resp = client_as("viewer").get(f"/tenants?{query}")
    assert resp.status_code == (200 if ok else 400), resp.get_data(as_text=True)[-400:]


def test_a_page_size_is_clamped_not_refused(client_as: Any) -> None:
    client = client_as("viewer")
    assert client.get("/dead-letters?limit=100000").status_code == 200
    assert client.get("/dead-letters?limit=0").status_code == 200
    assert client.get(f"/dead-letters?limit={10**20}").status_code == 400


def test_form_fields_are_refused_the_same_way(client_as: Any, seed: Any) -> None:
    dead = seed.event(status="dead")
    client = client_as("operator")
    token = csrf_of(client)
    before = seed.snapshot()
    for body in (f"ids={2**63}", "ids=1&ids=x", f"ids={dead}&reason=written_off&note=%00",
                 f"ids={dead}&reason=written%0Aoff&note=x", f"ids={dead}&note=%FF"):
        resp = client.post("/dead-letters/resolve", data=f"csrf_token={token}&{body}",
                           content_type="application/x-www-form-urlencoded")
        assert resp.status_code == 400, body
    assert seed.snapshot() == before
    # a note may span lines
    resp = client.post("/dead-letters/resolve", data={
        "csrf_token": token, "ids": dead, "reason": "written_off", "note": "line 1\r\nline 2"})
    assert resp.status_code == 303 and seed.get(dead).resolve_note == "line 1\r\nline 2"


def test_path_ids_past_64_bits_are_not_found(client_as: Any) -> None:
    client = client_as("viewer")
    for path in (f"/events/{2**63}", f"/events/{10**20}", "/events/0", "/events/-1",
                 "/tenants/a%00b", "/tenants/%FF%FE", "/tenants/" + "a" * 101):
        assert client.get(path).status_code == 404, path
    assert client.get(f"/events/{MAX_ID}").status_code == 404  # in range: no such event


def test_text_problems() -> None:
    assert text_problem("acme ünïcode ✓") is None
    assert text_problem("a\ufffdb") == "is not valid UTF-8"  # what a bad byte decodes to
    assert text_problem("a\x00b") == "contains a NUL character"
    assert text_problem("a\tb") is not None and text_problem("a\x85b") is not None
    assert text_problem("a\r\nb\tc", multiline=True) is None
    assert text_problem("a\x1bb", multiline=True) is not None


def test_a_view_reads_only_what_it_declared(app: Flask) -> None:
    declared_field, other = Int("n", 1, 9, default=1), Text("t", 5)

    @accepts(declared_field)
    def view() -> Any:
        return declared_field.get(), other.get()

    with app.test_request_context("/?n=3&t=x"), pytest.raises(RuntimeError, match="'t'"):
        view()
    with pytest.raises(ValueError, match="64-bit"):
        Int("big", 0, 2**63)
    with pytest.raises(ValueError, match="twice"):
        accepts(Day("d"), Day("d"))


def test_cursor_round_trip_stays_valid() -> None:
    from datetime import UTC, datetime

    cursor = Cursor(datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC), MAX_ID)
    assert Cursor.decode(cursor.encode()) == cursor
    for ident in ("٣", "１２", "²", " 12", "1_2", "12\n"):
        with pytest.raises(ValueError):
            Cursor.decode(f"2026-01-02T03:04:05.000006Z~{ident}")


@pytest.mark.parametrize(("text", "number"), [
    ("0", 0), ("12", 12), ("-7", -7), (str(MAX_ID), MAX_ID), ("9" * 19, int("9" * 19)),
    ("9" * 20, None), ("", None), ("-", None), ("²", None), ("٣", None), ("１２", None),
    ("1٣", None), ("1_000", None), (" 12", None), ("12\n", None), ("+1", None), ("1.0", None),
])
def test_only_ascii_digits_spell_a_number(text: str, number: int | None) -> None:
    assert ascii_int(text) == number


def test_bytes_that_are_not_utf8_are_refused_escaped_or_raw(client_as: Any) -> None:
    """Werkzeug keeps bad bytes percent-encoded (``%FF`` as text); the layer decodes them
    to U+FFFD instead and refuses them, in a query string and in a form."""
    client = client_as("operator")
    for raw in ("tenant=%FF%FE", "tenant=\xff\xfe"):  # WSGI strings carry bytes as latin-1
        resp = client.get("/dead-letters", environ_overrides={"QUERY_STRING": raw})
        assert resp.status_code == 400 and "“tenant” is not valid UTF-8" in resp.get_data(
            as_text=True)
    assert client.get("/dead-letters?tenant=%25FF").status_code == 200  # a typed "%FF"
    token = csrf_of(client)
    for body in (b"note=%FF", b"note=\xff"):
        resp = client.post("/sending/pause", data=b"csrf_token=" + token.encode() + b"&reason="
                           + body[5:], content_type="application/x-www-form-urlencoded")
        assert resp.status_code == 400 and "“reason” is not valid UTF-8" in resp.get_data(
            as_text=True)


@pytest.mark.parametrize(("query", "expected"), [
    ("a=3", (3, 3)), ("a=2-5", (2, 5)), ("a=2-", (2, None)), ("a=-5", (None, 5)),
    ("a=", None), ("a=0", (0, 0)), ("a=-", "bad"), ("a=5-2", "bad"), ("a=1001", "bad"),
    ("a=1.5", "bad"), ("a=x", "bad"), ("a=1-2-3", "bad"), ("a=%EF%BC%91", "bad"),
    ("a=%C2%B2", "bad"), ("a=%D9%A3", "bad"), ("a=%D9%A3-5", "bad"), ("a=2-%EF%BC%95", "bad"),
])
def test_a_number_or_range(app: Flask, query: str, expected: Any) -> None:
    from werkzeug.exceptions import BadRequest

    from webapp.web.params import IntRange

    field = IntRange("a", 0, 1000)

    @accepts(field)
    def view() -> Any:
        return field.get()

    with app.test_request_context(f"/?{query}"):
        if expected == "bad":
            with pytest.raises(BadRequest, match="“a”"):
                view()
        else:
            assert view() == expected


def test_repeated_choices(app: Flask) -> None:
    from werkzeug.exceptions import BadRequest

    from webapp.web.params import Choices

    field = Choices("s", ("a", "b", "c"), max_count=3)

    @accepts(field)
    def view() -> Any:
        return field.get()

    with app.test_request_context("/?s=c&s=a&s=&s=a"):
        assert view() == ("a", "c")  # in the choices' order, once each, blanks skipped
    with app.test_request_context("/?s=a&s=d"), pytest.raises(BadRequest, match="“s”"):
        view()
    with app.test_request_context("/?s=a&s=b&s=c&s=a"), pytest.raises(BadRequest,
                                                                       match="more than 3"):
        view()
