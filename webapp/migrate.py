"""Schema migrations with Alembic, driven from code (no alembic.ini to find at run time)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from .db import reading

MIGRATIONS = Path(__file__).with_name("migrations")


def alembic_config(engine: Engine) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    # configparser treats "%" as interpolation; URLs carry %-escapes (e.g. options=-c…%3D…).
    url = engine.url.render_as_string(hide_password=False).replace("%", "%%")
    cfg.set_main_option("sqlalchemy.url", url)
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate to ``revision`` (the newest by default); safe to run again."""
    cfg = alembic_config(engine)
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            # Two replicas starting at once must not both run the same migration.
            conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7261530041)")
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def head_revision(engine: Engine) -> str | None:
    return ScriptDirectory.from_config(alembic_config(engine)).get_current_head()


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (None: no schema yet). A read: on SQLite it takes no
    write lock (``db.reading``)."""
    with reading(engine) as conn:
        return MigrationContext.configure(conn).get_current_revision()


def is_current(engine: Engine) -> bool:
    """True when the database's schema is at the newest revision."""
    return current_revision(engine) == head_revision(engine)
