"""Settings read from the environment, validated once, in one place.

Every variable of the operator contract is parsed here. A bad value stops start-up with one
line naming the variable (``ConfigError``); nothing falls back silently.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .env_values import ConfigError as ConfigError
from .env_values import boolean, choice, integer, number, url
from .notify_settings import CHANNEL_NAMES as CHANNEL_NAMES
from .notify_settings import NOTIFY_CHANNELS as NOTIFY_CHANNELS
from .notify_settings import NOTIFY_KINDS as NOTIFY_KINDS
from .notify_settings import Notify as Notify
from .notify_settings import Smtp as Smtp
from .notify_settings import notify_settings

#: Where the embedded default keeps its database file and generated secret key.
INSTANCE_DIR = Path(os.environ.get("BILLING_OUTBOX_INSTANCE_DIR", Path.cwd() / "instance"))

STRIPE_API_BASE_DEFAULT = "https://api.stripe.com"
#: Where Stripe serves ``POST /v2/billing/meter_event_stream``: a host of its own, not the API's
#: (the path's ``servers`` in Stripe's OpenAPI spec, and stripe-python's ``meter_events`` base
#: address, ``stripe.DEFAULT_METER_EVENTS_API_BASE``).
STRIPE_METER_EVENTS_BASE_DEFAULT = "https://meter-events.stripe.com"
#: How meter events go to Stripe: ``v1`` (one per call) or ``v2_stream`` (sessions, up to 100
#: events per request).
METER_EVENT_APIS = ("v1", "v2_stream")
#: ``STRIPE_MAX_REQUESTS_PER_SECOND`` when unset, per API, with a live-mode key. v1: 20 calls/s
#: keeps a worker well inside Stripe's 25 calls/s in test mode. v2_stream: 100 requests/s of up
#: to 100 events each (10,000 events/s) is 1% of the stream's 10,000 requests/s in live mode,
#: and leaves room for several workers on one account; an explicit value is kept as given in
#: either mode.
DEFAULT_MAX_REQUESTS_PER_SECOND = {"v1": 20.0, "v2_stream": 100.0}
#: The default with any key that is not a live-mode one (``sk_test_``, ``rk_test_``, or none): in
#: a sandbox, stream requests count against the basic limit of 25 requests/s like every other
#: call (docs.stripe.com/rate-limits, "Meter events"), so streams get v1's 20.
SANDBOX_MAX_REQUESTS_PER_SECOND = 20.0
#: ``OUTBOX_BATCH_SIZE`` when unset, per API. A stream request carries up to 100 events, so a
#: claimed batch of 2,000 fills about twenty requests, paced by the request rate and sent
#: ``OUTBOX_CONCURRENCY`` at a time. A pass lasts about that pacing (0.2 s at 100 requests/s)
#: plus one request's answer; the larger the batch, the less often that wait is paid.
DEFAULT_BATCH_SIZE = {"v1": 200, "v2_stream": 2000}
# stripe-python's RequestsClient connect timeout; a call can take this plus the read timeout.
CONNECT_TIMEOUT_SECONDS = 3.05


#: Stripe accepts a meter event up to 35 days after its timestamp: the rows must outlive that
#: (a late duplicate of a pruned event is then refused by Stripe as too old, never billed).
MIN_RETENTION_DAYS = 36


@dataclass(frozen=True)
class Settings:
    """Validated configuration. Build it with :meth:`from_env`; tests use :meth:`with_overrides`."""

    database_url: str
    secret_key: str | None = field(default=None, repr=False)
    stripe_api_key: str | None = field(default=None, repr=False)
    stripe_api_base: str = STRIPE_API_BASE_DEFAULT
    #: ``STRIPE_METER_EVENTS_BASE``; None: see :attr:`meter_events_base`.
    stripe_meter_events_base: str | None = None
    stripe_meter_event_name: str = "api_requests"
    stripe_timeout_seconds: float = 10.0
    stripe_max_requests_per_second: float = 20.0
    #: ``v1``: one event per call; ``v2_stream``: meter event sessions, up to 100 per request.
    meter_event_api: str = "v1"
    batch_size: int = 200
    max_attempts: int = 12
    initial_backoff_seconds: float = 2.0
    max_backoff_seconds: float = 1800.0
    claim_timeout_seconds: float = 120.0
    poll_interval_seconds: float = 1.0
    concurrency: int = 8
    dedupe_window_seconds: float = 23 * 3600.0
    drainer_enabled: bool = True
    stripe_webhook_secret: str | None = field(default=None, repr=False)
    events_poll_seconds: float = 60.0
    meters_refresh_seconds: float = 300.0
    #: How often Stripe's subscriptions and invoices are read (``STRIPE_BILLING_REFRESH_SECONDS``).
    billing_refresh_seconds: float = 900.0
    #: A draft invoice finalizing within this long with usage unsent is a risk to warn of.
    invoice_risk_seconds: float = 3600.0
    reconcile_interval_seconds: float = 86400.0
    reconcile_settle_seconds: float = 3600.0
    log_format: str = "text"
    log_level: str = "INFO"
    session_idle_seconds: float = 3600.0
    session_max_age_seconds: float = 12 * 3600.0
    metrics_token: str | None = field(default=None, repr=False)
    trusted_proxies: int = 0
    retention_days: int = 40
    prune_interval_seconds: float = 3600.0
    #: Where alerts are sent (``NOTIFY_*``); see :class:`Notify`.
    notify: Notify = field(default_factory=lambda: Notify())
    #: Whether ``DATABASE_URL`` was set (if not: the embedded default, SQLite in instance/).
    database_url_given: bool = False
    #: ``DATABASE_DIRECT_URL``: a direct (or session-pooled) PostgreSQL connection for what
    #: holds session state (the lane and shard locks) when ``DATABASE_URL`` goes through a
    #: transaction pooler; None: ``DATABASE_URL`` serves both (see ``webapp.pooler``).
    database_direct_url: str | None = field(default=None, repr=False)
    #: ``SESSION_COOKIE_SECURE`` as set; None: secure everywhere but the embedded default.
    session_cookie_secure: bool | None = None
    #: ``FLASK_DEBUG``: Flask's debug mode (any secret key accepted, as by the embedded
    #: default).
    debug: bool = False
    #: Started by ``flask run`` (``FLASK_RUN_FROM_CLI``): no in-app drainer.
    run_by_flask_cli: bool = False
    testing: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    # -- derived -----------------------------------------------------------------------------
    @property
    def is_postgres(self) -> bool:
        return self.database_url.startswith("postgresql")

    @property
    def stripe_mode(self) -> str:
        """``live``, ``test`` or ``none`` from the API key's prefix (never the key itself)."""
        key = self.stripe_api_key or ""
        if "_live_" in key[:8]:
            return "live"
        if "_test_" in key[:8]:
            return "test"
        return "none" if not key else "unknown"

    @property
    def meter_events_base(self) -> str:
        """Where meter event streams go: ``STRIPE_METER_EVENTS_BASE`` when set; else, when
        ``STRIPE_API_BASE`` names something other than Stripe's API (a local fake, a proxy),
        that; else Stripe's meter events host."""
        if self.stripe_meter_events_base:
            return self.stripe_meter_events_base
        if self.stripe_api_base != STRIPE_API_BASE_DEFAULT:
            return self.stripe_api_base
        return STRIPE_METER_EVENTS_BASE_DEFAULT

    @property
    def longest_call_seconds(self) -> float:
        """The longest one Stripe call can take: connect plus read timeout (no SDK retries)."""
        return CONNECT_TIMEOUT_SECONDS + self.stripe_timeout_seconds

    def backoff_seconds(self, attempt: int) -> float:
        """Backoff before attempt ``attempt + 1`` (without jitter): min(max, initial·2^(n−1))."""
        exponent = min(max(attempt - 1, 0), 60)
        return min(self.max_backoff_seconds, self.initial_backoff_seconds * (2.0**exponent))

    def retry_horizon_seconds(self) -> float:
        """Worst-case time from the first attempt to the last automatic one (jitter included)."""
        total = 0.0
        for attempt in range(1, self.max_attempts):
            total += self.backoff_seconds(attempt) * 1.25 + self.longest_call_seconds
        return total

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, testing: bool = False) -> Settings:
        """Parse and validate the environment; raise ``ConfigError`` naming the bad variable."""
        env = os.environ if env is None else env
        api = choice(env, "STRIPE_METER_EVENT_API", "v1", METER_EVENT_APIS)
        api_key = _api_key(env.get("STRIPE_API_KEY"))
        database_url = _database_url(env.get("DATABASE_URL"))
        settings = cls(
            database_url=database_url,
            secret_key=env.get("SECRET_KEY") or None,
            stripe_api_key=api_key,
            stripe_api_base=(url("STRIPE_API_BASE", env.get("STRIPE_API_BASE"))
                             or STRIPE_API_BASE_DEFAULT),
            stripe_meter_events_base=url("STRIPE_METER_EVENTS_BASE",
                                          env.get("STRIPE_METER_EVENTS_BASE")),
            stripe_meter_event_name=default_meter(env),
            stripe_timeout_seconds=number(env, "STRIPE_TIMEOUT_SECONDS", 10.0, low=0.1, high=120),
            stripe_max_requests_per_second=number(
                env, "STRIPE_MAX_REQUESTS_PER_SECOND", default_rate(api, api_key),
                low=0.1, high=10_000),
            meter_event_api=api,
            batch_size=integer(env, "OUTBOX_BATCH_SIZE", DEFAULT_BATCH_SIZE[api], low=1,
                                high=10_000),
            max_attempts=integer(env, "OUTBOX_MAX_ATTEMPTS", 12, low=1, high=1000),
            initial_backoff_seconds=number(
                env, "OUTBOX_INITIAL_BACKOFF_SECONDS", 2.0, low=0.0, high=86_400),
            max_backoff_seconds=number(env, "OUTBOX_MAX_BACKOFF_SECONDS", 1800.0, low=0.0,
                                        high=86_400),
            claim_timeout_seconds=number(env, "OUTBOX_CLAIM_TIMEOUT_SECONDS", 120.0, low=1.0,
                                          high=86_400),
            poll_interval_seconds=number(env, "OUTBOX_POLL_INTERVAL_SECONDS", 1.0, low=0.01,
                                          high=3600),
            concurrency=integer(env, "OUTBOX_CONCURRENCY", 8, low=1, high=256),
            dedupe_window_seconds=number(env, "OUTBOX_DEDUPE_WINDOW", 23 * 3600.0, low=60.0,
                                          high=24 * 3600.0, unit_suffixes=True),
            drainer_enabled=boolean(env, "DRAINER_ENABLED", True),
            stripe_webhook_secret=_webhook_secret(env.get("STRIPE_WEBHOOK_SECRET")),
            events_poll_seconds=number(env, "STRIPE_EVENTS_POLL_SECONDS", 60.0, low=1.0,
                                        high=86_400),
            meters_refresh_seconds=number(env, "STRIPE_METERS_REFRESH_SECONDS", 300.0,
                                           low=5.0, high=86_400),
            billing_refresh_seconds=number(env, "STRIPE_BILLING_REFRESH_SECONDS", 900.0,
                                            low=30.0, high=86_400),
            invoice_risk_seconds=number(env, "INVOICE_RISK_SECONDS", 3600.0, low=60.0,
                                         high=72 * 3600.0),
            reconcile_interval_seconds=number(env, "RECONCILE_INTERVAL_SECONDS", 86400.0,
                                               low=0.0, high=30 * 86_400),
            reconcile_settle_seconds=number(env, "RECONCILE_SETTLE_SECONDS", 3600.0,
                                             low=0.0, high=7 * 86_400),
            session_idle_seconds=number(env, "SESSION_IDLE_TIMEOUT_SECONDS", 3600.0, low=300.0,
                                         high=30 * 86_400),
            session_max_age_seconds=number(env, "SESSION_MAX_AGE_SECONDS", 12 * 3600.0,
                                            low=300.0, high=90 * 86_400),
            metrics_token=_metrics_token(env.get("METRICS_TOKEN")),
            trusted_proxies=integer(env, "TRUSTED_PROXIES", 0, low=0, high=5),
            retention_days=integer(env, "OUTBOX_RETENTION_DAYS", 40, low=1, high=36_500),
            prune_interval_seconds=number(env, "OUTBOX_PRUNE_INTERVAL_SECONDS", 3600.0,
                                           low=60.0, high=7 * 86_400),
            notify=notify_settings(env, dashboard_default=listen_address(env)),
            log_format=log_format(env),
            log_level=choice(env, "LOG_LEVEL", "INFO",
                              ("DEBUG", "INFO", "WARNING", "ERROR"), upper=True),
            database_url_given=bool((env.get("DATABASE_URL") or "").strip()),
            database_direct_url=_direct_url(env.get("DATABASE_DIRECT_URL"), database_url),
            session_cookie_secure=(None if not (env.get("SESSION_COOKIE_SECURE") or "").strip()
                                   else boolean(env, "SESSION_COOKIE_SECURE", False)),
            debug=_flag(env.get("FLASK_DEBUG")),
            run_by_flask_cli=env.get("FLASK_RUN_FROM_CLI") == "true",
            testing=testing,
        )
        settings.validate()
        return settings

    def with_overrides(self, **changes: Any) -> Settings:
        """A copy with some fields changed, validated again."""
        settings = replace(self, **changes)
        settings.validate()
        return settings

    def validate(self) -> None:
        """Refuse combinations that would break a delivery guarantee."""
        if self.retention_days < MIN_RETENTION_DAYS:
            raise ConfigError(
                f"OUTBOX_RETENTION_DAYS must be at least {MIN_RETENTION_DAYS} "
                f"(got {self.retention_days}): Stripe accepts events for 35 days, and the "
                "24-hour dedupe and reconciliation need the rows until then")
        if self.session_idle_seconds > self.session_max_age_seconds:
            raise ConfigError(
                "SESSION_IDLE_TIMEOUT_SECONDS must not exceed SESSION_MAX_AGE_SECONDS "
                f"({self.session_idle_seconds:g} > {self.session_max_age_seconds:g})")
        if self.max_backoff_seconds < self.initial_backoff_seconds:
            raise ConfigError(
                "OUTBOX_MAX_BACKOFF_SECONDS must be at least OUTBOX_INITIAL_BACKOFF_SECONDS "
                f"({self.max_backoff_seconds:g} < {self.initial_backoff_seconds:g})")
        # A worker never starts a call unless its claim has this much time left, so the claim
        # must be longer than the margin, or a claimed event could be sent by two workers.
        if self.claim_timeout_seconds < 2 * self.claim_safety_margin_seconds:
            raise ConfigError(
                "OUTBOX_CLAIM_TIMEOUT_SECONDS must be at least "
                f"{2 * self.claim_safety_margin_seconds:g}s: twice the longest one Stripe call "
                f"can take ({self.longest_call_seconds:g}s with STRIPE_TIMEOUT_SECONDS="
                f"{self.stripe_timeout_seconds:g}) plus a margin; otherwise an expired claim "
                "could let two workers send the same event at once")
        if self.retry_horizon_seconds() >= self.dedupe_window_seconds:
            raise ConfigError(
                "OUTBOX_MAX_ATTEMPTS / OUTBOX_INITIAL_BACKOFF_SECONDS / OUTBOX_MAX_BACKOFF_SECONDS "
                f"give a retry horizon of {self.retry_horizon_seconds() / 3600:.1f}h, beyond "
                f"OUTBOX_DEDUPE_WINDOW ({self.dedupe_window_seconds / 3600:.1f}h): retries past "
                "Stripe's 24-hour dedupe window could bill twice")

    @property
    def claim_safety_margin_seconds(self) -> float:
        """Time a claim must still have before a worker may start one more call under it."""
        return self.longest_call_seconds + 5.0


