"""The one input layer: every query parameter and form field a view reads is a typed
:class:`Field` listed in the view's :func:`accepts`, and parsed before the view runs. A bad
value answers 400 naming the field (a page, or for htmx a fragment, through ``errors``); the
view only ever sees values of the declared type and range.

Declared once per view, the fields are also the registry the fuzz test enumerates
(``view.accepts``), and :meth:`Field.get` refuses a field its view did not declare.

What every field refuses: bytes that are not UTF-8 (decoded to U+FFFD by
:class:`webapp.web.request_input.InputRequest` — Werkzeug itself keeps them percent-encoded,
indistinguishable from a typed ``%FF`` — so a real U+FFFD is refused too: no field here has a
use for it), NUL, and other control characters (a multi-line field allows line breaks and
tabs). Numbers are ASCII digits within a 64-bit signed integer and the field's own range; dates
are ``YYYY-MM-DD`` from :data:`EARLIEST` to :data:`LATEST`.

The request class that decodes them and the URL converters for path parts are in
:mod:`webapp.web.request_input`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from datetime import date
from functools import wraps
from typing import Any, Generic, Literal, TypeVar, overload

from flask import g, request
from werkzeug.exceptions import BadRequest

from ..outbox.ids import TEXT_LIMIT
from ..read.numbers import MAX_ID as MAX_ID  # re-exported: the views' id fields use it
from ..read.numbers import ascii_int
from ..read.paging import Cursor
from ..read.series import DEFAULT_RANGE, RANGES

V = TypeVar("V")
F = TypeVar("F", bound=Callable[..., Any])

#: The dates a filter may name (the datetimes built from them stay far from year 1 and 9999).
EARLIEST = date(2000, 1, 1)
LATEST = date(2100, 12, 31)
#: The longest tenant id (enqueue's rule: ``webapp.outbox.ids``).
TENANT_MAX = TEXT_LIMIT

Source = Literal["query", "form", "either"]

_DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_MULTILINE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


class InvalidParameter(BadRequest):
    """A query parameter or form field with a bad value: 400, naming the field."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"The field “{name}” {problem}.")
        self.field = name


def text_problem(value: str, *, multiline: bool = False) -> str | None:
    """Why ``value`` is not acceptable text (bad UTF-8, NUL, a control character), or None."""
    if "\ufffd" in value:
        return "is not valid UTF-8"
    if "\x00" in value:
        return "contains a NUL character"
    if (_CONTROL_MULTILINE if multiline else _CONTROL).search(value):
        return "contains a control character" + ("" if multiline else " (a line break, a tab…)")
    return None


class Field(Generic[V]):
    """One parameter: its name, where it comes from, and how its text becomes a value.
    Missing or blank means the default."""

    def __init__(self, name: str, *, source: Source = "query", default: Any = None) -> None:
        self.name = name
        self.source: Source = source
        self.default = default

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, source={self.source!r})"

    def raw(self) -> list[str]:
        """Every value the request carries for this field, as Werkzeug decoded them."""
        if self.source == "query":
            return request.args.getlist(self.name)
        if self.source == "form":
            return request.form.getlist(self.name)
        return request.values.getlist(self.name)

    def parse(self) -> V:
        """The field's value in this request (its first one); raises ``InvalidParameter``."""
        values = self.raw()
        raw = values[0] if values else ""
        if raw.strip() == "":
            return self.default  # type: ignore[no-any-return]
        return self.convert(raw)

    def convert(self, raw: str) -> V:
        raise NotImplementedError

    def refuse(self, problem: str) -> InvalidParameter:
        return InvalidParameter(self.name, problem)

    def clean(self, raw: str, *, max_len: int, multiline: bool = False,
              strip: bool = True) -> str:
        value = raw.strip() if strip else raw
        if len(value) > max_len:
            raise self.refuse(f"is longer than {max_len:,} characters")
        problem = text_problem(value, multiline=multiline)
        if problem:
            raise self.refuse(problem)
        return value

    def get(self) -> V:
        """The value :func:`accepts` parsed for this request (only for declared fields)."""
        parsed: dict[Field[Any], Any] | None = g.get("params")
        if parsed is None or self not in parsed:
            raise RuntimeError(f"{self!r} is read but not declared in the view's @accepts")
        return parsed[self]  # type: ignore[no-any-return]


