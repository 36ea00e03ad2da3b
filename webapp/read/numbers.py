"""Numbers that people type or paste: only the ASCII digits 0-9 spell one.

Python is more generous than a page: ``"²".isdigit()`` is true yet ``int("²")`` raises, and
``int`` reads Arabic-Indic ``"٣"`` as 3, fullwidth ``"１２"`` as 12, and accepts ``"1_000"``
and blanks around the digits. Every number read from a request goes through
:func:`ascii_int`, so that what is a number here is what the dashboard writes as one, and
anything else is refused (a 400 naming the field) or read as text (the search box).
"""

from __future__ import annotations

import re

#: The largest id a 64-bit signed integer column holds.
MAX_ID = 2**63 - 1

_WHOLE = re.compile(r"-?[0-9]{1,19}")


def ascii_int(text: str) -> int | None:
    """The whole number ``text`` spells exactly (an optional ``-`` then 1 to 19 ASCII digits,
    nothing around them), else None. The caller checks the range: 19 digits can pass 2^63."""
    if not _WHOLE.fullmatch(text):
        return None
    return int(text)
