"""Dashboard at scale (issue 5 item 4; issue 4's speed floor): the server time of every page
and htmx fragment over 1,000,000 outbox rows on PostgreSQL.

**The data.** One fresh schema of the bench database, migrated with
``webapp.migrate.upgrade`` (every product index in place while loading, as in production),
filled by set-based SQL (``INSERT … SELECT … generate_series``: no Python loop per row):

- ``stripe_usage_outbox``: ``events`` rows (1,000,000; 100,000 with ``--quick``) created
  evenly over the last 60 days, ids in creation order (as the engine writes them), 2 meters
  (``api_requests`` 70%, ``tokens``), 200 tenants with a skewed share (the largest ~4% of
  the events, the smallest ~0.3%). 195 tenants are mapped in ``billing_tenants``; 5 are not
  (2 have a row without a Stripe customer, 3 none): their events (1.5%) wait ``pending``
  over the whole 60 days, which is what unmapped tenants look like. Of the mapped tenants'
  events: those of the last hour are half pending, a tenth processing, a tenth retrying;
  those of the last day a quarter retrying (an outage), 1% dead; older ones 2.1% dead, 1.1%
  resolved; everything else ``sent`` (≈ 95%). Dead and resolved rows die of four causes
  with the engine's own ``dead_reason`` texts: no such customer (400 ``resource_missing``),
  an invalid value (400 ``parameter_invalid_integer``), retries exhausted (12 × 500
  ``api_error``), outcome unknown past the dedupe window (timeouts).
- ``stripe_usage_attempts``: one row per call the event's ``call_count`` says was made — so
  every sent event has its delivering attempt (and 5% one or two failed calls before it),
  every dead one its 1 to 12 calls: ≈ 1.07 attempts per event. Every attempt, not a sample.
- ``audit_log`` / ``audit_log_events``: one ``resolve`` entry per 5 resolved events (the
  resolved rows carry the entry's actor, reason, note and time), ``requeue`` entries for a
  sample of events sent after failed calls, pause/resume pairs, tenant mappings and user
  creations (ids in time order, as the app writes them).
- ``users``: an admin and 9 others (scrypt with small parameters, as the web tests do).
- Stripe's side (issue 12): the 2 meters; 2,000 events sent in the last 30 days made
  ``rejected`` (four of Stripe's codes) by 400 error reports of 5 samples each (one report
  in 20 also carries a sample naming nothing of ours); 40 reconciliation runs, the last with
  60 mismatches.

Then ``ANALYZE`` and the first fold of the rollups, ``webapp.outbox.rollups.fold`` — what the
folder service's first run after deploying on such a table pays (page views never fold);
its time is reported — and an
``ANALYZE`` of the rollup tables (autoanalyze would do it within a minute of the fold; this
machine's cluster runs with ``autovacuum = off``, so nothing would: the table says which).

**Two states.** Right after the bulk load no page is all-visible yet, so the index-only
scans the read side is built on (``ix_outbox_unsent`` covers the counts) would visit the
heap for every row, and the planner prefers a parallel sequential scan of the whole table.
That state is sampled first, briefly, and reported as one informational row (which routes
miss). Then ``VACUUM (ANALYZE)`` brings the tables to the steady state autovacuum keeps a
table of settled rows in — statistics, hint bits and the visibility map — and every route
is measured against the floor there.

**The measure.** The Flask test client of ``create_app({"TESTING": True}, settings=…,
start_drainer=False)``, signed in as an admin through the real log-in form (CSRF token
included). Server time = wall time of ``client.get(…)`` plus reading the body, in process:
no network, no browser; the test client's own overhead (building the WSGI environ, the
cookie jar) is included, well under 1 ms. A download (a CSV export, ``Route.download``) is
not a page: it streams a whole set, and its whole time grows with the rows asked for. It is
read as a client receives it (``buffered=False``, chunk by chunk): its server time is the
time to its first chunk, and its whole time, bytes and rows/s are reported beside it.
Every route is requested twice to warm up, then sampled round-robin — one request of each
route per round, so a burst of load from elsewhere on this shared machine hits every route
alike — ``10 × runs`` times (at least 20). Pages are fetched whole and as their htmx
fragment (``HX-Request: true``). A refresh of the rollups may fall inside the sampling,
as it would in production (at most one every 5 minutes, from the page that triggers it).

**The floor**: median < 150 ms and p95 < 300 ms for every page and fragment, and for every
download's first byte.

The schema is dropped at the end (the bench database with it, by ``bench.run``).
"""

from __future__ import annotations

import math
import re
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

from sqlalchemy import text

from .common import BenchDatabase, BenchFailure, Figure, Row, verdict

SECTION = "Dashboard at scale"
FLOOR_MEDIAN_MS = 150.0
FLOOR_P95_MS = 300.0
DAYS = 60
TENANTS = 200
MAPPED = 195              # tenant-000 … tenant-194 have a Stripe customer
NAMED_UNMAPPED = 2        # tenant-195, tenant-196 have a row without one; 197–199 have none
UNMAPPED_SHARE = 0.015
WARMUP = 2
MIN_SAMPLES = 20
FRESH_SAMPLES = 10        # before VACUUM: informational, fewer samples
PASSWORD = "bench-password-123"
ADMIN = "admin@bench.example"
CSRF_RE = re.compile(r'name="csrf_token" value="([^"]+)"')

DEAD_PAST_WINDOW = "outcome unknown past Stripe's dedupe window"  # states.DEAD_PAST_WINDOW
DEAD_EXHAUSTED = "retries exhausted"                              # states.DEAD_EXHAUSTED


@dataclass(frozen=True)
class Shape:
    """What the loader spreads the rows over. The default is this section's data set; the
    ``scale`` section loads a year of a larger product with another shape."""

    days: int = DAYS
    tenants: int = TENANTS
    mapped: int = MAPPED
    named_unmapped: int = NAMED_UNMAPPED
    unmapped_share: float = UNMAPPED_SHARE
    #: The first ``k`` mapped tenants get ``(k / mapped) ** (1 / skew)`` of the mapped events:
    #: 1.6 puts ~4% on the largest of 195; 3 on 100,000 gives a few large tenants (the
    #: largest ~2%) and a long tail (the smallest a few dozen events a year).
    skew: float = 1.6
    #: Digits of the tenant number in ``tenant-007`` / ``cus_tenant007``.
    digits: int = 3

    def tenant(self, i: int) -> str:
        return f"tenant-{i:0{self.digits}d}"


DEFAULT_SHAPE = Shape()


@dataclass
class Route:
    label: str
    path: str
    htmx: bool = False
    page: bool = True      # a page with an htmx fragment (False: CSV, probes, /metrics)

    @property
    def download(self) -> bool:
        """A streamed file (a CSV export): not a page. Its whole time grows with the rows
        asked for, so its floor is judged on its first byte."""
        return self.path.partition("?")[0].endswith(".csv")

    @property
    def kind(self) -> str:
        return ("fragment" if self.htmx else "page" if self.page
                else "download" if self.download else "endpoint")


