"""``Settings.from_env``: defaults, URL normalisation, and a one-line ``ConfigError`` naming the
variable for every bad value or unsafe combination (never a silent fallback)."""

from __future__ import annotations

from pathlib import Path

import pytest

from webapp import config
from webapp.config import ConfigError, Settings

DB = "sqlite:////tmp/billing-outbox-config-test.sqlite3"


def load(**env: str) -> Settings:
    return Settings.from_env({"DATABASE_URL": DB, **env})


def refused(**env: str) -> str:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"DATABASE_URL": DB, **env})
    message = str(info.value)
    assert "\n" not in message  # one line
    return message


# -- defaults -------------------------------------------------------------------------------------

def test_defaults() -> None:
    s = load()
    assert s.database_url == DB
    assert s.secret_key is None
    assert s.stripe_api_key is None and s.stripe_mode == "none"
    assert s.stripe_api_base == "https://api.stripe.com"
    assert s.stripe_meter_event_name == "api_requests"
    assert s.stripe_timeout_seconds == 10.0
    assert s.stripe_max_requests_per_second == 20.0  # under test mode's 25/s
    assert s.meter_event_api == "v1"
    assert (s.batch_size, s.max_attempts, s.concurrency) == (200, 12, 8)
    assert (s.initial_backoff_seconds, s.max_backoff_seconds) == (2.0, 1800.0)
    assert s.claim_timeout_seconds == 120.0
    assert s.poll_interval_seconds == 1.0
    assert s.dedupe_window_seconds == 23 * 3600.0
    assert s.drainer_enabled is True
    assert (s.log_format, s.log_level) == ("text", "INFO")
    assert s.testing is False
    # the defaults themselves respect every guarantee
    assert s.claim_timeout_seconds >= 2 * s.claim_safety_margin_seconds
    assert s.retry_horizon_seconds() < s.dedupe_window_seconds


def test_empty_values_mean_the_default() -> None:
    s = load(OUTBOX_BATCH_SIZE="", STRIPE_TIMEOUT_SECONDS="  ", DRAINER_ENABLED="",
             STRIPE_API_KEY="", STRIPE_METER_EVENT_NAME="", LOG_LEVEL="")
    assert (s.batch_size, s.stripe_timeout_seconds, s.drainer_enabled) == (200, 10.0, True)
    assert s.stripe_api_key is None and s.stripe_meter_event_name == "api_requests"


def test_no_database_url_is_the_embedded_sqlite_file(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "INSTANCE_DIR", tmp_path / "instance")
    s = Settings.from_env({})
    assert s.database_url == f"sqlite:///{tmp_path / 'instance' / 'billing-outbox.sqlite3'}"
    assert (tmp_path / "instance").is_dir()
    assert not s.is_postgres


def test_every_value_read() -> None:
    s = load(SECRET_KEY="s3cret", STRIPE_API_KEY="rk_live_abc", STRIPE_API_BASE="http://127.0.0.1:9/",
             STRIPE_METER_EVENT_NAME="storage_gb", STRIPE_TIMEOUT_SECONDS="4",
             STRIPE_MAX_REQUESTS_PER_SECOND="24", OUTBOX_BATCH_SIZE=" 50 ",
             OUTBOX_MAX_ATTEMPTS="8", OUTBOX_INITIAL_BACKOFF_SECONDS="1",
             OUTBOX_MAX_BACKOFF_SECONDS="60", OUTBOX_CLAIM_TIMEOUT_SECONDS="40",
             OUTBOX_POLL_INTERVAL_SECONDS="2", OUTBOX_CONCURRENCY="3",
             OUTBOX_DEDUPE_WINDOW="20h", DRAINER_ENABLED="false", LOG_FORMAT="JSON",
             LOG_LEVEL="debug")
    assert s.secret_key == "s3cret"
    assert s.stripe_api_key == "rk_live_abc" and s.stripe_mode == "live"
    assert s.stripe_api_base == "http://127.0.0.1:9"  # trailing slash dropped
    assert s.stripe_meter_event_name == "storage_gb"
    assert (s.stripe_timeout_seconds, s.stripe_max_requests_per_second) == (4.0, 24.0)
    assert (s.batch_size, s.max_attempts, s.concurrency) == (50, 8, 3)
    assert (s.initial_backoff_seconds, s.max_backoff_seconds) == (1.0, 60.0)
    assert (s.claim_timeout_seconds, s.poll_interval_seconds) == (40.0, 2.0)
    assert s.dedupe_window_seconds == 20 * 3600.0
    assert s.drainer_enabled is False
    assert (s.log_format, s.log_level) == ("json", "DEBUG")


