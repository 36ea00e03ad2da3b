"""Logging: plain text by default, one JSON object a line with ``LOG_FORMAT=json``."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data, ensure_ascii=False)


_configured = False


def configure_logging(fmt: str, level: str) -> None:
    """Install one handler on the ``webapp`` logger (idempotent)."""
    global _configured
    logger = logging.getLogger("webapp")
    logger.setLevel(level)
    if _configured:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False
    _configured = True
