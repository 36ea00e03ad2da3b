"""How a request's input reaches the fields of :mod:`webapp.web.params`: query strings and
url-encoded forms decoded so that bytes that are not UTF-8 arrive as U+FFFD (for the fields
to refuse), and the URL converters for path parts, ``<id:…>`` (a positive 64-bit integer) and
``<tenant:…>`` (a tenant id); anything else in a path is a 404. :func:`init_app` installs
them before any blueprint's rules.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, quote

from flask import Flask, Request
from werkzeug.datastructures import MultiDict
from werkzeug.formparser import FormDataParser
from werkzeug.routing import BaseConverter, PathConverter, ValidationError
from werkzeug.utils import cached_property

from .params import MAX_ID, TENANT_MAX, text_problem

#: What ``full_path`` leaves as it is in a query string (everything ASCII that is printable).
_QUERY_SAFE = "".join(chr(c) for c in range(33, 127))


def _decode_pairs(raw: bytes) -> list[tuple[str, str]]:
    """``a=1&b=2`` as pairs; bytes that are not UTF-8, escaped or raw, become U+FFFD."""
    return parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True, errors="replace")


class _FormParser(FormDataParser):
    def _parse_urlencoded(self, stream: Any, mimetype: str, content_length: int | None,
                          options: dict[str, str]) -> Any:
        # The stream is already limited to MAX_CONTENT_LENGTH (as in Werkzeug's own).
        return stream, self.cls(_decode_pairs(stream.read())), self.cls()


class InputRequest(Request):
    """Flask's request, with query strings and url-encoded forms decoded so that bytes that
    are not UTF-8 arrive as U+FFFD (multipart fields already do), for the fields to refuse."""

    form_data_parser_class = _FormParser

    @cached_property
    def args(self) -> MultiDict[str, str]:
        return self.parameter_storage_class(_decode_pairs(self.query_string))

    @property
    def full_path(self) -> str:
        """The path and query string, with bytes that are not ASCII percent-encoded
        (Werkzeug's decodes them strictly: raw bad bytes raised, a 500)."""
        return f"{self.path}?{quote(self.query_string, safe=_QUERY_SAFE)}"


# -- path parts ----------------------------------------------------------------------------------

class IdConverter(BaseConverter):
    """``<id:name>``: a positive 64-bit integer id; anything else (past 2^63 too) is a 404."""

    regex = r"[0-9]{1,19}"
    weight = 50
    part_isolating = True

    def to_python(self, value: str) -> int:
        number = int(value)
        if not 1 <= number <= MAX_ID:
            raise ValidationError()
        return number

    def to_url(self, value: Any) -> str:
        return str(int(value))


class TenantConverter(PathConverter):
    """``<tenant:name>``: a tenant id (slashes allowed) of at most :data:`TENANT_MAX`
    characters without control characters or bad UTF-8; anything else is a 404."""

    def to_python(self, value: str) -> str:
        if len(value) > TENANT_MAX or text_problem(value) is not None:
            raise ValidationError()
        return value


def init_app(app: Flask) -> None:
    """Install the request class and the converters (before any blueprint's rules)."""
    app.request_class = InputRequest
    app.url_map.converters["id"] = IdConverter
    app.url_map.converters["tenant"] = TenantConverter