def test_stripe_mode_from_key_prefix() -> None:
    assert load(STRIPE_API_KEY="sk_test_123").stripe_mode == "test"
    assert load(STRIPE_API_KEY="sk_live_123").stripe_mode == "live"


# -- DATABASE_URL ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "expected"), [
    ("postgres://u:p@db:5432/app", "postgresql+psycopg://u:p@db:5432/app"),
    ("postgresql://u@db/app?sslmode=require", "postgresql+psycopg://u@db/app?sslmode=require"),
    ("postgresql+psycopg://u@db/app", "postgresql+psycopg://u@db/app"),
    (" postgres://u@db/app ", "postgresql+psycopg://u@db/app"),
    ("sqlite:////var/lib/outbox.sqlite3", "sqlite:////var/lib/outbox.sqlite3"),
    ("sqlite://", "sqlite://"),
])
def test_database_url_normalised(raw: str, expected: str) -> None:
    s = Settings.from_env({"DATABASE_URL": raw})
    assert s.database_url == expected
    assert s.is_postgres is expected.startswith("postgresql")


# -- a bad value names its variable --------------------------------------------------------------

BAD = [
    ("DATABASE_URL", "mysql://x"),
    ("DATABASE_URL", "postgresql+psycopg2://u@db/app"),
    ("DATABASE_URL", "not a url"),
    ("STRIPE_API_KEY", "pk_test_123"),
    ("STRIPE_API_BASE", "ftp://example.com"),
    ("STRIPE_API_BASE", "http://"),
    ("STRIPE_API_BASE", "api.stripe.com"),
    ("STRIPE_METER_EVENT_NAME", " padded"),
    ("STRIPE_METER_EVENT_NAME", "m" * 101),
    ("STRIPE_METER_EVENT_NAME", "tab\there"),
    ("STRIPE_TIMEOUT_SECONDS", "abc"),
    ("STRIPE_TIMEOUT_SECONDS", "0"),
    ("STRIPE_TIMEOUT_SECONDS", "nan"),
    ("STRIPE_TIMEOUT_SECONDS", "inf"),
    ("STRIPE_TIMEOUT_SECONDS", "10s"),
    ("STRIPE_MAX_REQUESTS_PER_SECOND", "-1"),
    ("STRIPE_MAX_REQUESTS_PER_SECOND", "fast"),
    ("OUTBOX_BATCH_SIZE", "abc"),
    ("OUTBOX_BATCH_SIZE", "0"),
    ("OUTBOX_BATCH_SIZE", "1.5"),
    ("OUTBOX_BATCH_SIZE", "100000"),
    ("OUTBOX_MAX_ATTEMPTS", "0"),
    ("OUTBOX_MAX_ATTEMPTS", "three"),
    ("OUTBOX_INITIAL_BACKOFF_SECONDS", "x"),
    ("OUTBOX_INITIAL_BACKOFF_SECONDS", "-1"),
    ("OUTBOX_MAX_BACKOFF_SECONDS", "-1"),
    ("OUTBOX_MAX_BACKOFF_SECONDS", "1e9"),
    ("OUTBOX_CLAIM_TIMEOUT_SECONDS", "abc"),
    ("OUTBOX_CLAIM_TIMEOUT_SECONDS", "0.5"),
    ("OUTBOX_POLL_INTERVAL_SECONDS", "0"),
    ("OUTBOX_POLL_INTERVAL_SECONDS", "soon"),
    ("OUTBOX_CONCURRENCY", "0"),
    ("OUTBOX_CONCURRENCY", "1000"),
    ("OUTBOX_DEDUPE_WINDOW", "25h"),
    ("OUTBOX_DEDUPE_WINDOW", "30"),
    ("OUTBOX_DEDUPE_WINDOW", "1d"),
    ("DRAINER_ENABLED", "maybe"),
    ("DRAINER_ENABLED", "2"),
    ("LOG_FORMAT", "xml"),
    ("LOG_LEVEL", "TRACE"),
    ("STRIPE_METER_EVENT_API", "v2"),
    ("STRIPE_METER_EVENT_API", "stream"),
]


