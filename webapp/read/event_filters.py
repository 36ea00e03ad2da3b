"""The events list's filters: what each means, how it travels in a query string, and the
chip that names it in plain words (with a link to the list without it)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from datetime import UTC, date, datetime
from typing import Any

from ..outbox.states import ALL_STATUSES

#: The date filters (UTC days, both ends included), in the words of their chips.
DATE_FILTERS = {"created_from": "created on or after", "created_to": "created on or before",
                "occurred_from": "occurred on or after", "occurred_to": "occurred on or before",
                "sent_from": "sent on or after", "sent_to": "sent on or before"}
#: A text filter's value for "has none" (``IS NULL``): the groups of errors have such a row.
NONE = "-"
#: Why an event died (``dead_letters.KINDS``), for the error groups of the dead-letter page.
WHY = {"unknown_past_window": "outcome unknown past the 24 h window",
       "exhausted": "retries exhausted", "permanent": "permanent error"}
AGES = {"near": "within 7 days of Stripe's 35-day limit", "over": "past Stripe's 35-day limit"}
#: Where an invoice line's events stand (``line`` with ``place``), in the words of the chip.
PLACES = {"ours": "Stripe took before the invoice finalized",
          "late": "reached Stripe after the invoice finalized, or not yet",
          "uncertain": "may have reached Stripe on either side of the finalization"}
#: Why usage lands on no invoice (``webapp.outbox.unbilled``), in words; ``any``: all of it.
UNBILLED = {"any": "on no invoice", "trial": "on no invoice: used in a trial",
            "paused": "on no invoice: the subscription was paused",
            "ended": "on no invoice: the subscription ended without a final invoice",
            "no_item": "on no invoice: no metered item on the meter"}
#: The ``source`` filter's values beside ``http:<token name>``: each producer door.
SOURCES = {"python": "Python (enqueue_usage)", "sql": "SQL (billing_outbox_enqueue)",
           "http": "the HTTP API (any token)"}


def source_words(source: str | None) -> str:
    """Where an event came from, in words (its ``source`` column; None: Python)."""
    if source is None:
        return SOURCES["python"]
    if source.startswith("http:"):
        return f"the HTTP API, token “{source[5:]}”"
    return SOURCES.get(source, source)


@dataclass(frozen=True)
class EventFilters:
    """The list's filters. Dates are UTC days, ``*_to`` inclusive; ``attempts_min`` and
    ``attempts_max`` bound ``attempt_count`` (equal for an exact count)."""

    status: tuple[str, ...] = ()
    tenant: str = ""
    customer: str = ""
    meter: str = ""
    created_from: date | None = None
    created_to: date | None = None
    occurred_from: date | None = None
    occurred_to: date | None = None
    sent_from: date | None = None
    sent_to: date | None = None
    due: bool = False
    age: str = ""
    code: str = ""
    error_class: str = ""
    http: str = ""
    why: str = ""
    reject_code: str = ""
    outcome: str = ""
    audit: tuple[int, ...] = ()
    attempts_min: int | None = None
    attempts_max: int | None = None
    request: str = ""  # a stream request's Idempotency-Key: the events it carried
    #: A billing period: occurred at or after ``period_start``, before ``period_end`` (Unix
    #: seconds; either open when None).
    period_start: int | None = None
    period_end: int | None = None
    report: str = ""  # a Stripe error report's id: the events its errors were traced to
    #: Where the events came from: ``python``, ``sql``, ``http`` or ``http:<token name>``.
    source: str = ""
    #: An invoice line, ``<invoice id>/<subscription item id>``, and where its events stand
    #: (:data:`PLACES`): the events behind one figure of the Invoices page.
    line: str = ""
    place: str = ""
    #: Usage on no invoice, by why (:data:`UNBILLED`).
    unbilled: str = ""

    def __post_init__(self) -> None:
        for s in self.status:
            if s not in ALL_STATUSES:
                raise ValueError(f"status must be one of {', '.join(ALL_STATUSES)}")
        if self.age and self.age not in AGES:
            raise ValueError(f"age must be one of {', '.join(AGES)}")
        if self.why and self.why not in WHY:
            raise ValueError(f"why must be one of {', '.join(WHY)}")
        if self.source and self.source not in SOURCES and not self.source.startswith("http:"):
            raise ValueError(f"source must be one of {', '.join(SOURCES)} or http:<token name>")
        if bool(self.line) != bool(self.place):
            raise ValueError("line and place go together")
        if self.line and self.line.count("/") != 1:
            raise ValueError("line must be <invoice id>/<subscription item id>")
        if self.place and self.place not in PLACES:
            raise ValueError(f"place must be one of {', '.join(PLACES)}")
        if self.unbilled and self.unbilled not in UNBILLED:
            raise ValueError(f"unbilled must be one of {', '.join(UNBILLED)}")

    def params(self) -> dict[str, Any]:
        """The filters in effect as query-string parameters (``url_for`` repeats a list)."""
        out: dict[str, Any] = {}
        if self.status:
            out["status"] = list(self.status)
        for name in ("tenant", "customer", "meter", "age", "code", "error_class", "http", "why",
                     "reject_code", "outcome", "request", "report", "source", "line", "place",
                     "unbilled"):
            if getattr(self, name):
                out[name] = getattr(self, name)
        for name in DATE_FILTERS:
            value = getattr(self, name)
            if value is not None:
                out[name] = value.isoformat()
        if self.due:
            out["due"] = "1"
        if self.audit:
            out["audit"] = [str(a) for a in self.audit]
        if self.attempts_min is not None or self.attempts_max is not None:
            out["attempts"] = attempts_text(self.attempts_min, self.attempts_max)
        if self.period_start is not None or self.period_end is not None:
            out["period"] = period_text(self.period_start, self.period_end)
        return out

    def is_empty(self) -> bool:
        return not self.params()

    def without(self, name: str, value: str | None = None) -> EventFilters:
        """These filters less one (``status`` less one of its values)."""
        if name == "status" and value is not None:
            return replace(self, status=tuple(s for s in self.status if s != value))
        if name == "audit" and value is not None:
            return replace(self, audit=tuple(a for a in self.audit if str(a) != value))
        if name == "attempts":
            return replace(self, attempts_min=None, attempts_max=None)
        if name == "period":
            return replace(self, period_start=None, period_end=None)
        if name == "line":
            return replace(self, line="", place="")
        default: Any = {f.name: f.default for f in fields(self)}[name]
        changes: dict[str, Any] = {name: default}
        return replace(self, **changes)

    def chips(self) -> list[Chip]:
        """Each filter in effect in plain words, with the parameters of the list without it."""
        out: list[Chip] = []

        def add(label: str, name: str, value: str | None = None) -> None:
            out.append(Chip(label, self.without(name, value).params()))

        for s in self.status:
            add(f"status is {s}", "status", s)
        if self.tenant:
            add(f"tenant {self.tenant}", "tenant")
        if self.customer:
            add(f"Stripe customer {self.customer}", "customer")
        if self.meter:
            add(f"meter {self.meter}", "meter")
        if self.source:
            add("from " + (SOURCES[self.source] if self.source in SOURCES
                           else source_words(self.source)), "source")
        for name, words in DATE_FILTERS.items():
            value = getattr(self, name)
            if value is not None:
                add(f"{words} {value.isoformat()} (UTC)", name)
        if self.due:
            add("next attempt due now", "due")
        if self.age:
            add(AGES[self.age], "age")
        for name, words in (("code", "last error code"), ("error_class", "last error class"),
                            ("http", "last HTTP status"),
                            ("reject_code", "Stripe's rejection code"),
                            ("request", "carried by stream request"),
                            ("report", "found from Stripe's report")):
            value = getattr(self, name)
            if value:
                add(f"no {words}" if value == NONE else f"{words} {value}", name)
        if self.why:
            add(f"dead because: {WHY[self.why]}", "why")
        if self.outcome:
            add(f"last outcome {self.outcome}", "outcome")
        for a in self.audit:
            add(f"touched by audit entry #{a}", "audit", str(a))
        if self.attempts_min is not None or self.attempts_max is not None:
            lo, hi = self.attempts_min, self.attempts_max
            words = (f"exactly {lo} attempt{'s' if lo != 1 else ''}" if lo == hi else
                     f"at least {lo} attempts" if hi is None else
                     f"at most {hi} attempts" if lo is None else f"{lo} to {hi} attempts")
            add(words, "attempts")
        if self.period_start is not None or self.period_end is not None:
            add("occurred in the billing period " + period_words(self.period_start,
                                                                  self.period_end), "period")
        if self.line:
            add(f"on the line of invoice {self.line.split('/')[0]}: {PLACES[self.place]}",
                "line")
        if self.unbilled:
            add(UNBILLED[self.unbilled], "unbilled")
        return out


@dataclass(frozen=True)
class Chip:
    """One filter in effect: its words, and the list's parameters without it."""

    label: str
    without: dict[str, Any]


def period_text(start: int | None, end: int | None) -> str:
    """A period as its query-string value: ``START-END`` in Unix seconds (either open)."""
    return f"{'' if start is None else start}-{'' if end is None else end}"


def period_words(start: int | None, end: int | None) -> str:
    """``2026-11-01 00:00 to 2026-12-01 00:00 (UTC)``."""
    def at(value: int | None) -> str:
        return "…" if value is None else datetime.fromtimestamp(value, UTC).strftime(
            "%Y-%m-%d %H:%M")
    return f"{at(start)} to {at(end)} (UTC)"


def attempts_text(low: int | None, high: int | None) -> str:
    """``3``, ``3-5``, ``3-`` or ``-5``: the ``attempts`` parameter for a range."""
    if low is not None and low == high:
        return str(low)
    return f"{'' if low is None else low}-{'' if high is None else high}"
