"""Which of our events an error report's sample is about when it names a meter event stream
request rather than an event.

Stripe's error reports sample the events they refused, each by ``request.identifier``: an
event's identifier (as Stripe's example shows) or, as the SDK documents the field, "the request
idempotency key". A v1 call's key is its event's identifier (or that and a retry suffix), so
either reading names the event. A stream request carries up to 100 events under one key of the
project's own (``webapp.stripe_gateway.stream.request_key``), kept with the events it carried
(``stripe_stream_requests``): a sample naming it says that *one* of them was refused. What
else Stripe said singles events out, and only what singles them out is acted on:

- the report's meter (its events of other meters were not refused by it);
- a customer, or an event's identifier, that the sample's message names;
- the code: a customer Stripe does not have or has deleted (asked of Stripe, for
  ``meter_event_customer_not_found``) refuses every event sent to it; a meter Stripe does not
  have (``no_meter``, ``archived_meter``), or a payload without the meter's customer key
  (``meter_event_no_customer_defined``: every event of one meter is built with the same keys),
  refuses every event of that meter; a timestamp more than 35 days before the request, or more
  than 5 minutes after it, refuses the events stamped so;
- one event left, and nothing else the request carried (requeued since, or pruned) that the
  sample could be about: that one.

Otherwise nothing is marked: the events it could be are shown to a person ("one of these N was
refused"). Nothing is rejected on a guess.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, select

from .customers import CustomerCheck
from .sql import STREAM_REQUESTS, as_utc

CUSTOMER_NOT_FOUND = "meter_event_customer_not_found"
NO_CUSTOMER_DEFINED = "meter_event_no_customer_defined"
#: Codes about the event's customer.
CUSTOMER_CODES = frozenset({CUSTOMER_NOT_FOUND, NO_CUSTOMER_DEFINED})
#: Stripe's codes that mean the meter itself is missing.
METER_CODES = frozenset({"no_meter", "archived_meter"})
TOO_OLD, IN_FUTURE = "timestamp_too_far_in_past", "timestamp_in_future"
#: How far from the moment Stripe received it an event's timestamp may be.
MAX_AGE, MAX_AHEAD = timedelta(days=35), timedelta(minutes=5)

#: How a rejection was traced to its event (``stripe_usage_outbox.reject_found_by``).
BY_SAMPLE, BY_REQUEST, BY_CUSTOMER = "sample", "request", "customer"


def identifier_tag(identifier: str) -> str:
    """Eight hex digits standing for an identifier (CRC-32), kept beside an event's id in
    the record of a stream request: a report naming the request is about the identifier the
    event had then, and an event requeued since under a new one no longer matches it."""
    return f"{zlib.crc32(identifier.encode()):08x}"


@dataclass(frozen=True)
class Carried:
    """One event as a stream request carried it: its id, and the tag of the identifier it
    went by then (:func:`~webapp.outbox.states.identifier_tag`)."""

    event_id: int
    tag: str


@dataclass(frozen=True)
class StreamRequestRecord:
    """One stream request that may have left its events at Stripe."""

    key: str
    sent_at: datetime
    stripe_request_id: str | None
    events: tuple[Carried, ...]


def parse_carried(text: str) -> tuple[Carried, ...]:
    """``stripe_stream_requests.event_ids`` (``"12:1a2b3c4d,13:…"``) as :class:`Carried`."""
    out = []
    for part in text.split(","):
        event_id, _, tag = part.partition(":")
        if event_id.strip().isascii() and event_id.strip().isdigit():
            out.append(Carried(int(event_id), tag.strip()))
    return tuple(out)


def requests_named(conn: Connection, keys: Iterable[str]) -> dict[str, StreamRequestRecord]:
    """The stream requests these keys are the ``Idempotency-Key`` of, by key."""
    wanted = sorted({k for k in keys if k})
    found: dict[str, StreamRequestRecord] = {}
    R = STREAM_REQUESTS.c
    for i in range(0, len(wanted), 500):
        for r in conn.execute(select(R.idempotency_key, R.sent_at, R.stripe_request_id,
                                     R.event_ids).where(R.idempotency_key.in_(wanted[i:i + 500]))):
            sent_at = as_utc(r.sent_at)
            assert sent_at is not None
            found[r.idempotency_key] = StreamRequestRecord(
                r.idempotency_key, sent_at, r.stripe_request_id, parse_carried(r.event_ids))
    return found


def request_event_ids(conn: Connection, key: str) -> list[int]:
    """The ids of the events the stream request of this key carried (none if unknown)."""
    found = requests_named(conn, [key]).get(key)
    return sorted({c.event_id for c in found.events}) if found is not None else []


@dataclass(frozen=True)
class Traced:
    """What a sample naming a stream request is about: ``events`` singled out (each refused),
    with how (``found_by``); or, when nothing singles one out, the ``candidates`` it may be.
    ``stale``: every event the request carried has been requeued under a new identifier since
    (the sample is about what they were)."""

    events: list[Any] = field(default_factory=list)
    found_by: str = BY_REQUEST
    candidates: list[Any] = field(default_factory=list)
    stale: bool = False


def single_out(code: str | None, message: str | None, request: StreamRequestRecord,
               events: Mapping[int, Any], *, meter: str | None,
               customers: Mapping[str, CustomerCheck]) -> Traced:
    """The events of ``request`` that a sample (``code``, ``message``) naming it refused.

    ``events``: the outbox rows by id (``id``, ``sent_as``, ``meter``,
    ``stripe_customer_id``, ``occurred_at``); ``meter``: the event name of the report's
    meter, when known; ``customers``: Stripe's answers about customers, when asked. An event
    requeued since under another identifier is no longer the one the request carried.
    """
    cands = [events[c.event_id] for c in request.events
             if c.event_id in events and identifier_tag(events[c.event_id].sent_as) == c.tag]
    if not cands:
        return Traced(stale=any(c.event_id in events for c in request.events))
    # What the request carried that is no longer here as it was (requeued under a new
    # identifier, or pruned): the sample may be about one of those, so "one left" proves
    # nothing while any of them could be it.
    gone = [events.get(c.event_id) for c in request.events
            if c.event_id not in events or identifier_tag(events[c.event_id].sent_as) != c.tag]
    rivals = [e for e in gone if e is None or meter is None or e.meter == meter]
    if meter is not None:
        cands = [e for e in cands if e.meter == meter]
    text = message or ""
    named = {e.stripe_customer_id for e in cands if _names(text, e.stripe_customer_id)}
    if named:
        cands = [e for e in cands if e.stripe_customer_id in named]
    by_id = [e for e in cands if _names(text, e.sent_as)]
    if len(by_id) == 1:
        return Traced(by_id)
    if len({e.meter for e in cands}) > 1:
        cands = [e for e in cands if _names(text, e.meter)] or cands
    if code == CUSTOMER_NOT_FOUND:
        if len(named) == 1:
            return Traced(cands)  # the customer it names: all of its events were refused
        refused = [e for e in cands if not _exists(customers.get(e.stripe_customer_id))]
        if refused:
            return Traced(refused, BY_CUSTOMER)
    elif code in METER_CODES or code == NO_CUSTOMER_DEFINED:
        if len({e.meter for e in cands}) == 1:
            return Traced(cands)  # every event of one meter was built alike
    elif code == TOO_OLD:
        old = [e for e in cands if _at(e) < request.sent_at - MAX_AGE]
        if old:
            return Traced(old)
    elif code == IN_FUTURE:
        ahead = [e for e in cands if _at(e) > request.sent_at + MAX_AHEAD]
        if ahead:
            return Traced(ahead)
    if len(cands) == 1 and not rivals:
        return Traced(cands)
    return Traced(candidates=cands)


def customers_in_question(message: str | None, request: StreamRequestRecord,
                          events: Mapping[int, Any], meter: str | None) -> set[str]:
    """The customers Stripe must be asked about to single out the events of ``request`` that
    a ``meter_event_customer_not_found`` sample (``message``) is about: those of its events
    (of ``meter`` when known), unless the message names one of them."""
    found = {str(e.stripe_customer_id) for e in (events.get(c.event_id) for c in request.events)
             if e is not None and e.stripe_customer_id and (meter is None or e.meter == meter)}
    if any(_names(message or "", c) for c in found):
        return set()
    return found


def _at(event: Any) -> datetime:
    at = as_utc(event.occurred_at)
    assert at is not None
    return at


def _exists(check: CustomerCheck | None) -> bool:
    """Not known not to exist: a customer Stripe was not asked about counts as existing."""
    return check is None or check.exists


def _names(text: str, value: str | None) -> bool:
    """Whether ``text`` names ``value`` as a whole word (``cus_a`` is not in ``cus_ab``)."""
    if not value or not text:
        return False
    return re.search(rf"(?<![\w-]){re.escape(value)}(?![\w-])", text) is not None
