"""Fitting outside text to the columns it is stored in, so that storing it never fails.

Stripe's answers (codes, messages, request ids, headers, error reports, meter listings) are
written to columns with a length limit. A value longer than its column, a NUL character
(PostgreSQL refuses it in text) or a lone surrogate (from a JSON ``\\ud800`` escape; neither
database driver can encode it) would make the write fail, and with it the recording of an
outcome: the event would stay ``processing`` and be sent again and again. Every writer of such
values goes through :func:`fit` (free text: keep the start) or :func:`fit_key` /
:func:`fits` (identifiers that are keys: never cut silently).

Lengths are read from the column's own type, never repeated by hand: ``String(n)`` holds ``n``
characters (PostgreSQL's ``varchar(n)`` counts characters, as Python's ``len`` does). ``Text``
is unbounded in the database but bounded here to :data:`TEXT_LIMIT` characters, so a 10 MB
message cannot bloat a row; a column may say otherwise with ``info={"max_chars": n}``.
Integer columns clamp to the range their type holds.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import BigInteger, Column, Integer, String
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeDecorator, TypeEngine

#: What a ``Text`` column keeps of a value, unless its ``info["max_chars"]`` says otherwise.
TEXT_LIMIT = 2000
#: Characters of a digest appended to a key that had to be shortened (see :func:`fit_key`).
KEY_DIGEST_CHARS = 16
#: What replaces a character neither database can store (NUL, a lone surrogate).
REPLACEMENT = "\ufffd"
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)

AnyColumn = Column[Any] | ColumnElement[Any]


def _type_of(column: AnyColumn) -> TypeEngine[Any]:
    kind: TypeEngine[Any] = column.type
    while isinstance(kind, TypeDecorator):
        kind = kind.impl_instance
    return kind


def limit_of(column: AnyColumn) -> int:
    """How many characters ``column`` keeps: its ``String(n)`` length, else its
    ``info["max_chars"]``, else :data:`TEXT_LIMIT`. Raises ``TypeError`` for a column that
    does not hold text."""
    kind = _type_of(column)
    if not isinstance(kind, String):
        raise TypeError(f"{column} does not hold text")
    info = getattr(column, "info", None) or {}
    if kind.length is not None:
        return int(kind.length)
    return int(info.get("max_chars", TEXT_LIMIT))


def clean(text: str) -> str:
    """``text`` with the characters no database here can store (NUL, lone surrogates)
    replaced by U+FFFD; the same string when there are none (the common case, cheaply)."""
    if text.isascii():
        return text.replace("\x00", REPLACEMENT) if "\x00" in text else text
    if "\x00" in text:
        text = text.replace("\x00", REPLACEMENT)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = "".join(REPLACEMENT if "\ud800" <= ch <= "\udfff" else ch for ch in text)
    return text


def fit(column: AnyColumn, value: object) -> Any:
    """``value`` as ``column`` can always store it. Text (a ``str``, or anything else, turned
    into one) is cleaned (:func:`clean`) and cut to the column's limit, keeping the start;
    an integer is clamped to the column's range; None stays None."""
    if value is None:
        return None
    kind = _type_of(column)
    if isinstance(kind, Integer):
        low, high = _INT64 if isinstance(kind, BigInteger) else _INT32
        try:
            number = int(value)  # type: ignore[call-overload]
        except (TypeError, ValueError, OverflowError):
            return 0
        return min(max(number, low), high)
    text = value if isinstance(value, str) else str(value)
    return clean(text)[:limit_of(column)]


def fits(column: AnyColumn, value: str) -> bool:
    """Whether ``value`` is stored in ``column`` exactly as it is (for identifiers that must
    not be cut: a meter's id or payload keys, a customer id)."""
    return len(value) <= limit_of(column) and clean(value) == value


def fit_key(column: AnyColumn, value: str) -> str:
    """An identifier as a key column stores it: itself when it fits; otherwise its start
    followed by ``~`` and a digest of the whole value, to the column's length.

    Cutting a key to its start could make two distinct values one (the second would then be
    taken for the first: a report stored once by its id would never be applied). With the
    digest, distinct values stay distinct and the same value always maps to the same key, so
    lookups go through this function too. Stripe's ids are far shorter than our columns: only
    a poisoned answer takes this path."""
    if fits(column, value):
        return value
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()
    keep = limit_of(column) - KEY_DIGEST_CHARS - 1
    return f"{clean(value)[:keep]}~{digest[:KEY_DIGEST_CHARS]}"


def fit_json_list(column: AnyColumn, items: Sequence[str], *, item_limit: int = 500) -> str:
    """A JSON list of texts that ``column`` stores whole and that still parses: each item
    cleaned and cut to ``item_limit`` characters, and as many items as fit, the rest counted
    in a last item (``"… and 3 more"``)."""
    limit = limit_of(column)
    kept: list[str] = []
    for i, item in enumerate(items):
        piece = clean(str(item))[:item_limit]
        left = len(items) - i - 1
        # Room is left for the count of the rest, so that the count always fits after it.
        probe = [*kept, piece] + ([f"… and {left} more"] if left else [])
        if len(json.dumps(probe)) > limit:
            kept.append(f"… and {len(items) - i} more")
            break
        kept.append(piece)
    return json.dumps(kept)
