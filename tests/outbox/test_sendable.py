"""One "can this event be sent now?": the claim (PostgreSQL's written-out statement and
SQLite's), the status line's due sample and ``stats``' count of events waiting for a mapping
pick the same rows as the Python form, on a table of edge cases (every status; due a second
ago, exactly now, a second ahead; a customer on the row or not; a tenant mapped, mapped to
nobody, or unknown; a meter active at Stripe or not)."""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, select, text

from webapp.db import reading
from webapp.models import OutboxEvent
from webapp.outbox import sendable
from webapp.outbox.claims import claim_in
from webapp.outbox.states import ALL_STATUSES
from webapp.read.health import _due, _oldest_sendable
from webapp.read.stats import stats

T = OutboxEvent.__table__
TENANTS = {"mapped": "cus_tenant", "blank": None}  # and "unknown": no row at all
ACTIVE = ("api_requests",)


@pytest.fixture
def table(engine: Engine, seed: Any, now: Any) -> list[dict[str, Any]]:
    for tenant, customer in TENANTS.items():
        seed.tenant(tenant, customer)
    offsets = (timedelta(seconds=-1), timedelta(0), timedelta(seconds=1))
    for status, offset, own, tenant, meter in itertools.product(
            ALL_STATUSES, offsets, (None, "cus_row"), (*TENANTS, "unknown"),
            ("api_requests", "tokens")):
        seed.event(status=status, next_attempt_at=now + offset, stripe_customer_id=own,
                   tenant_id=tenant, meter=meter, now=now - timedelta(minutes=1))
    with engine.connect() as conn:
        return [dict(r._mapping, tenant_customer=TENANTS.get(r.tenant_id)) for r in
                conn.execute(select(T.c.id, T.c.status, T.c.next_attempt_at,
                                    T.c.stripe_customer_id, T.c.tenant_id, T.c.meter))]


def python_picks(rows: list[dict[str, Any]], now: Any, meters: Any) -> set[int]:
    return {r["id"] for r in rows
            if sendable.sendable_now(status=r["status"], next_attempt_at=r["next_attempt_at"],
                                     customer=r["stripe_customer_id"],
                                     tenant_customer=r["tenant_customer"], meter=r["meter"],
                                     now=now, active_meters=meters)}


@pytest.mark.parametrize("meters", [None, ACTIVE], ids=["any meter", "active meters"])
def test_the_claim_takes_exactly_what_the_python_form_says(
        engine: Engine, table: list[dict[str, Any]], now: Any, meters: Any) -> None:
    expected = python_picks(table, now, meters)
    # Each case in both directions: sendable ones exist, and most rows are not.
    assert 0 < len(expected) < len(table) // 4
    with engine.connect() as conn, conn.begin() as tx:
        claim = claim_in(conn, worker="w:1:a", limit=len(table), now=now,
                         claim_timeout_seconds=60, meters=meters)
        tx.rollback()
    assert {e.id for e in claim.events} == expected
    by_id = {r["id"]: r for r in table}
    for e in claim.events:  # the customer fixed on the row: its own, else its tenant's
        row = by_id[e.id]
        assert e.stripe_customer_id == (row["stripe_customer_id"] or row["tenant_customer"])


@pytest.mark.parametrize("active", [None, set(ACTIVE)], ids=["never listed", "listed"])
def test_the_status_line_counts_the_same_events(
        engine: Engine, table: list[dict[str, Any]], now: Any, active: Any) -> None:
    expected = python_picks(table, now, active)
    due_rows = {r["id"]: r for r in table if r["id"] in expected}
    with reading(engine) as conn:
        due = _due(conn, now, active)
        oldest = _oldest_sendable(conn, now, active)
    assert due.sendable == len(expected)
    assert due.oldest_sendable == oldest == min(r["next_attempt_at"] for r in due_rows.values())


def test_stats_counts_waiting_events_without_a_customer(
        engine: Engine, table: list[dict[str, Any]], now: Any) -> None:
    expected = [r for r in table if r["status"] in sendable.WAITING
                and not sendable.addressed(r["stripe_customer_id"], r["tenant_customer"])]
    assert expected
    assert stats(engine, now=now)["waiting_for_customer_mapping"] == len(expected)


def test_groups_partition_the_statuses_and_match_the_claims_index() -> None:
    groups = (sendable.WAITING, sendable.IN_FLIGHT, sendable.NEEDS_A_PERSON, sendable.FINAL,
              ("sent",))
    assert sorted(itertools.chain(*groups)) == sorted(ALL_STATUSES)
    assert sorted(sendable.ON_ITS_WAY) == sorted((*sendable.WAITING, *sendable.IN_FLIGHT))
    index = next(i for i in T.indexes if i.name == "ix_outbox_claimable")
    predicate = str(index.dialect_options["postgresql"]["where"])
    assert predicate == "status IN ('pending', 'retrying')"
    assert str(sendable.WAITING_SQL) == f"stripe_usage_outbox.{predicate}"
    assert f"o.{predicate}" == sendable.PG_WAITING
    assert str(text(sendable.PG_SENDABLE_NOW)).startswith(sendable.PG_WAITING)
