"""gunicorn's logging, made to match ours (``billing-outbox serve`` passes
``--logger-class webapp.gunicorn_logging.GunicornLogger``):

- with ``LOG_FORMAT=json`` its error and access lines are JSON objects like every other line;
- the redaction filter is on its handlers from the start (the master process logs too);
- the access log leaves out what would bury everything else: successful requests for static
  files, the probes and metrics, and the dashboard's htmx fragments (``HX-Request`` GETs
  answered 2xx/304: live panels refresh themselves every few seconds). Every action (POST),
  every error and every page load stays.
"""

from __future__ import annotations

import logging
from typing import Any

from gunicorn.glogging import Logger

from .config import ConfigError, log_format
from .logging_setup import REDACTOR, JsonFormatter

_QUIET_PATHS = ("/static/", "/healthz", "/readyz", "/health", "/metrics", "/favicon")


class QuietAccess(logging.Filter):
    """Drops the access lines of routine, successful polling (see the module's docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        atoms: Any = record.args
        if not isinstance(atoms, dict):
            return True
        status = str(atoms.get("s", ""))
        if not (status.startswith("2") or status == "304"):
            return True
        path = str(atoms.get("U") or "")
        if path.startswith(_QUIET_PATHS):
            return False
        polling = atoms.get("m") == "GET" and atoms.get("{hx-request}i") == "true"
        return not polling


class GunicornLogger(Logger):  # type: ignore[misc]
    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        try:
            as_json = log_format() == "json"
        except ConfigError:  # the app refuses it with one line as it starts
            as_json = False
        for log in (self.error_log, self.access_log):
            for handler in log.handlers:
                if as_json:
                    handler.setFormatter(JsonFormatter())
                if REDACTOR not in handler.filters:
                    handler.addFilter(REDACTOR)
        quiet = [f for f in self.access_log.filters if isinstance(f, QuietAccess)]
        if not quiet:
            self.access_log.addFilter(QuietAccess())
