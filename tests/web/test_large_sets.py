"""Large sets reach the database as one parameter: PostgreSQL takes at most 65,535 bind
parameters per statement and SQLite 32,766, so a filter over more tenants or ids than that
must not bind one parameter each (it answered 500 on PostgreSQL)."""

from __future__ import annotations

from typing import Any

from conftest import make_settings
from sqlalchemy import Engine, bindparam, func, select, text

from webapp import create_app
from webapp.models import UTCDateTime, utcnow
from webapp.outbox.sql import TENANTS, T, id_in, text_in
from webapp.users import create_user

from .conftest import PASSWORD, login

MANY = 70_000  # past both limits


def _seed_tenants(engine: Engine, n: int) -> None:
    """``n`` tenants, each mapped and with one pending event today, in two statements."""
    series = ("WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < :n) "
              "SELECT i FROM s" if engine.dialect.name == "sqlite"
              else "SELECT generate_series(1, :n) AS i")
    now = bindparam("now", utcnow(), type_=UTCDateTime())
    with engine.begin() as conn:
        conn.execute(text(
            f"INSERT INTO {TENANTS.name} (tenant_id, name, stripe_customer_id, created_at, "
            "updated_at) "
            f"SELECT 't' || i, NULL, 'cus_' || i, :now, :now FROM ({series}) AS g"
        ).bindparams(now, n=n))
        conn.execute(text(
            f"INSERT INTO {T.name} (tenant_id, meter, quantity, idempotency_key, "
            "occurred_at, status, attempt_count, call_count, next_attempt_at, key_generation, "
            "identifier_generation, created_at, updated_at) "
            "SELECT 't' || i, 'api_requests', 1, 'k' || i, :now, 'pending', 0, 0, :now, 0, 0, "
            f":now, :now FROM ({series}) AS g").bindparams(now, n=n))
    if engine.dialect.name == "postgresql":
        # What autovacuum does after a bulk load: without statistics the planner scans the
        # array once per row (minutes at 70,000 × 70,000).
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(f"ANALYZE {TENANTS.name}, {T.name}"))


def test_the_helpers_bind_one_parameter_for_any_number_of_values(engine: Engine) -> None:
    _seed_tenants(engine, MANY)
    with engine.connect() as conn:
        ids = list(conn.execute(select(T.c.id)).scalars())
        assert conn.execute(select(func.count()).where(id_in(conn, T.c.id, ids))
                            ).scalar_one() == MANY
        names = [f"t{i}" for i in range(1, MANY + 1)] + ["nobody", "it's"]
        assert conn.execute(select(func.count()).select_from(TENANTS).where(
            text_in(conn, TENANTS.c.tenant_id, names))).scalar_one() == MANY
        # and twice in one statement
        assert conn.execute(select(func.count()).where(
            id_in(conn, T.c.id, ids[:10]), id_in(conn, T.c.id, ids[5:]))).scalar_one() == 5


def test_the_tenants_page_of_more_tenants_than_bind_parameters(pg_url: str, pg: Engine
                                                               ) -> None:
    """The usage file names every tenant with events in the period, 70,000 of them; the
    page shows a page of them, and finds any one."""
    _seed_tenants(pg, MANY)
    app = create_app({"TESTING": True}, settings=make_settings(pg_url), engine=pg,
                     start_drainer=False)
    create_user(pg, "viewer@example.com", PASSWORD, "viewer", now=utcnow())
    client = app.test_client()
    assert login(client, "viewer@example.com").status_code == 303
    csv = client.get("/tenants.csv")
    assert csv.status_code == 200
    lines = csv.get_data(as_text=True).splitlines()
    # the period, "generated at", an empty line, the header, a row per tenant, the totals
    assert len(lines) == 4 + MANY + 1
    assert lines[4].startswith('"t1","","api_requests",0,"not compared yet","",0,"cus_1"')
    assert lines[2] == "" and lines[3].startswith('"Tenant",') and lines[-1].startswith('"Total"')
    page: Any = client.get("/tenants?q=t69999", headers={"HX-Request": "true"})
    assert page.status_code == 200 and "cus_69999" in page.get_data(as_text=True)
    assert "1 of 70,000 rows match" in page.get_data(as_text=True)
    mappings: Any = client.get("/mappings?q=t69999")
    assert mappings.status_code == 200 and "cus_69999" in mappings.get_data(as_text=True)
