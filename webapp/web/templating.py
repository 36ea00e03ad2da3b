"""The templates' helpers: UTC times and relative ages, numbers, links built fast, the usage
table's rows, and the layout's status strip (sending state, Stripe mode)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote, urlencode

from flask import Flask, g, url_for
from markupsafe import Markup, escape

from ..config import STRIPE_API_BASE_DEFAULT, STRIPE_METER_EVENTS_BASE_DEFAULT
from ..db import reading
from ..outbox.billing_watch import watched
from ..outbox.guards import REQUEUE_PAGE_WORDS
from ..read.billing_alerts import invoice_at_risk
from ..read.event_filters import source_words
from ..read.health import Health, health
from ..read.words import (
    CANCEL_WORDS,
    found_by_words,
    is_duplicate,
    outcome_words,
    pre_aggregated_words,
    state_words,
)
from ..status import (
    DELIVERY_ALL,
    IN_FLIGHT,
    NEEDS_A_PERSON,
    NOT_AT_STRIPE,
    PENDING,
    PROCESSING,
    SENT,
    TEMPLATE_NAMES,
    WAITING,
)
from ..stripe_gateway.stream import REQUEST_KEY_PREFIX
from ..users import MIN_PASSWORD, has_role
from .common import now, svc
from .security import csrf_token, current_user

log = logging.getLogger(__name__)


def chrome() -> dict[str, Any]:
    """The layout's status strip: the state of sending (:mod:`webapp.read.health`, which
    includes the pause switch), a draft invoice about to finalize with usage unsent (kept by
    the maintenance, one row), and Stripe mode (never the key)."""
    if "chrome" not in g:
        settings = svc().settings
        status: Health | None
        risk = None
        try:
            with reading(svc().engine) as conn:
                status = health(conn, now=now(), api_key_here=settings.stripe_mode != "none")
                risk = invoice_at_risk(watched(conn), now=now(),
                                       within=settings.invoice_risk_seconds)
        except Exception:  # noqa: BLE001 - the error page must render without a database
            log.warning("could not read the sending state", exc_info=True)
            status = None
        # Anything but Stripe's own API (a local fake, a proxy) is shown on every page, so a
        # demo or test setting never runs silently in production.
        api_base, streams_base = settings.stripe_api_base, settings.meter_events_base
        g.chrome = {"health": status, "invoice_risk": risk, "stripe_mode": settings.stripe_mode,
                    "meter_event_api": settings.meter_event_api,
                    "api_base": None if api_base == STRIPE_API_BASE_DEFAULT else api_base,
                    "meter_events_base": (None if streams_base
                                          == STRIPE_METER_EVENTS_BASE_DEFAULT
                                          else streams_base)}
    return g.chrome  # type: ignore[no-any-return]


def fmt_utc(value: datetime | None, seconds: bool = True) -> str:
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")


def fmt_age(value: datetime | float | None) -> str:
    """``3 min ago`` / ``in 20 s`` for a time, or a duration in seconds."""
    if value is None:
        return "—"
    is_time = isinstance(value, datetime)
    seconds = (now() - value).total_seconds() if is_time else float(value)  # type: ignore[operator,arg-type]
    future = seconds < 0
    s = abs(seconds)
    if s < 1:
        return "now" if is_time else "0 s"
    if s < 60:
        text = f"{int(s)} s"
    elif s < 3600:
        text = f"{int(s // 60)} min"
    elif s < 86400:
        text = f"{int(s // 3600)} h {int(s % 3600 // 60)} min"
    else:
        text = f"{int(s // 86400)} d {int(s % 86400 // 3600)} h"
    if is_time:
        return f"in {text}" if future else f"{text} ago"
    return text


def when(value: datetime | None) -> Markup:
    """A time as people read it, relative then absolute (``5 min ago · 2026-12-01 14:03:05
    UTC``), machine-readable in ``<time datetime>``; static/app.js puts the viewer's own
    local time in its title. The one way pages show a point in time."""
    if value is None:
        return Markup('<span class="muted">—</span>')
    iso = value.astimezone(UTC).isoformat()
    return Markup('<time datetime="{0}" title="{1} UTC"><span class="age">{2}</span> '
                  '<span class="abs">· {1} UTC</span></time>'
                  ).format(iso, fmt_utc(value), fmt_age(value))


def num(value: int | float | None) -> str:
    """A figure with thousands separated; a float that is a whole number (Stripe's figures
    are floats) as an integer."""
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{int(value):,}" if value.is_integer() else f"{value:,.2f}"
    return f"{value:,}"


#: Currencies whose amounts Stripe gives in whole units (no minor unit): docs.stripe.com/currencies.
ZERO_DECIMAL = frozenset({"bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga", "pyg", "rwf",
                          "ugx", "vnd", "vuv", "xaf", "xof", "xpf"})


def money(amount: int | None, currency: str | None) -> str:
    """An amount Stripe gives in the currency's minor unit, as ``1,234.50 USD``."""
    if amount is None:
        return "—"
    code = (currency or "").lower()
    if code in ZERO_DECIMAL:
        return f"{amount:,} {code.upper()}".strip()
    return f"{amount / 100:,.2f} {code.upper()}".strip()


def pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f}%"


def _prefix(endpoint: str, **values: Any) -> str:
    """The URL of ``endpoint`` up to its last path part, built once per request (pages link
    hundreds of rows; ``url_for`` each time is the slowest part of rendering them)."""
    key = f"prefix:{endpoint}"
    if key not in g:
        url = url_for(endpoint, **values)
        g.setdefault(key, url[: url.rindex("/") + 1])
    return g.get(key)  # type: ignore[no-any-return]


def tenant_url(tenant_id: str, **params: Any) -> str:
    """``url_for("tenants.show", tenant_id=…, **params)``, faster."""
    url = _prefix("tenants.show", tenant_id="x") + quote(tenant_id, safe="")
    return url + ("?" + qs(**params) if any(v not in (None, "") for v in params.values())
                  else "")


def event_url(event_id: int) -> str:
    """``url_for("events.show", event_id=…)``, faster."""
    return _prefix("events.show", event_id=1) + str(int(event_id))


#: A usage figure's status, as the events list filters it: "pending" on the usage pages
#: counts the events in flight too (``read.tenants.usage_in``).
USAGE_LIST_STATUSES = {PENDING: (PENDING, PROCESSING)}


def usage_events_url(tenant_id: str, meter: str, status: str, start: str, end: str,
                     customer: str | None = None) -> str:
    """The events list of exactly the events a usage figure counts: that tenant, Stripe
    customer (the one each event went to, or will go to), meter and status, occurred on the
    UTC days ``start`` to ``end``."""
    params = {"tenant": tenant_id, "meter": meter,
              "status": list(USAGE_LIST_STATUSES.get(status, (status,))),
              "occurred_from": start, "occurred_to": end}
    if customer:
        params["customer"] = customer
    query = urlencode(params, doseq=True)
    return _prefix("events.show", event_id=1).rstrip("/") + "?" + query
#: Stripe's dashboard; test-mode objects live under ``/test/``.
STRIPE_DASHBOARD = "https://dashboard.stripe.com/"
_STRIPE_PAGES = {"customer": "customers/", "request": "logs/", "invoice": "invoices/"}


def stripe_url(kind: str, stripe_id: str) -> str:
    """Where Stripe's dashboard shows a customer (``cus_…``), a request (``req_…``) or an
    invoice (``in_…``): under
    ``/test/`` unless the API key is a live one (its prefix decides; the key is never shown)."""
    mode = "" if svc().settings.stripe_mode == "live" else "test/"
    return STRIPE_DASHBOARD + mode + _STRIPE_PAGES[kind] + quote(stripe_id, safe="")


def stripe_link(kind: str, stripe_id: str, label: str = "in Stripe") -> Markup:
    """A link to ``stripe_url`` that opens a new tab, and says so to screen readers."""
    return Markup('<a class="stripe-link" href="{0}" target="_blank" rel="noopener noreferrer">'
                  '{1}<span class="visually-hidden"> (opens Stripe in a new tab)</span></a>'
                  ).format(stripe_url(kind, stripe_id), label)


def usage_rows(rows: Iterable[Any], statuses: tuple[str, ...], **params: Any) -> Markup:
    """The body rows of the usage table: tenant (linked, with ``params``), meter, the sent
    units, Stripe's figure beside them and the difference, the sent events, the customer the
    usage went to, then units and events per other status. The figures a person comes for come
    first, so they stay on a phone's screen. Built here rather than in the template: a
    400-row table is 5,000 cells, and the template engine spent most of the page's time on
    them. Every string from the database goes through ``escape``; the rest are numbers and
    our own status names."""
    base, sep, query = tenant_url("", **params).partition("?")
    query = escape(sep + query)
    start, end = str(params.get("from", "")), str(params.get("to", ""))
    out = []
    for r in rows:
        t, m = escape(r.tenant_id), escape(r.meter)
        c = escape(r.stripe_customer_id or "")
        name = f'<span class="sub muted"> {escape(r.name)}</span>' if r.name else ""
        customer = (f"<code>{c}</code> "
                    f"{stripe_link('customer', r.stripe_customer_id)}" if r.stripe_customer_id
                    else '<span class="badge badge-warn">not mapped</span>')
        units, events = {}, {}
        for s in statuses:
            q, n = int(r.quantity[s]), int(r.events[s])
            url = usage_events_url(r.tenant_id, r.meter, s, start, end, r.stripe_customer_id)
            shown = (f'<a href="{escape(url)}"'
                     f' aria-label="{n:,} {s} events of {t}, {m}">{n:,}</a>' if n else f"{n:,}")
            units[s] = (f'<td class="num{" zero" if not q else ""}" data-col="{s}_quantity">'
                        f'{q:,}</td>')
            events[s] = (f'<td class="num sub{" zero" if not n else ""}" '
                         f'data-col="{s}_events">{shown}</td>')
        others = "".join(units[s] + events[s] for s in statuses if s != SENT)
        out.append(f'<tr data-tenant="{t}" data-meter="{m}" data-customer="{c}"><td><a href="'
                   f'{escape(base)}{escape(quote(r.tenant_id, safe=""))}{query}">{t}</a>'
                   f'{name}</td><td>{m}</td>{units.get(SENT, "")}{stripe_cells(r)}'
                   f'{events.get(SENT, "")}<td>{customer}</td>{others}</tr>\n')
    return Markup("".join(out))  # noqa: S704 - every database string above is escaped


