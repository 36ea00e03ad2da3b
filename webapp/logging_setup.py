"""Logging: plain text by default, one JSON object a line with ``LOG_FORMAT=json``.

Every handler of every logger (ours, gunicorn's, werkzeug's, SQLAlchemy's, the root's) gets one
:class:`Redactor`: passwords, password hashes, Stripe keys, webhook secrets, bearer tokens and the
configured secrets themselves are replaced before a line is written, in messages and tracebacks.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Iterable
from datetime import UTC, datetime

REDACTED = "[redacted]"

#: What a secret looks like wherever it appears in a line.
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # Stripe secret, restricted and publishable keys; webhook signing secrets; session tokens.
    (re.compile(r"\b((?:sk|rk|pk)_(?:live|test))_[0-9A-Za-z]{4,}"), r"\1_" + REDACTED),
    (re.compile(r"\bwhsec_[0-9A-Za-z+/=]{4,}"), "whsec_" + REDACTED),
    # werkzeug password hashes: scrypt:32768:8:1$salt$hex, pbkdf2:sha256:600000$salt$hex.
    (re.compile(r"\b(?:scrypt|pbkdf2)(?::[0-9A-Za-z]+)*\$[^\s'\",)\]}]+"), REDACTED),
    (re.compile(r"(?i)\b(authorization:\s*)?bearer\s+[^\s'\",]+"), r"\1Bearer " + REDACTED),
    # password=…, "password": "…", api_key: … (form bodies, dict reprs, URLs).
    (re.compile(r"(?i)((?:password|passwd|secret|api_key|apikey|token)"
                r"[\"']?\s*[:=]\s*[\"']?)[^\s\"',&)}]+"), r"\1" + REDACTED),
)


class Redactor(logging.Filter):
    """Rewrites a record's message, traceback and stack so no secret reaches a handler."""

    _lock = threading.Lock()
    _known: tuple[str, ...] = ()

    @classmethod
    def know(cls, secrets: Iterable[str | None]) -> None:
        """Also redact these exact values (the configured secret key, API key, …)."""
        with cls._lock:
            values = set(cls._known) | {s for s in secrets if s and len(s) >= 8}
            cls._known = tuple(sorted(values, key=len, reverse=True))

    @classmethod
    def redact(cls, text: str) -> str:
        for value in cls._known:
            if value in text:
                text = text.replace(value, REDACTED)
        for pattern, replacement in _PATTERNS:
            text = pattern.sub(replacement, text)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "_redacted", False):
            return True
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string must not hide the line
            message = f"{record.msg!r} {record.args!r}"
        record.msg, record.args = self.redact(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        setattr(record, "_redacted", True)  # noqa: B010 - LogRecord takes any attribute
        return True


REDACTOR = Redactor()


def install_redaction() -> None:
    """Put the redactor on every handler of every logger there is now (idempotent)."""
    loggers: list[logging.Logger] = [logging.getLogger()]
    loggers += [lg for lg in logging.Logger.manager.loggerDict.values()
                if isinstance(lg, logging.Logger)]
    for logger in loggers:
        for handler in logger.handlers:
            if REDACTOR not in handler.filters:
                handler.addFilter(REDACTOR)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info or record.exc_text:
            data["exc"] = record.exc_text or self.formatException(record.exc_info)  # type: ignore[arg-type]
        return json.dumps(data, ensure_ascii=False)


_configured = False


class _NotSkippedTicks(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "maximum number of running instances reached" not in record.getMessage()



def configure_logging(fmt: str, level: str, secrets: Iterable[str | None] = ()) -> None:
    """Install one handler on the ``webapp`` logger (idempotent), and the redactor on it and
    on every other handler; ``secrets`` are redacted wherever they appear."""
    global _configured
    Redactor.know(secrets)
    logger = logging.getLogger("webapp")
    logger.setLevel(level)
    if not _configured:
        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
        # APScheduler runs the in-app drain every poll interval and says so at INFO (two lines
        # a tick); its warnings and errors go through the same handler, in the same format,
        # except "skipped: maximum number of running instances" (a long pass outlasting the
        # interval is expected: the next tick coalesces).
        scheduler = logging.getLogger("apscheduler")
        scheduler.setLevel(logging.WARNING)
        scheduler.addHandler(handler)
        scheduler.propagate = False
        handler.addFilter(_NotSkippedTicks())
        _configured = True
    install_redaction()
