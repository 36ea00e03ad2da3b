"""``/metrics`` in the Prometheus text exposition format (version 0.0.4).

With ``METRICS_TOKEN`` set it answers only ``Authorization: Bearer <token>`` (compared in constant
time; 401 otherwise); unset, it is open and belongs on a private network. Either way it exposes
aggregates only: no event, tenant, customer or key. Counters
(`_total`, the latency histogram) come from the rollups plus the few rows past their
watermark, so they only ever grow (see ``webapp.outbox.rollups``).
"""

from __future__ import annotations

from collections.abc import Iterator

from flask import Blueprint, Response, request

from ..read.metrics import Metrics
from ..read.metrics import metrics as read_metrics
from ..users import same_token
from .common import now, svc

bp = Blueprint("metrics", __name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def token_refused(path: str) -> Response | None:
    """None when the caller may read ``path`` (no ``METRICS_TOKEN``, or its bearer token
    matches, compared in constant time); else the 401 to answer."""
    token = svc().settings.metrics_token
    if token is None:
        return None
    scheme, _, sent = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and same_token(sent.strip(), token):
        return None
    return Response(f"401 Unauthorized: {path} needs Authorization: Bearer "
                    "<METRICS_TOKEN>\n", status=401, mimetype="text/plain",
                    headers={"WWW-Authenticate": 'Bearer realm="metrics"'})


@bp.get("/metrics")
def metrics() -> Response:
    refused = token_refused("/metrics")
    if refused is not None:
        return refused
    m = read_metrics(svc().engine, now=now())
    body = "".join(_lines(m, svc().settings.stripe_mode))
    return Response(body, content_type=CONTENT_TYPE)


def _fmt(value: float) -> str:
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def _lines(m: Metrics, stripe_mode: str) -> Iterator[str]:
    def family(name: str, kind: str, help_text: str) -> str:
        return f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"

    yield family("billing_outbox_events", "gauge", "Outbox events by status.")
    for status, n in m.counts.items():
        yield f'billing_outbox_events{{status="{status}"}} {n}\n'

    yield family("billing_outbox_oldest_waiting_age_seconds", "gauge",
                 "Age of the oldest event waiting to be sent (pending, processing, retrying); "
                 "0 when none waits.")
    yield f"billing_outbox_oldest_waiting_age_seconds {_fmt(m.oldest_waiting_age or 0)}\n"

    yield family("billing_outbox_paused", "gauge", "1 while sending is paused for every worker.")
    yield f"billing_outbox_paused {1 if m.paused else 0}\n"

    yield family("billing_outbox_events_near_age_limit", "gauge",
                 "Unsent events within 7 days of Stripe's 35-day limit.")
    yield f"billing_outbox_events_near_age_limit {m.near_limit}\n"
    yield family("billing_outbox_events_past_age_limit", "gauge",
                 "Unsent events older than Stripe's 35-day limit (Stripe rejects them).")
    yield f"billing_outbox_events_past_age_limit {m.over_limit}\n"

    yield family("billing_outbox_stripe_attempts_total", "counter",
                 "Calls to Stripe's meter events API by outcome class.")
    for outcome in sorted(set(m.attempts) | {"delivered", "not_executed", "unknown",
                                             "permanent", "systemic"}):
        yield (f'billing_outbox_stripe_attempts_total{{outcome="{outcome}"}} '
               f"{m.attempts.get(outcome, 0)}\n")

    name = "billing_outbox_stripe_request_duration_seconds"
    yield family(name, "histogram", "Duration of calls to Stripe's meter events API.")
    for bound, count in m.latency_buckets:
        yield f'{name}_bucket{{le="{_fmt(bound)}"}} {count}\n'
    yield f'{name}_bucket{{le="+Inf"}} {m.latency_count}\n'
    yield f"{name}_sum {_fmt(m.latency_sum_seconds)}\n"
    yield f"{name}_count {m.latency_count}\n"

    yield family("billing_outbox_stripe_mode_info", "gauge",
                 "The Stripe mode from the API key's prefix (never the key).")
    yield f'billing_outbox_stripe_mode_info{{mode="{stripe_mode}"}} 1\n'
