"""Every CSV export is safe to open in a spreadsheet (CSV injection, OWASP's rule): seeded
with hostile tenant names, customer ids, meters, audit actors, codes and notes, no cell, and
no part of a cell after a ``;``, ``,``, tab, CR or newline, starts with ``=``, ``+``, ``-``,
``@``, tab or CR — whether the file is read with ``,`` or with ``;`` as its delimiter (a
spreadsheet set up for ``;`` splits ``Acme;=2+3`` into two cells)."""

from __future__ import annotations

import csv
import io
import random
import re
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import Engine, insert

from webapp.models import AuditEntry, utcnow
from webapp.web.common import _FORMULA_START, _cell, csv_response

HOSTILE = ["Acme;=2+3", '=HYPERLINK("http://x")', "x,-1+1", "a\n@SUM(1)", "\t=1", "+1",
           "-1", "@SUM(A1)", "\r=1", "ok;\t;=1", "a\r\n-2", "b,\t,\r@x", "'=already"]
TRIGGERS = ("=", "+", "-", "@", "\t", "\r")
SEPARATORS = re.compile(r"[;,\t\r\n]")
#: Every CSV export of the dashboard (grep csv_response): the CLI writes none.
EXPORTS = ["/tenants.csv", "/audit.csv", "/events.csv"]


def unsafe_parts(text: str) -> list[str]:
    """What of ``text``, read either way, a spreadsheet could take for a formula."""
    found = []
    for delimiter in (",", ";"):
        for row in csv.reader(io.StringIO(text, newline=""), delimiter=delimiter):
            for cell in row:
                if re.fullmatch(r"-?[0-9]+(\.[0-9]+)?", cell):
                    continue                  # a number, written as it is
                starts = [cell] + [cell[m.end():] for m in SEPARATORS.finditer(cell)]
                found += [cell for part in starts if part.startswith(TRIGGERS)]
    return found


@pytest.fixture
def hostile(engine: Engine, seed: Any) -> None:
    for i, text in enumerate(HOSTILE):
        tenant = text if text.isprintable() else f"t{i}{text}"
        seed.tenant(tenant, text, text)
        seed.event(tenant_id=tenant, meter=text, status="sent", stripe_customer_id=text)
        seed.event(tenant_id=tenant, meter=text, status="dead")
    with engine.begin() as conn:
        conn.execute(insert(AuditEntry.__table__), [
            dict(at=utcnow(), actor=text, action=text, event_ids=text, event_count=1,
                 reason_code=text, note=text) for text in HOSTILE])


@pytest.mark.parametrize("path", EXPORTS)
def test_every_export_is_defused_read_with_commas_or_semicolons(
        client_as: Any, hostile: None, path: str) -> None:
    resp = client_as("viewer").get(path)
    assert resp.status_code == 200 and resp.mimetype == "text/csv"
    text = resp.get_data(as_text=True)
    rows = list(csv.reader(io.StringIO(text, newline="")))
    assert len(rows) > len(HOSTILE)            # every hostile value is in it
    assert unsafe_parts(text) == []
    # What a person sees is what was stored, behind an apostrophe where it was needed.
    cells = {c for r in rows for c in r}
    assert "Acme;'=2+3" in cells and "'=HYPERLINK(\"http://x\")" in cells
    assert "x,'-1+1" in cells and "a\n'@SUM(1)" in cells and "'\t'=1" in cells
    assert "'=already" in cells


def test_numbers_are_written_as_they_are_and_text_is_quoted(app: Flask) -> None:
    with app.test_request_context():
        resp = csv_response("x.csv", ["a", "b", "c", "d", "e", "f"],
                            [[-5, 2.5, Decimal("-1.5"), "-5", None,
                              datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)]])
        text = "".join(resp.response)  # type: ignore[arg-type]
    assert text.splitlines()[1] == ('-5,2.5,-1.5,"\'-5","","2026-01-02T03:04:05+00:00"')


def test_leading_rows_come_first_defused_then_an_empty_row(app: Flask) -> None:
    with app.test_request_context():
        resp = csv_response("x.csv", ["a", "b"], [[1, "x"]],
                            preamble=[["Period", "2026-11-01", "2026-11-30"], ["=1+1", 5]])
        text = "".join(resp.response)  # type: ignore[arg-type]
    assert text.splitlines() == ['"Period","2026-11-01","2026-11-30"', '"\'=1+1",5', "",
                                 '"a","b"', '1,"x"']


def test_one_tenants_usage_file_is_defused_too(client_as: Any, hostile: None) -> None:
    for text in HOSTILE[:4]:
        tenant = text if text.isprintable() else None
        if tenant is None:
            continue
        resp = client_as("viewer").get("/tenants.csv", query_string={"tenant": tenant})
        assert resp.status_code == 200
        body = resp.get_data(as_text=True)
        assert unsafe_parts(body) == [] and "Total" in body
        # period, generated at, tenant, empty line, header, its one row, totals
        assert len(body.splitlines()) == 7, body


def test_a_cell_is_defused_exactly_where_a_formula_could_start() -> None:
    """The quick test that skips most cells agrees with the full rule on every short string
    of triggers, separators and plain characters."""
    rng = random.Random(7)
    alphabet = "ab'=+-@\t\r\n;, "
    for _ in range(20_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))
        assert _cell(text) == _FORMULA_START.sub(r"\1'", text), repr(text)