@pytest.mark.parametrize(("name", "value"), BAD, ids=[f"{n}={v[:12]!r}" for n, v in BAD])
def test_bad_value_names_the_variable(name: str, value: str) -> None:
    env = {name: value}
    if name == "DATABASE_URL":
        with pytest.raises(ConfigError) as info:
            Settings.from_env(env)
        message = str(info.value)
        assert "\n" not in message
    else:
        message = refused(**env)
    assert name in message, message


def test_meter_event_api_stream() -> None:
    assert load(STRIPE_METER_EVENT_API="v2_stream").meter_event_api == "v2_stream"
    assert load(STRIPE_METER_EVENT_API=" V2_Stream ").meter_event_api == "v2_stream"
    message = refused(STRIPE_METER_EVENT_API="v3")
    assert message == "STRIPE_METER_EVENT_API: expected one of v1, v2_stream, got 'v3'"


def test_request_rate_and_batch_size_defaults_follow_the_api() -> None:
    live = {"STRIPE_API_KEY": "sk_live_abc"}
    v1, v2 = load(**live), load(STRIPE_METER_EVENT_API="v2_stream", **live)
    assert (v1.stripe_max_requests_per_second, v1.batch_size) == (20.0, 200)
    assert (v2.stripe_max_requests_per_second, v2.batch_size) == (100.0, 2000)
    given = load(STRIPE_METER_EVENT_API="v2_stream", STRIPE_MAX_REQUESTS_PER_SECOND="20",
                 OUTBOX_BATCH_SIZE="200", **live)
    assert (given.stripe_max_requests_per_second, given.batch_size) == (20.0, 200)
    blank = load(STRIPE_METER_EVENT_API="v2_stream", OUTBOX_BATCH_SIZE=" ", **live)
    assert blank.batch_size == 2000


@pytest.mark.parametrize("key", ["sk_test_abc", "rk_test_abc", None, "sk_abc"])
@pytest.mark.parametrize("api", ["v1", "v2_stream"])
def test_a_sandbox_key_keeps_the_default_rate_within_test_modes_25(key: str | None,
                                                                    api: str) -> None:
    """In a sandbox, stream requests count against the basic 25 requests/s: without a
    live-mode key the default stays within it in both modes; a value set by hand is kept."""
    env = {"STRIPE_METER_EVENT_API": api, **({"STRIPE_API_KEY": key} if key else {})}
    assert load(**env).stripe_max_requests_per_second == 20.0
    assert load(STRIPE_MAX_REQUESTS_PER_SECOND="90", **env).stripe_max_requests_per_second == 90
    assert load(**env).batch_size == (2000 if api == "v2_stream" else 200)


def test_stream_host_follows_stripe_unless_set() -> None:
    """Neither base set: Stripe's two hosts. Only STRIPE_API_BASE (a local fake): streams go
    there too. STRIPE_METER_EVENTS_BASE set: streams go there, whatever the API base."""
    s = load()
    assert (s.stripe_api_base, s.meter_events_base) == (
        "https://api.stripe.com", "https://meter-events.stripe.com")
    s = load(STRIPE_API_BASE="http://127.0.0.1:12111/")
    assert s.meter_events_base == "http://127.0.0.1:12111"
    s = load(STRIPE_API_BASE="http://127.0.0.1:12111",
             STRIPE_METER_EVENTS_BASE=" http://127.0.0.1:12112/ ")
    assert (s.stripe_api_base, s.meter_events_base) == ("http://127.0.0.1:12111",
                                                        "http://127.0.0.1:12112")
    s = load(STRIPE_METER_EVENTS_BASE="https://meter-events.example.net")
    assert (s.stripe_api_base, s.meter_events_base) == ("https://api.stripe.com",
                                                        "https://meter-events.example.net")
    assert "STRIPE_METER_EVENTS_BASE" in refused(STRIPE_METER_EVENTS_BASE="ftp://x")


