"""Keyset pagination over (time, id), newest first: as fast on page 1,000 as on page 1."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, literal, tuple_

from ..models import UTCDateTime
from ..outbox.sql import as_utc, row_dict
from .numbers import ascii_int

#: The most rows one page shows.
MAX_PAGE = 500


@dataclass(frozen=True)
class Cursor:
    """A position in a list ordered by (time, id) descending."""

    at: datetime
    id: int

    def encode(self) -> str:
        return f"{self.at.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%S.%f')}Z~{self.id}"

    @classmethod
    def decode(cls, raw: str) -> Cursor:
        """Raises ValueError on anything malformed (an id in other than ASCII digits too)."""
        at, _, ident = raw.partition("~")
        parsed = datetime.fromisoformat(at.replace("Z", "+00:00"))
        if parsed.tzinfo is None:
            raise ValueError("cursor time needs a zone")
        number = ascii_int(ident)
        if number is None:
            raise ValueError("cursor id must be ASCII digits")
        return cls(parsed.astimezone(UTC), number)


@dataclass(frozen=True)
class Page:
    """One page of rows, and where the pages before and after it start."""

    rows: list[dict[str, Any]]
    next: Cursor | None          # older rows exist after the last one shown
    prev: Cursor | None          # newer rows exist before the first one shown


def keyset(conn: Connection, stmt: Any, time_col: Any, id_col: Any, *, after: Cursor | None,
           before: Cursor | None, limit: int, key: str, parts: Sequence[Any] = ()) -> Page:
    """Run ``stmt`` ordered by (time, id) descending, ``limit`` rows after/before a cursor.

    Fetches one row more than shown to know whether another page exists; the boundary row
    is never shown twice nor skipped (ties on time are broken by id). ``parts``: conditions
    that split ``stmt`` into disjoint pieces, each served by an index of its own; each piece
    is paged the same way and the pieces are merged.
    """
    limit = max(1, min(limit, MAX_PAGE))
    pieces = [stmt.where(c) for c in parts] if parts else [stmt]
    newest_first = before is None
    bound: ColumnElement[bool] | None = None
    if before is not None:
        bound = tuple_(time_col, id_col) > tuple_(literal(before.at, UTCDateTime()),
                                                  literal(before.id))
        order = (time_col.asc(), id_col.asc())
    else:
        if after is not None:
            bound = tuple_(time_col, id_col) < tuple_(literal(after.at, UTCDateTime()),
                                                      literal(after.id))
        order = (time_col.desc(), id_col.desc())
    got: list[Any] = []
    for piece in pieces:
        if bound is not None:
            piece = piece.where(bound)
        got += conn.execute(piece.order_by(*order).limit(limit + 1)).all()
    if len(pieces) > 1:
        got.sort(key=lambda r: (as_utc(r._mapping[key]), r._mapping["id"]),
                 reverse=newest_first)
        got = got[:limit + 1]
    if before is not None:
        more_newer = len(got) > limit
        rows = [row_dict(r) for r in reversed(got[:limit])]
        return Page(rows, _cursor(rows[-1], key) if rows else None,
                    _cursor(rows[0], key) if rows and more_newer else None)
    rows = [row_dict(r) for r in got[:limit]]
    return Page(rows, _cursor(rows[-1], key) if len(got) > limit else None,
                _cursor(rows[0], key) if rows and after is not None else None)


def _cursor(row: dict[str, Any], key: str) -> Cursor:
    return Cursor(row[key], int(row["id"]))
