"""Migrations: head matches the models, and down/up round-trips on both databases."""

from __future__ import annotations

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, text

from webapp.db import make_engine
from webapp.migrate import alembic_config, current_revision, head_revision, is_current, upgrade
from webapp.models import Base


def test_head_matches_the_models_and_round_trips(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        assert is_current(engine) and current_revision(engine) == head_revision(engine)
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert diff == []
        cfg = alembic_config(engine)
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "base")
        assert current_revision(engine) is None
        upgrade(engine)
        upgrade(engine)  # twice is harmless
        assert is_current(engine)
        if engine.dialect.name == "postgresql":
            with engine.connect() as conn:
                options = conn.execute(text(
                    "SELECT reloptions FROM pg_class WHERE relname = 'stripe_usage_outbox' "
                    "AND relnamespace = current_schema()::regnamespace")).scalar()
            assert "autovacuum_vacuum_scale_factor=0.02" in (options or [])
            # New rows and row versions leave a tenth of each page free (migration 0016).
            assert "fillfactor=90" in (options or [])
            assert statistics(engine) == {
                "stx_outbox_status_errors": {"status", "last_error_code", "last_error_class",
                                             "last_http_status"},
                "stx_outbox_status_reject": {"status", "reject_code"}}
            with engine.begin() as conn:
                cfg.attributes["connection"] = conn
                command.downgrade(cfg, "0012")
            assert statistics(engine) == {}
            with engine.connect() as conn:
                options = conn.execute(text(
                    "SELECT reloptions FROM pg_class WHERE relname = 'stripe_usage_outbox' "
                    "AND relnamespace = current_schema()::regnamespace")).scalar()
            assert "fillfactor=90" not in (options or [])
            upgrade(engine)
    finally:
        engine.dispose()


def statistics(engine: Engine) -> dict[str, set[str]]:
    """The outbox's multi-column statistics in the test's schema: name -> its columns."""
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT s.stxname, array_agg(a.attname::text) FROM pg_statistic_ext s "
            "CROSS JOIN LATERAL unnest(s.stxkeys) AS k(attnum) "
            "JOIN pg_attribute a ON a.attrelid = s.stxrelid AND a.attnum = k.attnum "
            "WHERE s.stxnamespace = current_schema()::regnamespace "
            "AND s.stxrelid = 'stripe_usage_outbox'::regclass GROUP BY s.stxname")).all()
    return {name: set(columns) for name, columns in rows}


def test_0021_adds_up_the_days_already_kept(db_url: str) -> None:
    """A database reconciled before 0021 shows the same per-meter figures after it."""
    engine = make_engine(db_url)
    try:
        cfg = alembic_config(engine)
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0020")
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO reconciled_days (stripe_customer_id, meter, day, formula, ours, "
                "stripe, compared_at, run_id) VALUES "
                "('cus_a', 'calls', '2026-11-02', 'sum', 5, 5, '2026-11-04 01:00:00', 1), "
                "('cus_b', 'calls', '2026-11-02', 'sum', 7, 9, '2026-11-04 02:00:00', 1), "
                "('cus_a', 'calls', '2026-11-03', 'sum', 1, 0, '2026-11-04 01:00:00', 1), "
                "('cus_a', 'seats', '2026-11-02', 'sum', 2, 2, '2026-11-04 01:00:00', 1)"))
        upgrade(engine)
        with engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT meter, day, ours, stripe, customer_days FROM reconciled_meter_days "
                "ORDER BY meter, day")).all()
        assert [tuple(r) for r in rows] == [("calls", "2026-11-02", 12, 14.0, 2),
                                            ("calls", "2026-11-03", 1, 0.0, 1),
                                            ("seats", "2026-11-02", 2, 2.0, 1)]
    finally:
        engine.dispose()