# -- DRAINER_ENABLED ------------------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "expected"), [
    ("true", True), ("TRUE", True), ("1", True), ("yes", True), ("on", True), (" True ", True),
    ("false", False), ("False", False), ("0", False), ("no", False), ("off", False),
])
def test_drainer_enabled(raw: str, expected: bool) -> None:
    assert load(DRAINER_ENABLED=raw).drainer_enabled is expected


# -- combinations that would break a guarantee -----------------------------------------------------

def test_claim_timeout_must_outlast_two_calls() -> None:
    # 2 × (3.05 connect + 1 read + 5 margin) = 18.1 s
    assert load(STRIPE_TIMEOUT_SECONDS="1", OUTBOX_CLAIM_TIMEOUT_SECONDS="18.1"
                ).claim_timeout_seconds == 18.1
    message = refused(STRIPE_TIMEOUT_SECONDS="1", OUTBOX_CLAIM_TIMEOUT_SECONDS="18")
    assert "OUTBOX_CLAIM_TIMEOUT_SECONDS" in message and "18.1" in message
    # the default claim (120 s) is too short for a 60 s HTTP timeout
    message = refused(STRIPE_TIMEOUT_SECONDS="60")
    assert "OUTBOX_CLAIM_TIMEOUT_SECONDS" in message and "STRIPE_TIMEOUT_SECONDS" in message


def test_max_backoff_below_initial_refused() -> None:
    message = refused(OUTBOX_INITIAL_BACKOFF_SECONDS="10", OUTBOX_MAX_BACKOFF_SECONDS="5")
    assert "OUTBOX_MAX_BACKOFF_SECONDS" in message and "OUTBOX_INITIAL_BACKOFF_SECONDS" in message


def test_retry_horizon_beyond_dedupe_window_refused() -> None:
    message = refused(OUTBOX_MAX_ATTEMPTS="100")  # 100 × up to 30 min ≫ 23 h
    assert "OUTBOX_MAX_ATTEMPTS" in message and "OUTBOX_DEDUPE_WINDOW" in message
    # a short window refuses the default policy (12 attempts, up to 30 min each)
    assert "OUTBOX_DEDUPE_WINDOW" in refused(OUTBOX_DEDUPE_WINDOW="1h")
    # the tests' policy: 30 attempts of at most 1 s backoff fit easily
    s = load(OUTBOX_MAX_ATTEMPTS="30", OUTBOX_INITIAL_BACKOFF_SECONDS="0.05",
             OUTBOX_MAX_BACKOFF_SECONDS="1", STRIPE_TIMEOUT_SECONDS="1",
             OUTBOX_CLAIM_TIMEOUT_SECONDS="19")
    assert s.retry_horizon_seconds() < 300


def test_retry_horizon_boundary() -> None:
    """The horizon (jitter included) must be strictly inside the window."""
    s = load(OUTBOX_MAX_ATTEMPTS="3", OUTBOX_INITIAL_BACKOFF_SECONDS="100",
             OUTBOX_MAX_BACKOFF_SECONDS="100", STRIPE_TIMEOUT_SECONDS="10")
    # 2 gaps × (100 × 1.25 + 13.05) = 276.1 s
    assert s.retry_horizon_seconds() == pytest.approx(276.1)
    assert load(OUTBOX_MAX_ATTEMPTS="3", OUTBOX_INITIAL_BACKOFF_SECONDS="100",
                OUTBOX_MAX_BACKOFF_SECONDS="100", STRIPE_TIMEOUT_SECONDS="10",
                OUTBOX_DEDUPE_WINDOW="277").dedupe_window_seconds == 277
    message = refused(OUTBOX_MAX_ATTEMPTS="3", OUTBOX_INITIAL_BACKOFF_SECONDS="100",
                      OUTBOX_MAX_BACKOFF_SECONDS="100", STRIPE_TIMEOUT_SECONDS="10",
                      OUTBOX_DEDUPE_WINDOW="276")
    assert "OUTBOX_DEDUPE_WINDOW" in message