@dataclass(frozen=True)
class Sample:
    """One request. ``ms`` is what the floor judges: the whole response of a page, fragment or
    endpoint; the first chunk of a download's body (``total_ms`` is the whole of it)."""

    ms: float
    total_ms: float
    bytes: int
    lines: int = 0          # a download's lines: its rows, with the header


@dataclass
class Timing:
    """A route's samples: the floor's measure and, for a download, its whole time."""

    ms: Figure = field(default_factory=Figure)
    total_ms: Figure = field(default_factory=Figure)
    bytes: int = 0
    lines: int = 0

    def add(self, s: Sample) -> None:
        self.ms.add(s.ms)
        self.total_ms.add(s.total_ms)
        self.bytes, self.lines = s.bytes, s.lines

    def download_note(self) -> str:
        """The whole file beside its first byte, saying which one the floor judges."""
        total = self.total_ms.median
        return (f"download: the floor is its first byte; the whole file {total:,.0f} ms "
                f"(p95 {p95(self.total_ms.values):,.0f}), {self.bytes:,} bytes, "
                f"{self.lines:,} lines, {self.lines / (total / 1000):,.0f} rows/s")


@dataclass
class DashboardResults:
    rows: int
    runs: int
    samples: int = 0
    load_seconds: dict[str, float] = field(default_factory=dict)
    fold_seconds: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    routes: list[Route] = field(default_factory=list)
    vacuum_seconds: float = 0.0
    autovacuum: str = "?"
    #: Per route, after VACUUM (the floor's measure) and before it.
    figures: dict[str, Timing] = field(default_factory=dict)
    fresh: dict[str, Timing] = field(default_factory=dict)
    #: Seconds "Prepare the report" took, per period (the long periods' pages read it).
    report_seconds: dict[str, float] = field(default_factory=dict)
    #: Milliseconds of each look the notifier takes at the alerts (``Notifier.run_once``).
    notifier_ms: list[float] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)


# -- loading -------------------------------------------------------------------------------------

#: The outbox rows. ``b`` draws the random numbers, ``s`` decides the tenant, status and kind
#: of failure, the outer select derives every column from them.
LOAD_OUTBOX = """
INSERT INTO stripe_usage_outbox (
    tenant_id, meter, quantity, idempotency_key, occurred_at, status, attempt_count,
    call_count, next_attempt_at, processing_deadline_at, claim_token, claimed_by,
    stripe_customer_id, key_generation, first_attempt_at, first_unknown_at, sent_at,
    last_outcome, last_error_class, last_error_code, last_http_status, last_error_message,
    last_request_id, dead_reason, dead_at, resolved_at, resolved_by, resolve_reason,
    resolve_note, created_at, updated_at)
SELECT
    tenant, meter, quantity, 'usage_log:' || g, created_at - occ_lag, status,
    CASE WHEN status IN ('retrying') AND outcome = 'not_executed' THEN 0 ELSE calls END,
    calls,
    CASE WHEN status = 'retrying' THEN CAST(:now AS timestamptz) + rx * interval '30 min'
         ELSE created_at END,
    CASE WHEN status = 'processing' THEN CAST(:now AS timestamptz) + interval '2 min' END,
    CASE WHEN status = 'processing' THEN left(md5(g::text), 32) END,
    CASE WHEN status = 'processing' THEN 'bench-host\\:4242\\:ab12' END,
    CASE WHEN NOT unmapped AND status <> 'pending' THEN customer END,
    CASE WHEN kind IN ('exhausted', 'server') THEN calls
         WHEN status = 'sent' THEN calls - 1 ELSE 0 END,
    first_at,
    CASE WHEN kind IN ('window', 'exhausted') OR (status = 'retrying' AND outcome = 'unknown')
         THEN first_at END,
    sent_at,
    outcome,
    CASE WHEN outcome IS NULL OR outcome = 'delivered' THEN NULL ELSE err_class END,
    CASE WHEN outcome IS NULL OR outcome = 'delivered' THEN NULL ELSE err_code END,
    CASE WHEN calls = 0 THEN NULL WHEN outcome = 'delivered' THEN 200 ELSE http END,
    CASE WHEN outcome IS NULL OR outcome = 'delivered' THEN NULL ELSE message END,
    CASE WHEN calls > 0 AND (outcome = 'delivered' OR http IS NOT NULL)
         THEN 'req_' || left(md5('r' || g), 14) END,
    CASE WHEN status IN ('dead', 'resolved') THEN
        CASE kind WHEN 'window' THEN :past_window
                  WHEN 'exhausted' THEN :exhausted || ' (last: ' || message || ')'
                  ELSE message END END,
    dead_at,
    CASE WHEN status = 'resolved'
         THEN least(dead_at + rx * interval '2 days', CAST(:now AS timestamptz)
                    - interval '1 min') END,
    CASE WHEN status = 'resolved' THEN 'ops@bench.example' END,
    CASE WHEN status = 'resolved' THEN 'written_off' END,
    CASE WHEN status = 'resolved' THEN 'bench' END,
    created_at,
    coalesce(dead_at, sent_at, first_at, created_at)
FROM (
    SELECT s.*,
        CASE WHEN calls > 0 THEN created_at + interval '1 s' END AS first_at,
        CASE WHEN status = 'sent'
             THEN least(created_at + interval '1 s' * (1.3 + rx * 1.5 + (calls - 1) * 4),
                        CAST(:now AS timestamptz)) END AS sent_at,
        CASE WHEN status IN ('dead', 'resolved') THEN least(
            CASE kind WHEN 'window' THEN created_at + interval '23 h'
                      WHEN 'exhausted' THEN created_at + interval '3 h' * (0.5 + rx)
                      ELSE created_at + interval '1.5 s' END,
            CAST(:now AS timestamptz) - interval '1 min') END AS dead_at,
        CASE kind WHEN 'missing' THEN 'InvalidRequestError'
                  WHEN 'invalid' THEN 'InvalidRequestError'
                  WHEN 'window' THEN 'APIConnectionError'
                  WHEN 'rate' THEN 'RateLimitError'
                  ELSE 'APIError' END AS err_class,
        CASE kind WHEN 'missing' THEN 'resource_missing'
                  WHEN 'invalid' THEN 'parameter_invalid_integer'
                  WHEN 'window' THEN NULL
                  WHEN 'rate' THEN 'rate_limit'
                  ELSE 'api_error' END AS err_code,
        CASE kind WHEN 'missing' THEN 400 WHEN 'invalid' THEN 400 WHEN 'window' THEN NULL
                  WHEN 'rate' THEN 429 ELSE 500 END AS http,
        CASE kind WHEN 'missing' THEN 'No such customer: ''' || customer || ''''
                  WHEN 'invalid' THEN 'Invalid integer: payload[value] must be positive, got -'
                                      || (1 + g % 97)
                  WHEN 'window' THEN 'Request to Stripe timed out'
                  WHEN 'rate' THEN 'Too many requests hit the API too quickly.'
                  ELSE 'An unknown error occurred' END AS message,
        CASE WHEN status = 'sent' THEN 'delivered'
             WHEN status IN ('pending', 'processing') THEN NULL
             WHEN kind IN ('missing', 'invalid') THEN 'permanent'
             WHEN kind = 'rate' THEN 'not_executed'
             ELSE 'unknown' END AS outcome
    FROM (
    SELECT s0.*, k.kind, k.calls FROM (
        SELECT b.*, tenant, unmapped, customer,
            CASE WHEN unmapped THEN 'pending'
                 WHEN age < interval '1 hour' THEN
                     CASE WHEN rs < 0.5 THEN 'pending' WHEN rs < 0.6 THEN 'processing'
                          WHEN rs < 0.7 THEN 'retrying' ELSE 'sent' END
                 WHEN age < interval '1 day' THEN
                     CASE WHEN rs < 0.25 THEN 'retrying' WHEN rs < 0.26 THEN 'dead'
                          ELSE 'sent' END
                 ELSE CASE WHEN rs < 0.021 THEN 'dead' WHEN rs < 0.032 THEN 'resolved'
                           ELSE 'sent' END
            END AS status,
            CASE WHEN rk < 0.45 THEN 'missing' WHEN rk < 0.60 THEN 'invalid'
                 WHEN rk < 0.90 THEN 'exhausted' ELSE 'window' END AS dead_kind,
            CASE WHEN rk < 0.6 THEN 'rate' ELSE 'server' END AS retry_kind
        FROM (
            SELECT g, created_at, CAST(:now AS timestamptz) - created_at AS age,
                rs, rt, rm, rq, rk, ra, rx,
                interval '1 s' * (rx * 5) AS occ_lag,
                CASE WHEN rm < 0.7 THEN 'api_requests' ELSE 'tokens' END AS meter,
                CASE WHEN rm < 0.7 THEN 1 + floor(rq * 10)::bigint
                     ELSE 1 + floor(rq * rq * 5000)::bigint END AS quantity
            FROM (
                SELECT g, CAST(:start AS timestamptz) + (g - 1 + random()) * :step AS created_at,
                    random() AS rs, random() AS rt, random() AS rm, random() AS rq,
                    random() AS rk, random() AS ra, random() AS rx
                FROM generate_series(1, :n) AS g
            ) r
        ) b
        CROSS JOIN LATERAL (
            SELECT rt < :unmapped_share AS unmapped,
                   CASE WHEN rt < :unmapped_share THEN :mapped + g % (:tenants - :mapped)
                        ELSE floor(:mapped * power((rt - :unmapped_share)
                                                   / (1 - :unmapped_share), :skew))::int
                   END AS tn
        ) u
        CROSS JOIN LATERAL (
            SELECT 'tenant-' || lpad(tn::text, :digits, '0') AS tenant,
                   'cus_tenant' || lpad(tn::text, :digits, '0') AS customer
        ) t
    ) s0
    CROSS JOIN LATERAL (
        SELECT CASE WHEN s0.status IN ('dead', 'resolved') THEN s0.dead_kind
                    WHEN s0.status = 'retrying' THEN s0.retry_kind END AS kind,
               CASE WHEN s0.status IN ('pending', 'processing') THEN 0
                    WHEN s0.status = 'sent' THEN
                        CASE WHEN s0.ra < 0.95 THEN 1 WHEN s0.ra < 0.99 THEN 2 ELSE 3 END
                    WHEN s0.status = 'retrying' THEN 1 + floor(s0.ra * 5)::int
                    WHEN s0.dead_kind IN ('missing', 'invalid') THEN 1
                    WHEN s0.dead_kind = 'exhausted' THEN 12
                    ELSE 4 + floor(s0.ra * 5)::int END AS calls
    ) k
) s
) x
"""

