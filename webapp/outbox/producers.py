"""What the project records for producers outside it (``outbox_settings``): the default meter
``billing_outbox_enqueue`` uses when a caller names none, written by ``db upgrade`` and by each
process that drains (the worker, the in-app drainer) as it starts, so the SQL function follows
``STRIPE_METER_EVENT_NAME`` as ``enqueue_usage`` does."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Engine, select

from .sql import OUTBOX_SETTINGS as S
from .sql import insert_for
from .sql_enqueue import DEFAULT_METER_SETTING


def record_default_meter(engine: Engine, meter: str, *, now: datetime) -> None:
    """Record ``meter`` as the default for producers (nothing written when it is already)."""
    with engine.begin() as conn:
        kept = conn.execute(select(S.c.value).where(S.c.name == DEFAULT_METER_SETTING)).scalar()
        if kept == meter:
            return
        values = {"value": meter, "recorded_at": now}
        conn.execute(insert_for(conn, S).values(name=DEFAULT_METER_SETTING, **values)
                     .on_conflict_do_update(index_elements=[S.c.name], set_=values))
