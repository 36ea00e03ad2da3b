"""What an alert of the Overview is (shared by the Overview, the billing alerts and the
notifier's notices), and how an alert says a span of time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: The events list's endpoint: an alert's ``link`` to the events it counts.
EVENTS = "events.find"


@dataclass(frozen=True)
class Alert:
    level: str            # "critical" | "warning" | "info"
    title: str
    detail: str
    link: str | None = None       # a page's endpoint name (the events list: its events)
    params: dict[str, Any] = field(default_factory=dict)
    #: The action that fixes it: its words, endpoint and parameters.
    fix: str | None = None
    fix_link: str | None = None
    fix_params: dict[str, Any] = field(default_factory=dict)
    #: The alert's stable kind (``webapp.config.NOTIFY_KINDS`` for those sent to people) and
    #: how many rows it counts; not part of what is shown, so not compared.
    kind: str | None = field(default=None, compare=False)
    count: int | None = field(default=None, compare=False)


def human(seconds: float) -> str:
    """``3 h``, ``12 min``, ``40 s``: the largest whole unit."""
    seconds = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"