#: One attempt row per call; the last call's outcome is the event's, earlier ones of a sent
#: event were 500s (hence its key generation), of a failed one the same failure again.
LOAD_ATTEMPTS = """
INSERT INTO stripe_usage_attempts (
    event_id, attempted_at, duration_ms, worker, claim_token, idempotency_key, outcome,
    counted, http_status, stripe_request_id, error_class, error_code, error_message, applied)
SELECT id, at, dur, 'bench-host\\:' || (100 + id % 3) || '\\:a1b2', left(md5('c' || id || k), 32),
    CASE WHEN k > 1 AND gen_bumps THEN idempotency_key || ':' || (k - 1)
         ELSE idempotency_key END,
    oc, oc IN ('delivered', 'unknown', 'permanent'), hs,
    CASE WHEN hs IS NOT NULL THEN 'req_' || left(md5('q' || id || k), 14) END,
    CASE WHEN oc = 'delivered' THEN NULL ELSE ec END,
    CASE WHEN oc = 'delivered' THEN NULL ELSE eo END,
    CASE WHEN oc = 'delivered' THEN NULL ELSE em END,
    true
FROM (
    SELECT o.id, o.idempotency_key, k,
        o.first_attempt_at + (k - 1) * (coalesce(o.dead_at, o.sent_at, least(
            CAST(:now AS timestamptz) - interval '1 min',
            o.first_attempt_at + interval '10 min' * o.call_count)) - o.first_attempt_at)
            / greatest(o.call_count - 1, 1) AS at,
        CASE WHEN k = o.call_count THEN o.last_outcome
             WHEN o.status = 'sent' THEN 'unknown' ELSE o.last_outcome END AS oc,
        CASE WHEN k = o.call_count OR o.status <> 'sent' THEN o.last_http_status
             ELSE 500 END AS hs,
        CASE WHEN k = o.call_count OR o.status <> 'sent' THEN o.last_error_class
             ELSE 'APIError' END AS ec,
        CASE WHEN k = o.call_count OR o.status <> 'sent' THEN o.last_error_code
             ELSE 'api_error' END AS eo,
        CASE WHEN k = o.call_count OR o.status <> 'sent' THEN o.last_error_message
             ELSE 'An unknown error occurred' END AS em,
        CASE WHEN o.last_http_status IS NULL AND o.status <> 'sent' THEN 10000
             ELSE 35 + floor(random() * random() * 900)::int END AS dur,
        o.key_generation > 0 AS gen_bumps
    FROM stripe_usage_outbox o CROSS JOIN LATERAL generate_series(1, o.call_count) AS k
    WHERE o.call_count > 0
) a
ORDER BY id, k
"""