@pytest.mark.parametrize(("raw", "seconds"), [
    ("3600", 3600.0), ("3600s", 3600.0), ("90m", 5400.0), ("12h", 43200.0), ("1.5h", 5400.0),
    ("24h", 86400.0),
])
def test_dedupe_window_units(raw: str, seconds: float) -> None:
    assert load(OUTBOX_DEDUPE_WINDOW=raw, OUTBOX_MAX_ATTEMPTS="2").dedupe_window_seconds == seconds


def test_fractional_seconds_accepted() -> None:
    s = load(STRIPE_TIMEOUT_SECONDS="2.5", STRIPE_MAX_REQUESTS_PER_SECOND="0.5",
             OUTBOX_INITIAL_BACKOFF_SECONDS="0.25", OUTBOX_MAX_BACKOFF_SECONDS="1.5",
             OUTBOX_CLAIM_TIMEOUT_SECONDS="30.5", OUTBOX_POLL_INTERVAL_SECONDS="0.05")
    assert s.stripe_timeout_seconds == 2.5
    assert s.stripe_max_requests_per_second == 0.5
    assert (s.initial_backoff_seconds, s.max_backoff_seconds) == (0.25, 1.5)
    assert s.claim_timeout_seconds == 30.5
    assert s.poll_interval_seconds == 0.05


def test_with_overrides_validates_again() -> None:
    s = load()
    assert s.with_overrides(batch_size=7).batch_size == 7
    with pytest.raises(ConfigError, match="OUTBOX_CLAIM_TIMEOUT_SECONDS"):
        s.with_overrides(claim_timeout_seconds=5.0)


def test_backoff_formula() -> None:
    s = load(OUTBOX_INITIAL_BACKOFF_SECONDS="2", OUTBOX_MAX_BACKOFF_SECONDS="60")
    assert [s.backoff_seconds(n) for n in range(1, 8)] == [2, 4, 8, 16, 32, 60, 60]
    assert s.backoff_seconds(0) == 2


def test_retention_below_36_days_refused() -> None:
    message = refused(OUTBOX_RETENTION_DAYS="35")
    assert "OUTBOX_RETENTION_DAYS" in message and "36" in message and "35 days" in message
    assert "OUTBOX_RETENTION_DAYS" in refused(OUTBOX_RETENTION_DAYS="forty")
    settings = load(OUTBOX_RETENTION_DAYS="36", OUTBOX_PRUNE_INTERVAL_SECONDS="600")
    assert (settings.retention_days, settings.prune_interval_seconds) == (36, 600.0)
    assert (load().retention_days, load().prune_interval_seconds) == (40, 3600.0)
    assert "OUTBOX_PRUNE_INTERVAL_SECONDS" in refused(OUTBOX_PRUNE_INTERVAL_SECONDS="1")


def test_direct_url_is_for_postgresql_and_never_shown() -> None:
    assert load().database_direct_url is None
    got = load(DATABASE_URL="postgres://app:pw@pooler:6432/db",
                DATABASE_DIRECT_URL="postgresql://app:s3cret-direct@db:5432/db")
    assert got.database_direct_url == "postgresql+psycopg://app:s3cret-direct@db:5432/db"
    assert "s3cret-direct" not in repr(got)
    assert load(DATABASE_URL="postgres://pooler/db",
                 DATABASE_DIRECT_URL="  ").database_direct_url is None
    message = refused(DATABASE_URL="sqlite:////tmp/x.sqlite3",
                      DATABASE_DIRECT_URL="postgresql://db/db")
    assert message.startswith("DATABASE_DIRECT_URL is for PostgreSQL")
    message = refused(DATABASE_URL="postgres://pooler/db", DATABASE_DIRECT_URL="mysql://db/db")
    assert message == "DATABASE_DIRECT_URL must be a postgresql://… URL"