class Text(Field[str]):
    """Text of at most ``max_len`` characters, stripped unless ``strip=False``; optionally one
    of ``choices`` or matching ``pattern`` (whole). One line unless ``multiline``."""

    def __init__(self, name: str, max_len: int, *, source: Source = "query", default: str = "",
                 choices: Collection[str] | None = None, pattern: str | None = None,
                 multiline: bool = False, strip: bool = True) -> None:
        super().__init__(name, source=source, default=default)
        self.max_len = max_len
        self.choices = None if choices is None else tuple(choices)
        self.pattern = None if pattern is None else re.compile(pattern)
        self.multiline = multiline
        self.strip = strip

    def parse(self) -> str:
        values = self.raw()
        raw = values[0] if values else ""
        if (raw.strip() if self.strip else raw) == "":
            return self.default  # type: ignore[no-any-return]
        return self.convert(raw)

    def convert(self, raw: str) -> str:
        value = self.clean(raw, max_len=self.max_len, multiline=self.multiline,
                           strip=self.strip)
        if self.choices is not None and value not in self.choices:
            shown = ", ".join(c for c in self.choices if c)
            raise self.refuse(f"must be one of: {shown}")
        if self.pattern is not None and not self.pattern.fullmatch(value):
            raise self.refuse("has characters it cannot contain")
        return value


def whole_number(field: Field[Any], raw: str, low: int, high: int, clamp: bool = False) -> int:
    """``raw`` as a whole number (ASCII digits) from ``low`` to ``high``; ``clamp``: a number
    outside the range (but within 64 bits) is moved into it rather than refused."""
    value = ascii_int(raw.strip())
    if value is not None:
        if clamp and -MAX_ID - 1 <= value <= MAX_ID:
            return max(low, min(high, value))
        if low <= value <= high:
            return value
    raise field.refuse(f"must be a whole number from {low:,} to {high:,}")


class Int(Field[V]):
    """A whole number from ``low`` to ``high``, both within a 64-bit signed integer.
    ``clamp``: a number outside the range is moved into it rather than refused."""

    @overload
    def __init__(self: Int[int], name: str, low: int, high: int, *, default: int,
                 source: Source = ..., clamp: bool = ...) -> None: ...

    @overload
    def __init__(self: Int[int | None], name: str, low: int, high: int, *,
                 default: None = ..., source: Source = ..., clamp: bool = ...) -> None: ...

    def __init__(self, name: str, low: int, high: int, *, default: int | None = None,
                 source: Source = "query", clamp: bool = False) -> None:
        if not -MAX_ID - 1 <= low <= high <= MAX_ID:
            raise ValueError("the range must fit a 64-bit signed integer")
        super().__init__(name, source=source, default=default)
        self.low, self.high, self.clamp = low, high, clamp

    def convert(self, raw: str) -> V:
        return whole_number(self, raw, self.low, self.high,  # type: ignore[return-value]
                            self.clamp)


class Ids(Field[list[int]]):
    """A list of ids (the field repeated, e.g. ticked checkboxes), at most ``max_count`` of
    them; blank entries are skipped."""

    def __init__(self, name: str, *, max_count: int, source: Source = "form") -> None:
        super().__init__(name, source=source, default=[])
        self.max_count = max_count

    def parse(self) -> list[int]:
        values = [v for v in self.raw() if v.strip()]
        if len(values) > self.max_count:
            raise self.refuse(f"lists more than {self.max_count:,} ids")
        return [whole_number(self, v, 1, MAX_ID) for v in values]


class Choices(Field[tuple[str, ...]]):
    """A repeatable field whose every value is one of ``choices`` (at most ``max_count``
    values; blank ones skipped, repeats kept once, in the order of ``choices``)."""

    def __init__(self, name: str, choices: Collection[str], *, max_count: int = 20,
                 source: Source = "query") -> None:
        super().__init__(name, source=source, default=())
        self.choices = tuple(choices)
        self.max_count = max_count

    def parse(self) -> tuple[str, ...]:
        values = [v.strip() for v in self.raw() if v.strip()]
        if len(values) > self.max_count:
            raise self.refuse(f"is given more than {self.max_count} times")
        for v in values:
            if v not in self.choices:
                raise self.refuse(f"must be one of: {', '.join(self.choices)}")
        return tuple(c for c in self.choices if c in values)


_RANGE = re.compile(r"([0-9]{1,12})?(-([0-9]{1,12})?)?")


class IntRange(Field[tuple[int | None, int | None] | None]):
    """A whole number (``3``) or a range (``3-5``, ``3-``, ``-5``) from ``low`` to ``high``:
    (lowest, highest), either None when open."""

    def __init__(self, name: str, low: int, high: int, *, source: Source = "query") -> None:
        super().__init__(name, source=source, default=None)
        self.low, self.high = low, high

    def convert(self, raw: str) -> tuple[int | None, int | None]:
        text = raw.strip()
        found = _RANGE.fullmatch(text)
        problem = (f"must be a whole number from {self.low:,} to {self.high:,}, or a range "
                   "like 2-5")
        if not found or text == "-":
            raise self.refuse(problem)
        lo = int(found.group(1)) if found.group(1) else None
        hi = (int(found.group(3)) if found.group(3) else None) if found.group(2) else lo
        for v in (lo, hi):
            if v is not None and not self.low <= v <= self.high:
                raise self.refuse(problem)
        if lo is not None and hi is not None and lo > hi:
            raise self.refuse("must be a range from the lower number to the higher")
        return lo, hi