#: Stripe's side: meters, rejected events with their reports and samples, reconciliation
#: runs and the last one's mismatches. Before the first fold, as Stripe's reports would be.
LOAD_STRIPE_SIDE = [
    """INSERT INTO stripe_meters (event_name, meter_id, display_name, status, customer_key,
           value_key, formula, seen_at, updated_at)
       VALUES ('api_requests', 'mtr_bench0001', 'API requests', 'active',
               'stripe_customer_id', 'value', 'sum', :now, :now),
              ('tokens', 'mtr_bench0002', 'Tokens', 'active', 'stripe_customer_id', 'value',
               'sum', :now, :now)""",
    """CREATE TEMP TABLE bench_rejected ON COMMIT DROP AS
       SELECT id, sent_at, row_number() OVER (ORDER BY id) AS k
       FROM (SELECT id, sent_at FROM stripe_usage_outbox
             WHERE status = 'sent' AND sent_at >= CAST(:now AS timestamptz) - interval '30 days'
             ORDER BY id DESC LIMIT 2000) s""",
    """INSERT INTO stripe_events (id, type, created, meter_id, source, stored_at, error_count,
           sample_count, rejected, unmatched, summary, body)
       SELECT 'evt_bench' || lpad(r::text, 6, '0'), 'v1.billing.meter.error_report_triggered',
              max(sent_at) + interval '5 min', 'mtr_bench0001', 'poll',
              max(sent_at) + interval '6 min', 5 + (r % 20 = 0)::int * 3,
              5 + (r % 20 = 0)::int, 5, (r % 20 = 0)::int,
              'There are ' || (5 + (r % 20 = 0)::int * 3) || ' invalid meter events.', '{}'
       FROM (SELECT (k - 1) / 5 AS r, sent_at FROM bench_rejected) x GROUP BY r""",
    """UPDATE stripe_usage_outbox o
       SET status = 'rejected', rejected_at = b.sent_at + interval '6 min',
           reject_code = (array['meter_event_customer_not_found',
                                'meter_event_no_customer_defined', 'meter_event_invalid_value',
                                'archived_meter'])[1 + (b.k % 4)::int],
           reject_message = 'No such customer: ' || o.stripe_customer_id,
           reject_event_id = 'evt_bench' || lpad(((b.k - 1) / 5)::text, 6, '0'),
           updated_at = b.sent_at + interval '6 min'
       FROM bench_rejected b WHERE o.id = b.id""",
    """INSERT INTO stripe_error_samples (stripe_event_id, code, message, identifier, event_id,
           outcome, at)
       SELECT reject_event_id, reject_code, reject_message, idempotency_key, id, 'rejected',
              rejected_at
       FROM stripe_usage_outbox WHERE status = 'rejected'
       UNION ALL
       SELECT id, 'meter_event_customer_not_found', 'No such customer', 'elsewhere-' || id,
              NULL, 'unmatched', stored_at
       FROM stripe_events WHERE unmatched = 1""",
    """INSERT INTO reconciliation_runs (started_at, finished_at, since, until, tenant_id,
           "trigger", actor, buckets_checked, pending, mismatches, calls, ok, errors, notes)
       SELECT CAST(:now AS timestamptz) - (40 - d) * interval '1 day',
              CAST(:now AS timestamptz) - (40 - d) * interval '1 day' + interval '90 s',
              date_trunc('hour', CAST(:now AS timestamptz)) - (75 - d) * interval '1 day',
              date_trunc('hour', CAST(:now AS timestamptz)) - (40 - d) * interval '1 day',
              NULL, 'schedule', NULL, 13800, 400, CASE WHEN d = 39 THEN 60 ELSE d % 3 END,
              1170, true, '[]', '[]'
       FROM generate_series(0, 39) d""",
    """INSERT INTO reconciliation_mismatches (run_id, tenant_id, stripe_customer_id, meter,
           formula, start, "end", local_units, stripe_units, difference)
       SELECT (SELECT max(id) FROM reconciliation_runs), t.tenant_id, t.stripe_customer_id,
              (array['api_requests', 'tokens'])[1 + i % 2], 'sum',
              date_trunc('day', CAST(:now AS timestamptz)) - (2 + i % 30) * interval '1 day',
              date_trunc('day', CAST(:now AS timestamptz)) - (1 + i % 30) * interval '1 day',
              1000 + i, 1000 + i + (i % 7) - 3, (i % 7) - 3
       FROM generate_series(0, 59) i
       JOIN (SELECT tenant_id, stripe_customer_id,
                    row_number() OVER (ORDER BY tenant_id) - 1 AS n
             FROM billing_tenants WHERE stripe_customer_id IS NOT NULL) t ON t.n = i""",
]

LOAD_TENANTS = """
INSERT INTO billing_tenants (tenant_id, name, stripe_customer_id, created_at, updated_at)
SELECT 'tenant-' || lpad(i::text, :digits, '0'), 'Tenant ' || i,
    CASE WHEN i < :mapped THEN 'cus_tenant' || lpad(i::text, :digits, '0') END,
    CAST(:start AS timestamptz) - interval '1 day', CAST(:start AS timestamptz) - interval '1 day'
FROM generate_series(0, :mapped + :named - 1) AS i
"""

