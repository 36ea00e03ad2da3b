"""Lane locks, one module per backend behind one interface (:class:`LaneLocks`):
PostgreSQL advisory locks, SQLite byte-range locks, or this process alone."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from sqlalchemy import Engine

from .base import Lane, LaneLocks, lane_key
from .memory import ProcessLaneLocks
from .postgres import AdvisoryLaneLocks
from .sqlite import FileLaneLocks

__all__ = ["AdvisoryLaneLocks", "FileLaneLocks", "Lane", "LaneLocks", "ProcessLaneLocks",
           "lane_key", "lane_locks"]


def lane_locks(engine: Engine | None, *,
               monotonic: Callable[[], float] = time.monotonic) -> LaneLocks:
    """The lane locks for ``engine``'s database: advisory locks on PostgreSQL, a lock file
    beside a SQLite database file, the process alone for an in-memory database."""
    if engine is not None and engine.dialect.name == "postgresql":
        return AdvisoryLaneLocks(engine, monotonic=monotonic)
    path = _sqlite_lock_path(engine)
    return FileLaneLocks(path) if path is not None else ProcessLaneLocks()


def _sqlite_lock_path(engine: Engine | None) -> str | None:
    """The lane lock file next to a SQLite database file (None for in-memory databases)."""
    if engine is None or engine.dialect.name != "sqlite":
        return None
    database = engine.url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return os.path.abspath(database) + ".lanes"