# -- parsers -------------------------------------------------------------------------------------

def _database_url(raw: str | None) -> str:
    if not raw:
        INSTANCE_DIR.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{INSTANCE_DIR / 'billing-outbox.sqlite3'}"
    url = raw.strip()
    for prefix in ("postgres://", "postgresql://", "postgresql+psycopg://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    if url.startswith("sqlite://"):
        return url
    scheme = url.split(":", 1)[0] if ":" in url else url
    raise ConfigError(
        f"DATABASE_URL: unsupported scheme {scheme!r}; use postgresql://… (psycopg 3) or sqlite:///…")


def _direct_url(raw: str | None, database_url: str) -> str | None:
    if not raw or not raw.strip():
        return None
    if not database_url.startswith("postgresql"):
        raise ConfigError("DATABASE_DIRECT_URL is for PostgreSQL: set DATABASE_URL to "
                          "postgresql://… too, or unset DATABASE_DIRECT_URL")
    if not raw.strip().startswith(("postgres://", "postgresql://", "postgresql+psycopg://")):
        raise ConfigError("DATABASE_DIRECT_URL must be a postgresql://… URL")
    return _database_url(raw)


def _api_key(raw: str | None) -> str | None:
    if not raw:
        return None
    key = raw.strip()
    if not key.startswith(("sk_", "rk_")):
        raise ConfigError("STRIPE_API_KEY must be a secret (sk_…) or restricted (rk_…) key")
    return key


def _webhook_secret(raw: str | None) -> str | None:
    if not raw:
        return None
    secret = raw.strip()
    if not secret.startswith("whsec_") or len(secret) < 16:
        raise ConfigError("STRIPE_WEBHOOK_SECRET must be the signing secret Stripe showed when "
                          "the event destination was created (whsec_…)")
    return secret


def _metrics_token(raw: str | None) -> str | None:
    if not raw:
        return None
    token = raw.strip()
    if len(token) < 16 or not token.isprintable() or " " in token:
        raise ConfigError("METRICS_TOKEN must be at least 16 printable characters without "
                          "spaces (a Prometheus bearer token)")
    return token


def log_format(env: Mapping[str, str] | None = None) -> str:
    """``LOG_FORMAT``: ``text`` or ``json`` (gunicorn's logger reads it before the app is
    built)."""
    return choice(os.environ if env is None else env, "LOG_FORMAT", "text", ("text", "json"))


def listen_address(env: Mapping[str, str] | None = None) -> str:
    """Where ``make run`` serves (``HOST``, ``PORT``), as its first words say."""
    env = os.environ if env is None else env
    return f"http://{env.get('HOST', '127.0.0.1')}:{env.get('PORT', '8000')}"


def _flag(raw: str | None) -> bool:
    """A flag Flask reads leniently (``FLASK_DEBUG``): on for 1/true/yes/on, off otherwise."""
    return (raw or "").strip().lower() in ("1", "true", "yes", "on")


def default_rate(api: str, api_key: str | None) -> float:
    """``STRIPE_MAX_REQUESTS_PER_SECOND`` when unset: the API's default with a live-mode key,
    within test mode's 25 requests/s with any other (streams count against it there)."""
    if api_key is not None and "_live_" in api_key[:8]:
        return DEFAULT_MAX_REQUESTS_PER_SECOND[api]
    return min(DEFAULT_MAX_REQUESTS_PER_SECOND[api], SANDBOX_MAX_REQUESTS_PER_SECOND)


def default_meter(env: Mapping[str, str] | None = None) -> str:
    """The meter an event that names none goes to (``STRIPE_METER_EVENT_NAME``), read as
    :meth:`Settings.from_env` reads it: ``enqueue_usage`` runs in the application's own
    process, which may never build the settings."""
    return _meter((os.environ if env is None else env).get("STRIPE_METER_EVENT_NAME"),
                  "api_requests")


def _meter(raw: str | None, default: str) -> str:
    if raw is None or raw == "":
        return default
    if len(raw) > 100 or not raw.isprintable() or raw.strip() != raw:
        raise ConfigError("STRIPE_METER_EVENT_NAME must be 1–100 printable characters")
    return raw


def embedded_secret_key() -> str:
    """The secret key kept in ``instance/`` for the embedded default, created on first use."""
    INSTANCE_DIR.mkdir(parents=True, exist_ok=True)
    path = INSTANCE_DIR / "secret_key"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(48))
    return path.read_text().strip()