#: Audit entries, numbered in time order; resolved rows then take their entry's details.
LOAD_AUDIT = [
    """CREATE TEMP TABLE bench_audit (at timestamptz, actor text, action text,
        reason_code text, note text, ids bigint[]) ON COMMIT DROP""",
    # resolve: 5 events an entry, in the order they were resolved
    """INSERT INTO bench_audit
       SELECT max(resolved_at), (array['ops@bench.example', 'finance@bench.example',
              'support@bench.example'])[1 + (b % 3)::int], 'resolve',
              (array['billed_manually', 'duplicate', 'customer_churned', 'written_off',
                     'other'])[1 + (b % 5)::int],
              'ticket BILL-' || (1000 + b) || ': handled outside the outbox',
              array_agg(id ORDER BY id)
       FROM (SELECT id, resolved_at,
                    (row_number() OVER (ORDER BY resolved_at, id) - 1) / 5 AS b
             FROM stripe_usage_outbox WHERE status = 'resolved') r
       GROUP BY b""",
    # requeue: a sample of events sent after failed calls, 10 an entry
    """INSERT INTO bench_audit
       SELECT min(sent_at) - interval '30 s', 'ops@bench.example', 'requeue', NULL, NULL,
              array_agg(id ORDER BY id)
       FROM (SELECT id, sent_at, (row_number() OVER (ORDER BY id) - 1) / 10 AS b
             FROM stripe_usage_outbox
             WHERE status = 'sent' AND call_count > 1 AND id % 20 = 0) r
       GROUP BY b""",
    # pause / resume pairs, tenant mappings, user creations
    """INSERT INTO bench_audit
       SELECT CAST(:start AS timestamptz) + i * interval '6 days' + d * interval '20 min',
              'ops@bench.example', CASE d WHEN 0 THEN 'pause' ELSE 'resume' END, NULL,
              CASE d WHEN 0 THEN 'Stripe incident, pausing until resolved' END, NULL
       FROM generate_series(0, 9) AS i, generate_series(0, 1) AS d""",
    """INSERT INTO bench_audit
       SELECT CAST(:start AS timestamptz) - interval '1 day' + i * interval '1 min',
              'admin@bench.example', 'tenant_map', NULL,
              'tenant-' || lpad(i::text, :digits, '0') || ' -> cus_tenant'
                  || lpad(i::text, :digits, '0'),
              NULL
       FROM generate_series(0, :mapped - 1) AS i""",
    """INSERT INTO bench_audit
       SELECT CAST(:start AS timestamptz) - interval '2 days' + i * interval '1 min',
              'admin@bench.example', 'user_create', NULL, 'user' || i || '@bench.example', NULL
       FROM generate_series(1, 9) AS i""",
    """CREATE TEMP TABLE bench_audit_n ON COMMIT DROP AS
       SELECT row_number() OVER (ORDER BY at, action) AS id, * FROM bench_audit""",
    """INSERT INTO audit_log (id, at, actor, action, event_ids, event_count, reason_code, note)
       SELECT id, at, actor, action, array_to_string(ids, ','), coalesce(cardinality(ids), 0),
              reason_code, note
       FROM bench_audit_n ORDER BY id""",
    """INSERT INTO audit_log_events (audit_id, event_id)
       SELECT id, unnest(ids) FROM bench_audit_n WHERE ids IS NOT NULL""",
    """SELECT setval(pg_get_serial_sequence('audit_log', 'id'),
                     (SELECT max(id) FROM audit_log))""",
    """UPDATE stripe_usage_outbox o
       SET resolved_at = a.at, updated_at = a.at, resolved_by = a.actor,
           resolve_reason = a.reason_code, resolve_note = a.note
       FROM (SELECT at, actor, reason_code, note, unnest(ids) AS event_id
             FROM bench_audit_n WHERE action = 'resolve') a
       WHERE o.id = a.event_id""",
]


def load(url: str, n: int, log: Callable[[str], None],
         shape: Shape = DEFAULT_SHAPE) -> dict[str, float]:
    """Fill the migrated schema at ``url`` and ANALYZE it; return the time each step took.
    Every generated time is before the moment the load starts."""
    from sqlalchemy import create_engine

    from webapp.models import utcnow

    now = utcnow()
    start = now - timedelta(days=shape.days)
    params = {"now": now, "start": start, "step": timedelta(days=shape.days) / n, "n": n,
              "mapped": shape.mapped, "named": shape.named_unmapped, "tenants": shape.tenants,
              "unmapped_share": shape.unmapped_share, "skew": shape.skew,
              "digits": shape.digits, "past_window": DEAD_PAST_WINDOW,
              "exhausted": DEAD_EXHAUSTED}
    times: dict[str, float] = {}
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("SET LOCAL synchronous_commit = off"))
            conn.execute(text("SET LOCAL work_mem = '64MB'"))
            # The generating statements are one-offs: JIT-compiling their expressions would
            # take longer than running them.
            conn.execute(text("SET LOCAL jit = off"))
            conn.execute(text("SELECT setseed(0.42)"))
            with _timed(times, "tenants"):
                conn.execute(text(LOAD_TENANTS), params)
            with _timed(times, "outbox"):
                conn.execute(text(LOAD_OUTBOX), params)
            log(f"dashboard: {n:,} outbox rows in {times['outbox']:.1f} s")
            with _timed(times, "attempts"):
                conn.execute(text(LOAD_ATTEMPTS), params)
            with _timed(times, "audit"):
                for stmt in LOAD_AUDIT:
                    conn.execute(text(stmt), params)
            with _timed(times, "stripe side"):
                for stmt in LOAD_STRIPE_SIDE:
                    conn.execute(text(stmt), params)
        log(f"dashboard: attempts in {times['attempts']:.1f} s, audit in "
            f"{times['audit']:.1f} s")
        with _timed(times, "analyze"):
            maintain(engine, "ANALYZE", LOADED_TABLES)
    finally:
        engine.dispose()
    return times


LOADED_TABLES = ("stripe_usage_outbox", "stripe_usage_attempts", "audit_log",
                 "audit_log_events", "billing_tenants", "users", "stripe_meters",
                 "stripe_events", "stripe_error_samples", "reconciliation_runs",
                 "reconciliation_mismatches")
ROLLUP_TABLES = ("usage_sent_rollup", "usage_sent_monthly", "usage_sent_yearly",
                 "usage_sent_day", "attempt_rollup", "rollup_state")


def maintain(engine: Any, command: str, tables: tuple[str, ...]) -> None:
    """``ANALYZE`` or ``VACUUM (ANALYZE)`` each table (outside a transaction)."""
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        conn.execute(text("SET maintenance_work_mem = '256MB'"))
        for table in tables:
            conn.execute(text(f"{command} {table}"))


@contextmanager
def _timed(times: dict[str, float], key: str) -> Iterator[None]:
    t0 = time.perf_counter()
    try:
        yield
    finally:
        times[key] = time.perf_counter() - t0


def table_counts(engine: Any) -> dict[str, int]:
    with engine.connect() as conn:
        out = {f"status:{s}": int(n) for s, n in conn.execute(text(
            "SELECT status, count(*) FROM stripe_usage_outbox GROUP BY status"))}
        for table in ("stripe_usage_outbox", "stripe_usage_attempts", "audit_log",
                      "audit_log_events", "billing_tenants", "users"):
            out[table] = int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())
        out["tenants_with_events"] = int(conn.execute(text(
            "SELECT count(DISTINCT tenant_id) FROM stripe_usage_outbox")).scalar_one())
    return out


# -- users and the client ------------------------------------------------------------------------

def make_users(engine: Any) -> None:
    """An admin and 9 others, hashed with small scrypt parameters (as ``tests/web`` do): the
    same code path, milliseconds instead of a second each."""
    from werkzeug.security import generate_password_hash

    import webapp.users as users
    from webapp.models import utcnow

    def fast(password: str) -> str:
        return generate_password_hash(password, method="scrypt:1024:8:1")

    real = users.hash_password
    users.hash_password = fast
    try:
        users.create_user(engine, ADMIN, PASSWORD, "admin", now=utcnow())
        for i in range(1, 10):
            users.create_user(engine, f"user{i}@bench.example", PASSWORD,
                              ("viewer", "operator", "admin")[i % 3], now=utcnow())
    finally:
        users.hash_password = real


def signed_in_client(app: Any) -> Any:
    """A test client signed in as the admin through the log-in form."""
    client = app.test_client()
    page = client.get("/login").get_data(as_text=True)
    token = CSRF_RE.search(page)
    if token is None:
        raise BenchFailure("dashboard: the log-in form has no CSRF field")
    resp = client.post("/login", data={"email": ADMIN, "password": PASSWORD,
                                       "csrf_token": token.group(1)})
    if resp.status_code != 303:
        raise BenchFailure(f"dashboard: log-in failed: HTTP {resp.status_code}")
    return client