def stripe_cells(r: Any) -> str:
    """Two cells: Stripe's figure for the days reconciliation compared (when, how many days
    and ours then in its title), and Stripe's less ours over those days; "not compared yet"
    where no day was. Numbers and our own words only."""
    if r.stripe_units is None:
        return ('<td class="num muted small" data-col="stripe_units" colspan="2">'
                "not compared yet</td>")
    at = fmt_utc(r.compared_at, seconds=False) if r.compared_at else "—"
    days = f"{r.compared_days:,} day{'' if r.compared_days == 1 else 's'}"
    title = (f"Stripe's figure for the {days} compared (as of {at} UTC); ours then: "
             f"{r.compared_units:,}")
    diff = r.difference or 0.0
    # When it was compared, on screen too (a title is out of reach on a phone): the day; the
    # time is in the title.
    on = f"{r.compared_at:%d %b}" if r.compared_at else "—"
    return (f'<td class="num" data-col="stripe_units" title="{escape(title)}">'
            f'<span data-figure>{_amount(r.stripe_units)}</span>'
            f'<span class="cell-note" data-col="compared_at">{on}</span></td>'
            f'<td class="num sub{" bad" if diff else ""}" '
            f'data-col="stripe_difference" title="{escape(title)}">'
            f'{"+" if diff > 0 else ""}{_amount(diff) if diff else "="}</td>')


def _amount(value: float) -> str:
    """A figure of Stripe's: whole numbers as integers, with thousands separated."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:,.2f}"


def qs(**params: Any) -> str:
    """A query string from the non-empty parameters (escaped by Jinja where used)."""
    return urlencode({k: v for k, v in params.items() if v not in (None, "")})


#: What a closing period's unsent events wait for, as the events list filters them.
_WAIT_STATUSES = {"retry": (*WAITING, *IN_FLIGHT), "meter": WAITING, "person": NEEDS_A_PERSON,
                  None: NOT_AT_STRIPE}


def period_events_url(period: Any, wait: str | None = None) -> str:
    """The events list of a closing period's events not at Stripe (those waiting for
    ``wait``: ``retry``, ``meter`` or ``person``; None: all of them)."""
    return url_for("events.find", tenant=period.tenant_id, meter=period.meter,
                   status=list(_WAIT_STATUSES[wait]),
                   period=f"{int(period.period_start.timestamp())}-"
                          f"{int(period.period_end.timestamp())}")


def is_stream_request(key: str | None) -> bool:
    """Whether an attempt's idempotency key is a meter event stream request's (its events
    are listed by ``/events?request=KEY``)."""
    return bool(key) and str(key).startswith(REQUEST_KEY_PREFIX)


def stripe_keyed() -> bool:
    """Whether Stripe can be asked at all (``STRIPE_API_KEY`` is set): without it no
    reconciliation runs, scheduled or asked for."""
    return svc().settings.stripe_mode != "none"


def init_app(app: Flask) -> None:
    app.jinja_env.autoescape = True  # every template, whatever its extension
    app.jinja_env.filters.update(utc=fmt_utc, ago=fmt_age, num=num, pct=pct, money=money,
                                 state_words=state_words, outcome_words=outcome_words,
                                 pre_aggregated_words=pre_aggregated_words,
                                 found_by_words=found_by_words)
    app.jinja_env.globals.update(source_words=source_words, when=when, qs=qs,
                                 csrf_token=csrf_token, chrome=chrome,
                                 is_stream_request=is_stream_request,
                                 is_duplicate=is_duplicate, has_role=has_role, escape=escape,
                                 tenant_url=tenant_url,
                                 event_url=event_url, usage_rows=usage_rows,
                                 usage_events_url=usage_events_url,
                                 stripe_url=stripe_url, stripe_link=stripe_link,
                                 min_password=MIN_PASSWORD, cancel_words=CANCEL_WORDS,
                                 requeue_words=REQUEUE_PAGE_WORDS, stripe_keyed=stripe_keyed,
                                 period_events_url=period_events_url,
                                 # Statuses and their groups, as templates spell them
                                 # (``S.DEAD``, ``S.WAITING``; ``D.SENT`` for a delivery).
                                 S=SimpleNamespace(**TEMPLATE_NAMES),
                                 D=SimpleNamespace(**{d.upper(): d for d in DELIVERY_ALL}))

    @app.context_processor
    def inject() -> dict[str, Any]:
        return {"user": current_user(), "now": now()}
