"""The composition root: :func:`create_app` wires settings, engine, services, blueprints,
commands and the in-app scheduler, here and nowhere else. Nothing starts at import time."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from typing import Any

from flask import Flask
from sqlalchemy import Engine

from . import config
from .config import ConfigError, Settings, embedded_secret_key
from .db import make_engine, make_session_factory
from .env_values import secret_key_problem
from .logging_setup import Redactor, configure_logging, install_redaction
from .services import EXTENSION, Services, services_of


def _beside_package(name: str) -> str:
    """``templates`` or ``static``: inside the installed package (a wheel carries them as
    ``webapp/templates`` and ``webapp/static``), else beside it in the checkout."""
    package = os.path.dirname(os.path.abspath(__file__))
    installed = os.path.join(package, name)
    return installed if os.path.isdir(installed) else os.path.join(os.path.dirname(package),
                                                                    name)


TEMPLATES = _beside_package("templates")
STATIC = _beside_package("static")


def create_app(test_config: Mapping[str, Any] | None = None, *,
               settings: Settings | None = None, engine: Engine | None = None,
               start_drainer: bool | None = None, pages: bool = True) -> Flask:
    """Build the app. Raises ``ConfigError`` (one line naming the variable) on bad settings.

    The in-app drainer starts only when ``DRAINER_ENABLED``, outside tests, and not for CLI
    commands (``billing-outbox serve`` starts it in the gunicorn workers). ``pages=False``
    leaves out the dashboard's blueprints (and the modules behind them): ``billing-outbox``
    builds the app that way, for its commands, which serve no request; the settings are
    checked and the services built all the same.
    """
    test_config = dict(test_config or {})
    testing = bool(test_config.get("TESTING"))
    settings = settings or Settings.from_env(testing=testing)
    configure_logging(settings.log_format, settings.log_level,
                      secrets=(settings.secret_key, settings.stripe_api_key,
                               settings.stripe_webhook_secret, settings.metrics_token,
                               *settings.notify.secrets))

    app = Flask(__name__, template_folder=TEMPLATES, static_folder=STATIC,
                instance_path=str(config.INSTANCE_DIR))
    app.config.update(
        SECRET_KEY=_secret_key(settings, testing),
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=_cookie_secure(settings),
        PERMANENT_SESSION_LIFETIME=int(settings.session_max_age_seconds),
        MAX_CONTENT_LENGTH=1 * 1024 * 1024,
    )
    app.config.update(test_config)
    Redactor.know([app.config["SECRET_KEY"]])

    if settings.trusted_proxies:
        # Behind N reverse proxies: the client's address and scheme from their headers (the
        # log-in throttle counts per address; the Secure cookie needs to know it is HTTPS).
        from werkzeug.middleware.proxy_fix import ProxyFix

        n = settings.trusted_proxies
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=n, x_proto=n, x_host=n)  # type: ignore[method-assign]

    if engine is None:
        from .pooler import pooled_engine_options

        engine = make_engine(settings.database_url, **pooled_engine_options(settings))
    app.extensions[EXTENSION] = Services(settings, engine, make_session_factory(engine))

    from .web.cli import register_commands

    if pages:
        from .web import register_blueprints

        register_blueprints(app)
    register_commands(app)

    if start_drainer is None:
        start_drainer = (settings.drainer_enabled and not testing
                         and not settings.run_by_flask_cli)
    if start_drainer:
        from .web.scheduler import start_scheduler

        start_scheduler(services_of(app))
    install_redaction()  # handlers set up by gunicorn or the host before the app was built
    return app


GENERATE_KEY = "python -c 'import secrets; print(secrets.token_urlsafe(48))'"


def _is_embedded(settings: Settings) -> bool:
    """The embedded default: SQLite in ``instance/``, DATABASE_URL not set."""
    return settings.database_url.startswith("sqlite") and not settings.database_url_given


def _secret_key(settings: Settings, testing: bool) -> str:
    """The key that signs sessions. Outside tests, debug and the embedded default a weak one
    (short, one character repeated, a placeholder) stops start-up with one line naming it."""
    if settings.secret_key:
        if not (testing or settings.debug or _is_embedded(settings)):
            problem = secret_key_problem(settings.secret_key)
            if problem:
                raise ConfigError(f"{problem}; generate one with {GENERATE_KEY}")
        return settings.secret_key
    if testing:
        return secrets.token_urlsafe(32)
    if _is_embedded(settings):
        return embedded_secret_key()
    raise ConfigError(f"SECRET_KEY must be set (it signs sessions); e.g. {GENERATE_KEY}")


def _cookie_secure(settings: Settings) -> bool:
    if settings.session_cookie_secure is not None:
        return settings.session_cookie_secure
    # The embedded default serves plain http on 127.0.0.1; anything else is behind TLS.
    return not _is_embedded(settings)