def routes(engine: Any, settings: Any, shape: Shape = DEFAULT_SHAPE) -> list[Route]:
    """Every page (whole and as its htmx fragment) and every GET endpoint, with parameters
    chosen to be the heavy cases: the largest tenant, a filter matching thousands of dead
    events, a text search matching a few (so it reads them all)."""
    from webapp.models import utcnow
    from webapp.outbox.sql import as_utc
    from webapp.read.dead_letters import DeadFilters, dead_letters
    from webapp.read.paging import Cursor

    with engine.connect() as conn:
        big_tenant = conn.execute(text(
            "SELECT tenant_id FROM stripe_usage_outbox GROUP BY tenant_id "
            "ORDER BY count(*) DESC LIMIT 1")).scalar_one()
        dead_tenant = conn.execute(text(
            "SELECT tenant_id FROM stripe_usage_outbox WHERE status = 'dead' "
            "GROUP BY tenant_id ORDER BY count(*) DESC LIMIT 1")).scalar_one()
        resolved_event = conn.execute(text(
            "SELECT o.id FROM stripe_usage_outbox o WHERE status = 'resolved' "
            "AND call_count = 12 ORDER BY id LIMIT 1")).scalar_one()
        dead_event = conn.execute(text(
            "SELECT id FROM stripe_usage_outbox WHERE status = 'dead' AND call_count = 12 "
            "ORDER BY id DESC LIMIT 1")).scalar_one()
        search = conn.execute(text(
            "SELECT stripe_customer_id FROM billing_tenants WHERE tenant_id = :t"),
            {"t": shape.tenant(42)}).scalar_one()
    window = settings.dedupe_window_seconds
    page1 = dead_letters(engine, DeadFilters(), now=utcnow(), window_seconds=window, limit=50)
    assert page1.next is not None, "fewer than 51 dead events"
    with engine.connect() as conn:
        # Deep in the list: the cursor after 10,000 dead events (page 201 of 50), or as deep
        # as a smaller load goes.
        dead = conn.execute(text("SELECT count(*) FROM stripe_usage_outbox "
                                 "WHERE status = 'dead'")).scalar_one()
        skip = max(50, min(10_000, (dead - 60) // 50 * 50))
        at, ident = conn.execute(text(
            "SELECT dead_at, id FROM stripe_usage_outbox WHERE status = 'dead' "
            "ORDER BY dead_at DESC, id DESC OFFSET :k LIMIT 1"), {"k": skip - 1}).one()
    deep = Cursor(as_utc(at), int(ident))  # type: ignore[arg-type]
    today = utcnow().date()
    days = shape.days
    span = f"from={(today - timedelta(days=days - 1)).isoformat()}&to={today.isoformat()}"
    pages = [
        ("overview", "/"),
        ("overview, chart of the last hour", "/?range=1h"),
        ("overview, chart of 7 days", "/?range=7d"),
        ("overview, chart of 30 days", "/?range=30d"),
        ("retries", "/retries"),
        ("tenants (this month)", "/tenants"),
        ("tenants (last 30 days)", f"/tenants?from={(today - timedelta(days=29)).isoformat()}"
                                   f"&to={today.isoformat()}"),
        (f"tenants ({days} days)", f"/tenants?{span}"),
        (f"tenant page ({big_tenant}, the largest)", f"/tenants/{big_tenant}"),
        (f"tenant page ({big_tenant}, {days} days)", f"/tenants/{big_tenant}?{span}"),
        ("mappings", "/mappings"),
        ("dead letters", "/dead-letters"),
        (f"dead letters, tenant={dead_tenant}", f"/dead-letters?tenant={dead_tenant}"),
        ("dead letters, code=api_error", "/dead-letters?code=api_error"),
        (f"dead letters, q={search} (text search)", f"/dead-letters?q={search}"),
        ("dead letters, page 2 (keyset cursor)",
         f"/dead-letters?after={page1.next.encode()}"),
        (f"dead letters, page {skip // 50 + 1} (keyset cursor)",
         f"/dead-letters?after={deep.encode()}"),
        ("dead-letter groups", "/dead-letters/groups"),
        ("requeue-all preview, code=api_error", "/dead-letters/requeue-all?code=api_error"),
        (f"event {resolved_event} (resolved, 12 attempts, audited)",
         f"/events/{resolved_event}"),
        (f"event {dead_event} (dead, 12 attempts)", f"/events/{dead_event}"),
        ("audit log", "/audit"),
        ("users", "/users"),
        ("rejected by Stripe", "/rejected"),
        ("rejected, code=meter_event_customer_not_found",
         "/rejected?code=meter_event_customer_not_found"),
        ("requeue-all rejected preview", "/rejected/requeue-all"),
        ("reconciliation (last run, 60 mismatches)", "/reconciliation"),
        ("Stripe's side", "/stripe"),
        ("events list (no filter)", "/events"),
        ("events list, page 2", f"/events?before={dead_event}"),
        ("events list, status=dead", "/events?status=dead"),
        ("events list, status=retrying, attempts=3", "/events?status=retrying&attempts=3"),
        (f"events list, tenant={big_tenant}", f"/events?tenant={big_tenant}"),
        (f"events list, tenant={big_tenant}, meter, this month, sent",
         f"/events?tenant={big_tenant}&meter=api_requests&status=sent"
         f"&created_from={today.replace(day=1).isoformat()}"),
        ("events list, near the 35-day limit", "/events?age=near"),
        ("events list, due now", "/events?due=1"),
        ("events list, sent today", f"/events?sent_from={today.isoformat()}"),
        ("events list, code=api_error", "/events?status=dead&code=api_error"),
        # The search box: a name matching many tenants, a key prefix matching thousands of
        # events (capped), and misses that still ask each index (a request id, a customer)
        # and read every tenant's name. One hit redirects: not a page to measure.
        ("search, tenant name (many)", "/search?q=Tenant%201"),
        ("search, key prefix (thousands, capped)", "/search?q=usage_log:1"),
        ("search, a request id (miss)", "/search?q=req_0000nothere"),
        ("search, a customer (miss)", "/search?q=cus_nobody"),
        ("search, nothing matches", "/search?q=nothing-matches-this"),
    ]
    out = []
    for label, path in pages:
        out.append(Route(label, path))
        out.append(Route(label, path, htmx=True))
    out += [Route(label, path, page=False) for label, path in (
        ("tenants CSV (this month)", "/tenants.csv"),
        (f"tenants CSV ({days} days)", f"/tenants.csv?{span}"),
        (f"tenants CSV ({days} days, {big_tenant})", f"/tenants.csv?{span}&tenant={big_tenant}"),
        ("audit CSV", "/audit.csv"),
        ("events CSV, status=dead, code=api_error", "/events.csv?status=dead&code=api_error"),
        ("Prometheus metrics", "/metrics"),
        ("state of sending (the status line, for monitors)", "/health"),
        ("liveness", "/healthz"),
        ("readiness", "/readyz"))]
    return out


def prepare_reports(client: Any, routes: list[Route]) -> dict[str, float]:
    """Press "Prepare the report" (as a person does, through the form) for every period among
    ``routes`` that the Tenants & usage page reads from a report (every tenant, longer than
    a month), so that the page and its CSV show one; return the seconds each took, by
    period. Raises unless each answers with its redirect to the page."""
    from urllib.parse import parse_qs, urlsplit

    from webapp.read.usage_reports import from_report

    took: dict[str, float] = {}
    for route in routes:
        where = urlsplit(route.path)
        q = parse_qs(where.query)
        if where.path != "/tenants" or "from" not in q or "to" not in q:
            continue
        start, end = date.fromisoformat(q["from"][0]), date.fromisoformat(q["to"][0])
        period = f"{start.isoformat()} to {end.isoformat()}"
        if not from_report(start, end) or period in took:
            continue
        token = CSRF_RE.search(client.get(route.path).get_data(as_text=True))
        if token is None:
            raise BenchFailure(f"dashboard: {route.path} has no CSRF field")
        t0 = time.perf_counter()
        resp = client.post("/tenants/report", data={"from": start.isoformat(),
                                                    "to": end.isoformat(),
                                                    "csrf_token": token.group(1)})
        took[period] = time.perf_counter() - t0
        if resp.status_code != 303:
            raise BenchFailure(f"dashboard: preparing the report of {period}: HTTP "
                               f"{resp.status_code}: {resp.get_data(as_text=True)[:300]!r}")
    return took


def key(route: Route) -> str:
    return f"{route.label} [{route.kind}]"


def sample(client: Any, route: Route) -> Sample:
    """One request, its body read whole (a download's chunk by chunk, as a client receives
    it). Raises on anything but 200."""
    headers = {"HX-Request": "true"} if route.htmx else {}
    t0 = time.perf_counter()
    resp = client.get(route.path, headers=headers, buffered=not route.download)
    try:
        chunks = iter(resp.response)
        first = next(chunks, b"")
        first_ms = (time.perf_counter() - t0) * 1000
        size, lines = len(first), first.count(b"\n")
        for chunk in chunks:
            size += len(chunk)
            lines += chunk.count(b"\n")
        ms = (time.perf_counter() - t0) * 1000
    finally:
        resp.close()
    if resp.status_code != 200:
        raise BenchFailure(f"dashboard: {route.path}: HTTP {resp.status_code}: {first[:300]!r}")
    if route.download:
        return Sample(first_ms, ms, size, lines)
    return Sample(ms, ms, size)


# -- the section ---------------------------------------------------------------------------------

def run(db: BenchDatabase, *, events: int, runs: int, log: Any = print) -> DashboardResults:
    from webapp import create_app, services_of
    from webapp.config import Settings
    from webapp.models import utcnow
    from webapp.outbox import rollups

    res = DashboardResults(rows=events, runs=runs)
    res.samples = max(MIN_SAMPLES, 10 * runs)
    schema, url = db.migrated_schema("dash")
    try:
        log(f"dashboard: loading {events:,} outbox rows into {schema}")
        res.load_seconds = load(url, events, log)
        settings = Settings(database_url=url, stripe_api_key="sk_test_x")
        app = create_app({"TESTING": True}, settings=settings, start_drainer=False)
        engine = services_of(app).engine
        with engine.connect() as conn:
            res.autovacuum = str(conn.execute(text("SHOW autovacuum")).scalar_one())
        t0 = time.perf_counter()
        folded = rollups.fold(
            engine, now=utcnow(), margin=rollups.fold_margin(settings.claim_timeout_seconds))
        res.fold_seconds = time.perf_counter() - t0
        assert folded, "the first fold must fold"
        log(f"dashboard: first fold of the rollups in {res.fold_seconds:.1f} s")
        # What autoanalyze does within a minute of the fold (this cluster may run without
        # autovacuum): the rollups' first statistics.
        maintain(engine, "ANALYZE", ROLLUP_TABLES)
        make_users(engine)
        res.counts = table_counts(engine)
        log("dashboard: " + ", ".join(f"{k} {v:,}" for k, v in res.counts.items()))
        client = signed_in_client(app)
        res.routes = routes(engine, settings)
        # The long period's page and CSV read a prepared report: prepared once, as a person
        # would before looking (its time is a row of its own).
        res.report_seconds = prepare_reports(client, res.routes)

        # Right after the bulk load: analyzed, never vacuumed (no page all-visible yet).
        log(f"dashboard: before VACUUM: sampling {len(res.routes)} routes "
            f"{FRESH_SAMPLES} times each")
        res.fresh = measure(client, res.routes, FRESH_SAMPLES, warmup=1, log=log)

        # The steady state autovacuum keeps a table of settled rows in: the floor's measure.
        t0 = time.perf_counter()
        maintain(engine, "VACUUM (ANALYZE)", LOADED_TABLES + ROLLUP_TABLES)
        res.vacuum_seconds = time.perf_counter() - t0
        log(f"dashboard: VACUUM (ANALYZE) in {res.vacuum_seconds:.1f} s; sampling "
            f"{len(res.routes)} routes {res.samples} times each, round-robin")
        res.figures = measure(client, res.routes, res.samples, warmup=WARMUP, log=log)
        res.notifier_ms = notifier_looks(engine, settings, NOTIFIER_LOOKS)
        log(f"dashboard: the notifier's look at the alerts: median "
            f"{statistics.median(res.notifier_ms):.1f} ms of {NOTIFIER_LOOKS}")
        engine.dispose()
    finally:
        db.drop_schema(schema)
    res.raw = {"counts": res.counts, "load_seconds": res.load_seconds,
               "fold_seconds": res.fold_seconds, "vacuum_seconds": res.vacuum_seconds,
               "autovacuum": res.autovacuum,
               "bytes": {k: t.bytes for k, t in res.figures.items()},
               "paths": {key(r): r.path for r in res.routes},
               "download_total_ms": {key(r): res.figures[key(r)].total_ms.values
                                     for r in res.routes if r.download},
               "before_vacuum_ms": {k: t.ms.values for k, t in res.fresh.items()},
               "report_seconds": res.report_seconds, "notifier_ms": res.notifier_ms}
    return res


#: How many looks of the notifier are timed; the share of a process's time they may take at
#: the default cadence (``NOTIFY_CHECK_SECONDS``, 30 s).
NOTIFIER_LOOKS = 30
FLOOR_NOTIFIER_SHARE = 0.01


def notifier_looks(engine: Any, settings: Any, n: int) -> list[float]:
    """Time ``n`` looks of the notifier at the alerts on the loaded table, as a worker makes
    them: read every alert the Overview shows, compare with the kinds' rows, write what
    changed (the first look starts the alerts the loaded rows raise; the rest find them on)."""
    from webapp.worker.notify import Notifier

    notifier = Notifier(engine, settings)
    out = []
    for _ in range(n + 1):
        t0 = time.perf_counter()
        notifier.run_once()
        out.append((time.perf_counter() - t0) * 1000)
    return out[1:]


def measure(client: Any, routes: list[Route], samples: int, *, warmup: int,
            log: Any) -> dict[str, Timing]:
    """Warm every route up, then sample them round-robin."""
    for route in routes:
        for _ in range(warmup):
            sample(client, route)
    timings = {key(r): Timing() for r in routes}
    for i in range(samples):
        for route in routes:
            timings[key(route)].add(sample(client, route))
        if (i + 1) % 10 == 0:
            log(f"dashboard: round {i + 1}/{samples}")
    return timings


def judge(f: Figure) -> tuple[float, float, bool]:
    med, high = statistics.median(f.values), p95(f.values)
    return med, high, med < FLOOR_MEDIAN_MS and high < FLOOR_P95_MS


def p95(values: list[float]) -> float:
    """Nearest-rank 95th percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def rows(res: DashboardResults) -> list[Row]:
    c = res.counts
    sent = c.get("status:sent", 0)
    total = c.get("stripe_usage_outbox", 0)
    statuses = ", ".join(f"{s} {c.get('status:' + s, 0):,}" for s in
                         ("sent", "pending", "processing", "retrying", "dead", "resolved"))
    load_total = sum(res.load_seconds.values())
    floor = f"median < {FLOOR_MEDIAN_MS:.0f} ms, p95 < {FLOOR_P95_MS:.0f} ms"
    out = [Row(SECTION, f"load: {total:,} outbox rows ({sent / max(total, 1):.1%} sent), "
                        f"{c.get('stripe_usage_attempts', 0):,} attempts, "
                        f"{c.get('audit_log', 0):,} audit entries, "
                        f"{c.get('tenants_with_events', 0)} tenants × 2 meters, {DAYS} days "
                        "(set-based SQL, product indexes in place, then ANALYZE)",
               f"{load_total:.0f} s", "", "",
               f"{statuses}; " + ", ".join(f"{k} {v:.1f} s"
                                            for k, v in res.load_seconds.items())),
           Row(SECTION, "the notifier's look at the alerts (every alert of the Overview, each "
                        "kind's row compared; a worker's maintenance thread, every "
                        "NOTIFY_CHECK_SECONDS = 30 s)",
               f"median {statistics.median(res.notifier_ms):.1f} ms, p95 "
               f"{p95(res.notifier_ms):.1f} ms" if res.notifier_ms else "—",
               f"< {FLOOR_NOTIFIER_SHARE:.0%} of a process's time",
               verdict(bool(res.notifier_ms) and statistics.median(res.notifier_ms)
                       < FLOOR_NOTIFIER_SHARE * 30_000),
               (f"{statistics.median(res.notifier_ms) / 30_000:.3%} of one process's time at "
                "the default cadence; never on a page view or in a drain pass"
                if res.notifier_ms else ""),
               floor_name="the notifier's looks take < 1% of a worker's time"),
           Row(SECTION, "first fold of the rollups (`rollups.fold` on the loaded table)",
               f"{res.fold_seconds:.1f} s", "", "",
               "paid once, by the folder service's first run after deploying on such a "
               "table (page views never fold)")]
    for period, seconds in res.report_seconds.items():
        out.append(Row(SECTION, f"\"Prepare the report\" of every tenant, {period} (the "
                                "button: a POST that sums the period and redirects)",
                       f"{seconds * 1000:,.0f} ms", "", "",
                       "run once, before sampling; the page and CSV of that period below "
                       "read the report"))
    fresh_misses = []
    worst_fresh: tuple[float, str] = (0.0, "")
    for route in res.routes:
        k = key(route)
        med, high, ok = judge(res.fresh[k].ms)
        worst_fresh = max(worst_fresh, (med, k))
        if not ok:
            fresh_misses.append(f"{k} {med:.0f} ms (p95 {high:.0f})")
    out.append(Row(SECTION, "before any VACUUM (right after the bulk load: analyzed, no page "
                            f"all-visible yet; autovacuum is {res.autovacuum} on this "
                            f"cluster); {FRESH_SAMPLES} samples a route, informational",
                   f"{len(fresh_misses)} of {len(res.routes)} routes miss; worst median "
                   f"{worst_fresh[0]:.1f} ms ({worst_fresh[1]})", floor,
                   "", "misses: " + ("; ".join(fresh_misses) or "none")))
    out.append(Row(SECTION, "then `VACUUM (ANALYZE)` (the steady state autovacuum keeps "
                            "settled rows in); every figure below is after it",
                   f"{res.vacuum_seconds:.1f} s", "", "",
                   f"each route: median of {res.samples} samples (min–max of the samples), "
                   "p95 nearest-rank; round-robin over the routes after "
                   f"{WARMUP} warm-ups each; client.get + reading the body, in process "
                   "(a download: to its first chunk, the floor's measure; its whole time "
                   "is in its notes)"))
    worst_med: tuple[float, str] = (0.0, "")
    worst_p95: tuple[float, str] = (0.0, "")
    all_ok = True
    for route in res.routes:
        k = key(route)
        t = res.figures[k]
        f = t.ms
        med, high, ok = judge(f)
        all_ok &= ok
        worst_med = max(worst_med, (med, k))
        worst_p95 = max(worst_p95, (high, k))
        kind = "htmx fragment" if route.htmx else route.kind
        first = "first byte " if route.download else ""
        out.append(Row(SECTION, f"`GET {_short(route.path)}` {route.label} ({kind})",
                       f"{first}{med:.1f} ms ({f.lo:.1f}–{f.hi:.1f}); p95 {high:.1f} ms",
                       floor, verdict(ok),
                       t.download_note() if route.download else f"{t.bytes:,} bytes"))
    out.append(Row(SECTION, f"every page and fragment ({len(res.routes)} routes)",
                   f"worst median {worst_med[0]:.1f} ms ({worst_med[1]}); worst p95 "
                   f"{worst_p95[0]:.1f} ms ({worst_p95[1]})", floor, verdict(all_ok),
                   "a download (CSV export) is judged on its first byte",
                   floor_name=f"dashboard: every page median < {FLOOR_MEDIAN_MS:.0f} ms and "
                              f"p95 < {FLOOR_P95_MS:.0f} ms at {res.rows:,} rows"))
    return out


def _short(path: str) -> str:
    """A path for the table: long cursors cut, pipes escaped."""
    path = re.sub(r"(after=[^&]{12})[^&]*", r"\1…", path)
    return path.replace("|", "\\|")
