"""Rules written once, as data (``webapp.outbox.states``), run two ways: in Python for one
event, compiled to SQL for thousands (``webapp.outbox.sql.rule_sql``). On both databases,
over every combination of the facts the requeue rule reads, the two give the same verdict."""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

from sqlalchemy import Engine, select

from webapp.db import reading
from webapp.outbox.guards import REQUEUE_AGE_LIMIT, REQUEUE_RULE, RequeueCheck, requeue_check
from webapp.outbox.sql import T, rule_sql
from webapp.outbox.states import ALL_STATUSES, DEAD_PAST_WINDOW

WINDOW = 23 * 3600.0


def test_python_and_sql_agree_on_every_case(engine: Engine, seed: Any, now: Any) -> None:
    ages = [timedelta(0), REQUEUE_AGE_LIMIT - timedelta(seconds=1), REQUEUE_AGE_LIMIT,
            REQUEUE_AGE_LIMIT + timedelta(seconds=1)]
    unknown = [None, timedelta(seconds=WINDOW - 1), timedelta(seconds=WINDOW),
               timedelta(days=2)]
    reasons = [None, "No such customer", DEAD_PAST_WINDOW]
    rows: dict[int, dict[str, Any]] = {}
    for status, age, since, reason in itertools.product(ALL_STATUSES, ages, unknown, reasons):
        fields = dict(status=status, occurred_at=now - age, dead_reason=reason,
                      first_unknown_at=None if since is None else now - since)
        rows[seed.event(**fields)] = fields
    verdict = rule_sql(REQUEUE_RULE, RequeueCheck.OK.value, dict(T.c.items()), now=now,
                       window_seconds=WINDOW)
    with reading(engine) as conn:
        in_sql = dict(conn.execute(select(T.c.id, verdict)).all())  # type: ignore[arg-type]
    seen = set()
    for event_id, fields in rows.items():
        in_python = requeue_check(**fields, now=now, window_seconds=WINDOW)
        assert in_sql[event_id] == in_python.value, fields
        seen.add(in_python)
    assert seen == set(RequeueCheck)  # every verdict was reached