class Day(Field[date | None]):
    """A date ``YYYY-MM-DD`` from :data:`EARLIEST` to :data:`LATEST`."""

    def convert(self, raw: str) -> date:
        text = raw.strip()
        try:
            if not _DAY.fullmatch(text):
                raise ValueError(text)
            value = date.fromisoformat(text)
        except ValueError:
            raise self.refuse("must be a date like 2026-01-31") from None
        if not EARLIEST <= value <= LATEST:
            raise self.refuse(f"must be a date from {EARLIEST} to {LATEST}")
        return value


class Position(Field[Cursor | None]):
    """A keyset page position (``Cursor``): a time with its zone and an id, both in range."""

    def convert(self, raw: str) -> Cursor:
        text = self.clean(raw, max_len=80)
        try:
            cursor = Cursor.decode(text)
        except (ValueError, OverflowError):
            raise self.refuse("is not a valid page position") from None
        if not (EARLIEST.year <= cursor.at.year <= LATEST.year and 0 <= cursor.id <= MAX_ID):
            raise self.refuse("is not a valid page position")
        return cursor


class Flag(Field[bool]):
    """A checkbox or hidden switch: ``on`` (its value) or absent; anything else is refused."""

    def __init__(self, name: str, on: str = "yes", *, source: Source = "form") -> None:
        super().__init__(name, source=source, default=False)
        self.on = on

    def convert(self, raw: str) -> bool:
        if raw.strip() != self.on:
            raise self.refuse(f"must be {self.on!r} or absent")
        return True


class Upload(Field[tuple[str, str] | None]):
    """A file of a multipart form: (its file name, its text), UTF-8 (a BOM dropped), at most
    ``max_bytes``; None when no file was chosen."""

    def __init__(self, name: str, max_bytes: int) -> None:
        super().__init__(name, source="form", default=None)
        self.max_bytes = max_bytes

    def parse(self) -> tuple[str, str] | None:
        file = request.files.get(self.name)
        if file is None or not file.filename:
            return None
        data = file.stream.read(self.max_bytes + 1)
        if len(data) > self.max_bytes:
            raise self.refuse(f"is a file larger than {self.max_bytes // 1024:,} KB")
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise self.refuse("is not UTF-8 text; save it as CSV UTF-8 and try again") from None
        if "\x00" in text:
            raise self.refuse("contains a NUL character: it is not a CSV file")
        return self.clean(file.filename, max_len=255), text


def accepts(*fields: Field[Any]) -> Callable[[F], F]:
    """Decorate a view (below ``require_role``): parse ``fields`` before it runs — 400 naming
    the first bad one — for :meth:`Field.get`; ``view.accepts`` lists them."""
    seen = [(f.source, f.name) for f in fields]
    if len(set(seen)) != len(seen):
        raise ValueError(f"a field is declared twice: {seen}")

    def decorate(view: F) -> F:
        @wraps(view)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            g.params = {f: f.parse() for f in fields}
            return view(*args, **kwargs)

        wrapped.accepts = fields  # type: ignore[attr-defined]
        return wrapped  # type: ignore[return-value]

    return decorate


def declared(view: Callable[..., Any]) -> Sequence[Field[Any]]:
    """The fields a view declared (none for a view without :func:`accepts`)."""
    return tuple(getattr(view, "accepts", ()))


# -- fields several views share ------------------------------------------------------------------

def page_fields(default_limit: int, max_limit: int) -> tuple[Int[int], Position, Position]:
    """``limit`` (clamped into 1…``max_limit``), ``after`` and ``before``: a keyset page."""
    return (Int("limit", 1, max_limit, default=default_limit, clamp=True),
            Position("after"), Position("before"))


#: Where a form sends the person back to (a path on this site; ``safe_next`` checks it).
NEXT = Text("next", 2000, source="form")
#: A resolve or cancel reason code (the operation checks it is one it knows).
REASON = Text("reason", 40, source="form", pattern=r"[a-z_]*")
#: The note a person writes with an action.
NOTE = Text("note", 2000, source="form", multiline=True)
#: The signed preview of a bulk action (``common.read_snapshot`` checks it).
SNAPSHOT = Text("snapshot", 1_000_000, source="form", pattern=r"[A-Za-z0-9_.\-]*")
#: The session's CSRF token in a posted form (``security`` checks every POST for it).
CSRF_TOKEN = Text("csrf_token", 200, source="form")
#: A chart's time range (``1h``, ``24h``, ``7d``, ``30d``); live panels carry it on.
CHART_RANGE = Text("range", 5, choices=RANGES, default=DEFAULT_RANGE)
