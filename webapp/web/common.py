"""What every view shares: the app's services, the request's clock, signed previews,
rendering a page or its htmx fragment, and CSV downloads. (Parameters: ``params``.)"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from flask import (
    Response,
    abort,
    current_app,
    g,
    make_response,
    render_template,
    request,
)
from itsdangerous import BadSignature, URLSafeTimedSerializer

from ..services import Services, services_of
from .security import is_htmx

#: Every page template names its live part ``{% block fragment %}``.
FRAGMENT = "fragment"


def svc() -> Services:
    """The app's services."""
    return services_of(current_app)


def now() -> datetime:
    """The request's clock (one value per request, so every age on a page agrees)."""
    if "now" not in g:
        g.now = svc().clock()
    return g.now  # type: ignore[no-any-return]


# -- previews of bulk actions ---------------------------------------------------------------------

#: Seconds a bulk action's preview stays actionable.
SNAPSHOT_MAX_AGE = 3600


def _snapshots(salt: str) -> URLSafeTimedSerializer:
    return URLSafeTimedSerializer(current_app.config["SECRET_KEY"], salt=salt)


def sign_snapshot(salt: str, user_id: int, **content: Any) -> str:
    """A preview's ids and filters, signed for the person who saw it (the form's token): the
    action then applies to exactly what was shown, never to what matches by then."""
    return _snapshots(salt).dumps({**content, "uid": user_id})


def read_snapshot(salt: str, user_id: int, token: str) -> dict[str, Any]:
    """A form's signed preview (``params.SNAPSHOT``): 400 if forged, older than
    ``SNAPSHOT_MAX_AGE`` or another person's."""
    try:
        snap = _snapshots(salt).loads(token, max_age=SNAPSHOT_MAX_AGE)
    except BadSignature:
        abort(400, "This preview is invalid or older than an hour; preview again.")
    if not isinstance(snap, dict) or snap.get("uid") != user_id:
        abort(400, "This preview belongs to another user; preview again.")
    return snap


# -- rendering -------------------------------------------------------------------------------------

def render(template: str, *, status: int = 200, **context: Any) -> Response:
    """The full page, or for an htmx request only its ``fragment`` block — one URL for both,
    so the response varies on ``HX-Request``."""
    if is_htmx() and request.headers.get("HX-Boosted") != "true":
        html = render_block(template, FRAGMENT, context)
    else:
        html = render_template(template, **context)
    resp = make_response(html, status)
    resp.vary.add("HX-Request")
    return resp


def render_block(template_name: str, block: str, context: dict[str, Any]) -> str:
    """Render one ``{% block %}`` of a template with the app's usual context."""
    app = current_app
    ctx = dict(context)
    app.update_template_context(ctx)
    template = app.jinja_env.get_template(template_name)
    if block not in template.blocks:
        raise KeyError(f"{template_name} has no block {block!r}")
    return "".join(template.blocks[block](template.new_context(ctx)))


def csv_response(filename: str, header: list[str], rows: Iterable[Sequence[Any]],
                 preamble: Iterable[list[Any]] = ()) -> Response:
    """A streamed CSV download, safe to open in a spreadsheet (CSV injection, OWASP's rule):
    a text cell, and every part of it after a ``;``, ``,``, tab, CR or newline (where a
    spreadsheet may split a cell, as one set up for ``;`` splits ``Acme;=2+3``), that starts
    with ``=``, ``+``, ``-``, ``@``, tab or CR gets an apostrophe before it, so it is read as
    text, never run as a formula. Every text cell is quoted; numbers (``int``, ``float``,
    ``Decimal``) are written as they are. ``preamble`` rows (what the file is: a period, when
    it was made) come first, then one empty row, then the header: a spreadsheet shows them
    above the table, and a program skips to the first row after the empty one."""

    def generate() -> Iterator[str]:
        buf = io.StringIO()
        writer = csv.writer(buf, quoting=csv.QUOTE_NONNUMERIC)
        lead = [[_cell(v) for v in row] for row in preamble]
        if lead:
            writer.writerows(lead)
            writer.writerow([])
        writer.writerow([_cell(v) for v in header])
        for row in rows:
            writer.writerow([_cell(v) for v in row])
            if buf.tell() > 64 * 1024:
                yield buf.getvalue()
                buf.seek(0)
                buf.truncate()
        yield buf.getvalue()

    resp = Response(generate(), mimetype="text/csv")
    resp.headers["Content-Disposition"] = f'attachment; filename="{filename}"'
    return resp


#: A place a spreadsheet may start reading a formula: the cell's start or just after a
#: separator (``;``, ``,``, tab, CR, newline), followed by ``=``, ``+``, ``-``, ``@``, tab or
#: CR. The lookahead consumes nothing, so a run of separators is defused at each of them.
_FORMULA_START = re.compile(r"(^|[;,\t\r\n])(?=[=+\-@\t\r])")
_TRIGGERS = frozenset("=+-@\t\r")
_TRIGGER_AFTER_SEPARATOR = re.compile(r"[;,\t\r\n][=+\-@\t\r]")


def _cell(value: Any) -> Any:
    """One value as a CSV cell: numbers as they are, everything else as defused text."""
    kind = type(value)  # the exact types first: an export formats every cell of every row
    if kind is str:
        text = value
    elif value is None:
        return ""
    elif kind is int or kind is float or kind is Decimal:
        return value
    elif kind is datetime:
        # Starts with a digit and holds no separator; already UTC when read from a column.
        return (value if value.tzinfo is UTC else value.astimezone(UTC)).isoformat()
    elif isinstance(value, int | float | Decimal) and not isinstance(value, bool):
        return value
    elif isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    else:
        text = str(value)
    # Most cells need nothing: a test of the first character and one scan for a separator
    # followed by a trigger, instead of the lookahead at every separator (ids joined by
    # commas made the audit CSV 3× slower) or a substitution for every trigger anywhere
    # (``tenant-000042``, ``ops@example.com``: over a quarter of the audit CSV's formatting).
    if text[:1] in _TRIGGERS or _TRIGGER_AFTER_SEPARATOR.search(text):
        return _FORMULA_START.sub(r"\1'", text)
    return text
