"""The notification settings (``NOTIFY_*``), parsed and checked once: where alerts go (Slack,
a signed webhook, email), which kinds each channel is sent, and how often. Read by
:func:`webapp.config.Settings.from_env`; a bad value stops start-up with one line naming the
variable."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote, urlparse

from .env_values import ConfigError, number, url

#: The alert kinds that are sent to people (stable names: ``NOTIFY_*_KINDS`` and messages use
#: them).
NOTIFY_KINDS = ("holding", "stalled", "paused", "dead_letters", "rejected", "reconcile_mismatch",
                "meter_missing", "unmapped_waiting", "invoice_risk", "late_usage")
NOTIFY_CHANNELS = ("slack", "webhook", "email")
#: What each channel is called on the screen.
CHANNEL_NAMES = {"slack": "Slack", "webhook": "the webhook", "email": "email"}


@dataclass(frozen=True)
class Smtp:
    """``NOTIFY_SMTP_URL`` taken apart."""

    host: str
    port: int
    #: ``smtps``: TLS from the first byte; ``smtp``: STARTTLS when the server offers it.
    tls: bool
    user: str | None = None
    password: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Notify:
    """Where alerts go and how often (``NOTIFY_*``). A channel is on when its URL is set."""

    slack_webhook_url: str | None = field(default=None, repr=False)
    webhook_url: str | None = field(default=None, repr=False)
    webhook_secret: str | None = field(default=None, repr=False)
    smtp: Smtp | None = None
    email_from: str | None = None
    email_to: tuple[str, ...] = ()
    remind_seconds: float = 14400.0
    #: How long an alert must stay away before it is announced as resolved.
    resolve_seconds: float = 60.0
    #: How often the alerts are looked at.
    check_seconds: float = 30.0
    #: The dashboard's address, for the links in messages.
    dashboard_url: str = "http://127.0.0.1:8000"
    #: channel -> the kinds it is sent (every kind when not named).
    kinds: dict[str, tuple[str, ...]] = field(default_factory=dict)
    timeout_seconds: float = 10.0
    #: The first retry's wait after a failed delivery (doubling up to an hour).
    retry_seconds: float = 30.0

    @property
    def channels(self) -> tuple[str, ...]:
        """The channels that are set up, in a fixed order."""
        on = {"slack": self.slack_webhook_url, "webhook": self.webhook_url, "email": self.smtp}
        return tuple(c for c in NOTIFY_CHANNELS if on[c])

    @property
    def secrets(self) -> tuple[str | None, ...]:
        """What no log line may say: Slack's URL (its path is its key), the webhook's URL
        (its query may hold a token) and secret, the SMTP password."""
        return (self.slack_webhook_url, self.webhook_url, self.webhook_secret,
                self.smtp.password if self.smtp else None)

    def kinds_for(self, channel: str) -> tuple[str, ...]:
        return self.kinds.get(channel, NOTIFY_KINDS)


def notify_settings(env: Mapping[str, str], *,
                    dashboard_default: str = "http://127.0.0.1:8000") -> Notify:
    """The ``NOTIFY_*`` variables, each refused with one line naming it when it is wrong;
    ``dashboard_default``: where the dashboard serves (``HOST``/``PORT``) when
    ``NOTIFY_DASHBOARD_URL`` is unset."""
    slack = url("NOTIFY_SLACK_WEBHOOK_URL", env.get("NOTIFY_SLACK_WEBHOOK_URL"))
    hook = url("NOTIFY_WEBHOOK_URL", env.get("NOTIFY_WEBHOOK_URL"))
    secret = (env.get("NOTIFY_WEBHOOK_SECRET") or "").strip() or None
    if hook and not secret:
        raise ConfigError("NOTIFY_WEBHOOK_SECRET must be set with NOTIFY_WEBHOOK_URL: every "
                          "message is signed with it so the receiver can check it came from here")
    if secret is not None and (len(secret) < 16 or not secret.isprintable()):
        raise ConfigError("NOTIFY_WEBHOOK_SECRET must be at least 16 printable characters")
    smtp = _smtp(env.get("NOTIFY_SMTP_URL"))
    sender = (env.get("NOTIFY_EMAIL_FROM") or "").strip() or None
    to = tuple(a.strip() for a in (env.get("NOTIFY_EMAIL_TO") or "").split(",") if a.strip())
    for name, addresses in (("NOTIFY_EMAIL_FROM", (sender,) if sender else ()),
                            ("NOTIFY_EMAIL_TO", to)):
        for a in addresses:
            if not _looks_like_address(a):
                raise ConfigError(f"{name}: {a!r} is not an email address")
    if smtp is not None and (sender is None or not to):
        raise ConfigError("NOTIFY_SMTP_URL needs NOTIFY_EMAIL_FROM and NOTIFY_EMAIL_TO "
                          "(who the alerts come from and go to)")
    kinds = {}
    for channel in NOTIFY_CHANNELS:
        name = f"NOTIFY_{channel.upper()}_KINDS"
        raw = (env.get(name) or "").strip()
        if raw:
            named = tuple(k.strip() for k in raw.split(",") if k.strip())
            unknown = [k for k in named if k not in NOTIFY_KINDS]
            if unknown:
                raise ConfigError(f"{name}: unknown kind(s) {', '.join(unknown)}; the kinds are "
                                  + ", ".join(NOTIFY_KINDS))
            kinds[channel] = named
    return Notify(
        slack_webhook_url=slack, webhook_url=hook, webhook_secret=secret, smtp=smtp,
        email_from=sender, email_to=to,
        remind_seconds=number(env, "NOTIFY_REMIND_SECONDS", 14400.0, low=60.0,
                              high=30 * 86_400, unit_suffixes=True),
        resolve_seconds=number(env, "NOTIFY_RESOLVE_SECONDS", 60.0, low=0.0, high=86_400),
        check_seconds=number(env, "NOTIFY_CHECK_SECONDS", 30.0, low=1.0, high=3600),
        dashboard_url=(url("NOTIFY_DASHBOARD_URL", env.get("NOTIFY_DASHBOARD_URL"))
                       or dashboard_default),
        kinds=kinds,
        timeout_seconds=number(env, "NOTIFY_TIMEOUT_SECONDS", 10.0, low=0.5, high=60),
        retry_seconds=number(env, "NOTIFY_RETRY_SECONDS", 30.0, low=0.1, high=3600))


def _smtp(raw: str | None) -> Smtp | None:
    if not raw or not raw.strip():
        return None
    parsed = urlparse(raw.strip())
    if parsed.scheme not in ("smtp", "smtps") or not parsed.hostname:
        raise ConfigError("NOTIFY_SMTP_URL must be smtp://[user:pass@]host:port or "
                          "smtps://[user:pass@]host:port")
    try:
        port = parsed.port or (465 if parsed.scheme == "smtps" else 587)
    except ValueError:
        raise ConfigError("NOTIFY_SMTP_URL: the port is not a number") from None
    return Smtp(parsed.hostname, port, parsed.scheme == "smtps",
                unquote(parsed.username) if parsed.username else None,
                unquote(parsed.password) if parsed.password else None)


def _looks_like_address(a: str) -> bool:
    local, at, domain = a.rpartition("@")
    return bool(at and local and "." in domain and a.isprintable() and " " not in a
                and "," not in a)
