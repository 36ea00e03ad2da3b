"""Stripe's events (API v2), as it produces them for meter errors it finds after its 200:
``v1.billing.meter.error_report_triggered`` per meter with *sample* errors (fewer than
``error_count``), ``GET /v2/core/events`` (thin, paginated by ``next_page_url``),
``GET /v2/core/events/{id}`` (in full), and signed pushes to an event destination. The invoice
events (``subscriptions.py``) are kept and pushed the same way
(:meth:`ReportsMixin._record_events_locked`, :meth:`ReportsMixin._push_later`)."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import threading
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs

from .http import Response, error, invalid, ok
from .meter_events import AsyncError, FakeMeter

_log = logging.getLogger("tests.support.fake_stripe")

ERROR_REPORT = "v1.billing.meter.error_report_triggered"
NO_METER_FOUND = "v1.billing.meter.no_meter_found"


def _rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def signature_header(body: bytes, secret: str, timestamp: int) -> str:
    """``Stripe-Signature``: ``t=<unix>,v1=<hex HMAC-SHA256 of "<t>.<body>">``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


class ReportsMixin:
    """Error reports and the v2 event API of :class:`FakeStripe` (which holds the state)."""

    _lock: threading.Lock
    _clock: Callable[[], float]
    _meters: dict[str, FakeMeter]
    _pending_errors: list[AsyncError]
    _events: dict[str, dict[str, Any]]
    page_cap: int
    sample_limit: int
    #: Stripe's order of ``GET /v2/core/events`` is not documented: either is served.
    events_newest_first: bool
    _webhook: tuple[str, str] | None

    def flush_reports(self) -> list[str]:
        """Report the errors found since the last flush: one ``error_report_triggered`` event
        per meter, its errors grouped by code, at most ``sample_limit`` samples per code.
        Returns the new events' ids (and pushes them, when a destination is set)."""
        with self._lock:
            pending, self._pending_errors = self._pending_errors, []
        by_meter: dict[str, list[AsyncError]] = defaultdict(list)
        for err in pending:
            by_meter[err.event_name].append(err)
        with self._lock:
            missing = {name for name in by_meter if name not in self._meters}
        # An event for a meter that does not exist (only a stream can send one: v1 refuses it
        # at once) is reported as Stripe does, without a meter to relate it to.
        return [self.report_errors(errs, type_=NO_METER_FOUND if name in missing
                                   else ERROR_REPORT)
                for name, errs in by_meter.items()]

    def report_errors(self, errors: Iterable[AsyncError], *, type_: str = ERROR_REPORT,
                      error_count: int | None = None, created_ago: float = 0.0,
                      event_id: str | None = None, summary: str | None = None) -> str:
        """One event reporting ``errors`` (all of one meter); ``error_count`` may claim more
        errors than those sampled; ``created_ago`` backdates it (an event Stripe lists only
        after newer ones were read); ``event_id`` and ``summary`` replace its id and its
        ``developer_message_summary`` (any text, as a poisoned answer would carry). Its id."""
        errs = list(errors)
        now = self._clock() - created_ago
        with self._lock:
            meter = self._meters.get(errs[0].event_name) if errs else None
        by_code: dict[str, list[AsyncError]] = defaultdict(list)
        for err in errs:
            by_code[err.code].append(err)
        types = [{"code": code, "error_count": len(group),
                  "sample_errors": [{"error_message": e.message,
                                     "request": {"identifier": e.identifier}}
                                    for e in group[:self.sample_limit]]}
                 for code, group in by_code.items()]
        total = error_count if error_count is not None else len(errs)
        event: dict[str, Any] = {
            "id": event_id or "evt_" + secrets.token_hex(12), "object": "v2.core.event",
            "type": type_, "created": _rfc3339(now), "livemode": False, "context": None,
            "data": {"developer_message_summary": (f"There are {total} invalid meter events."
                                                   if summary is None else summary),
                     # Validated from when the first of them was accepted, until now.
                     "validation_start": _rfc3339(min(
                         [e.at for e in errs if e.at is not None and e.at <= now],
                         default=now - 60)),
                     "validation_end": _rfc3339(now),
                     "reason": {"error_count": total, "error_types": types}},
        }
        if meter is not None and type_ != NO_METER_FOUND:
            event["related_object"] = {"id": meter.id, "type": "billing.meter",
                                       "url": f"/v1/billing/meters/{meter.id}"}
        with self._lock:
            destination = self._record_events_locked([event])
        self._push_later([event], destination)
        return str(event["id"])

    def _record_events_locked(self, events: Iterable[dict[str, Any]]
                              ) -> tuple[str, str] | None:
        """Keep ``events`` (lock held): listed and read from now on. The destination to push
        them to (see :meth:`_push_later`), or None."""
        for event in events:
            self._events[str(event["id"])] = event
        return self._webhook

    def _push_later(self, events: list[dict[str, Any]],
                    destination: tuple[str, str] | None) -> None:
        """Push ``events``, in order, from a thread of their own (call without the lock)."""
        if destination is None or not events:
            return

        def push_all() -> None:
            for event in events:
                self._push(event, *destination)

        threading.Thread(target=push_all, daemon=True).start()

    def events(self) -> list[dict[str, Any]]:
        """Every event produced so far (in full), oldest first."""
        with self._lock:
            return [dict(e) for e in self._events.values()]

    # -- pushes -----------------------------------------------------------------------------
    def set_webhook(self, url: str | None, secret: str | None = None) -> None:
        """Push every new event (thin) to ``url``, signed with ``secret``; None: stop."""
        with self._lock:
            self._webhook = (url, secret or "") if url else None

    @staticmethod
    def thin(event: dict[str, Any]) -> dict[str, Any]:
        """The thin form of an event: no ``data``."""
        return {k: v for k, v in event.items() if k != "data"}

    def signed_push(self, event_id: str, secret: str, *,
                    timestamp: int | None = None) -> tuple[bytes, str]:
        """The body and ``Stripe-Signature`` header Stripe would push for ``event_id``."""
        with self._lock:
            event = self._events[event_id]
        body = json.dumps(self.thin(event)).encode()
        ts = int(self._clock()) if timestamp is None else timestamp
        return body, signature_header(body, secret, ts)

    def _push(self, event: dict[str, Any], url: str, secret: str) -> None:
        body, header = self.signed_push(str(event["id"]), secret)
        request = urllib.request.Request(url, data=body, method="POST", headers={
            "Content-Type": "application/json", "Stripe-Signature": header})
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310 - loopback
                resp.read()
        except Exception:  # noqa: BLE001 - Stripe retries later; a test sees it in the DB
            _log.warning("fake_stripe: pushing %s to %s failed", event["id"], url)

    # -- GET /v2/core/events ----------------------------------------------------------------
    def _serve_event_list(self, query: str) -> Response:
        q = parse_qs(query)
        page = q.get("page", [None])[0]
        if page is not None:
            try:
                state = json.loads(bytes.fromhex(page))
            except ValueError:
                return invalid("Invalid page token.", param="page")
            types, gte, limit, offset = (state["types"], state["gte"], state["limit"],
                                         state["offset"])
        else:
            types = [v for k, vs in sorted(q.items()) if k.startswith("types[") for v in vs]
            gte = q.get("created[gte]", [None])[0]
            limit = min(int(q.get("limit", ["20"])[0]), 100, self.page_cap)
            offset = 0
        with self._lock:
            events = [e for e in self._events.values()
                      if (not types or e["type"] in types)
                      and (gte is None or _parse(e["created"]) >= _parse(gte))]
        events.sort(key=lambda e: _parse(e["created"]), reverse=self.events_newest_first)
        chosen = events[offset:offset + limit]
        more = offset + limit < len(events)
        token = json.dumps({"types": types, "gte": gte, "limit": limit,
                            "offset": offset + limit}).encode().hex()
        return ok({"data": [self.thin(e) for e in chosen],
                   "next_page_url": f"/v2/core/events?page={token}" if more else None,
                   "previous_page_url": None})

    def _serve_event(self, event_id: str) -> Response:
        with self._lock:
            event = self._events.get(event_id)
        if event is None:
            return error(404, "invalid_request_error", f"No such event: '{event_id}'",
                         code="resource_missing")
        return ok(event)


def _parse(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))
