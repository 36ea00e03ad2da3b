"""One tenant's page among many tenants (PostgreSQL): its usage and waiting count read the
tenant's own unsent events through ``ix_outbox_unsent_tenant``, and count them right."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import Engine, event, insert

from webapp.models import utcnow
from webapp.outbox.sql import T
from webapp.read.tenants import tenant_detail

TENANTS = 100
STATUSES = ("pending", "retrying", "dead", "rejected", "sent")


def test_one_tenants_unsent_events_are_read_from_its_own_index_entries(pg: Engine) -> None:
    now = utcnow().replace(microsecond=0)
    rows = []
    for t in range(TENANTS):
        for i in range(60):
            status = STATUSES[i % len(STATUSES)]
            rows.append(dict(
                tenant_id=f"t{t:03d}", meter="api_requests" if i % 3 else "tokens",
                quantity=i + 1, idempotency_key=f"k{t}-{i}", status=status,
                occurred_at=now - timedelta(days=i), attempt_count=0, call_count=0,
                key_generation=0, next_attempt_at=now, created_at=now, updated_at=now,
                sent_at=now if status == "sent" else None))
    with pg.begin() as conn:
        conn.execute(insert(T), rows)
        conn.exec_driver_sql("ANALYZE stripe_usage_outbox")
    captured: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
                executemany: bool) -> None:
        captured.append((statement, parameters))

    event.listen(pg, "before_cursor_execute", capture)
    try:
        d = tenant_detail(pg, "t042", start=(now - timedelta(days=39)).date(), end=now.date())
    finally:
        event.remove(pg, "before_cursor_execute", capture)

    mine = [r for r in rows if r["tenant_id"] == "t042"
            and r["occurred_at"] >= now - timedelta(days=39)]
    assert d.waiting == sum(r["status"] in ("pending", "retrying") for r in rows
                            if r["tenant_id"] == "t042")
    for status in ("pending", "retrying", "dead", "rejected"):
        assert d.usage.total("events", status) == sum(r["status"] == status for r in mine)
        assert d.usage.total("quantity", status) == sum(r["quantity"] for r in mine
                                                        if r["status"] == status)
    usage = next(s for s in captured if "sent_usage" in s[0])
    waiting = next(s for s in captured if s[0].lstrip().startswith("SELECT count(*)"))
    with pg.connect() as conn:
        for statement, parameters in (usage, waiting):
            plan = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + statement,
                                                                 parameters))
            assert "ix_outbox_unsent_tenant" in plan, plan
