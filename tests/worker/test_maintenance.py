"""The maintenance services, called directly (``run_once``) with injected clocks: the rescuer
returns expired claims, the folder folds when the rollups lag, and ``Maintenance`` runs each
on its cadence, a failing one again at its next turn."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest
from conftest import make_settings
from sqlalchemy import Engine

from webapp.db import reading
from webapp.outbox import claims, rollups
from webapp.worker import Maintenance, Rescuer, RollupFolder, Scheduled, gateway_from, services_for


def test_rescuer_returns_only_expired_claims(engine: Engine, seed: Any, now: Any) -> None:
    expired = seed.event(status="processing", processing_deadline_at=now - timedelta(seconds=1),
                         claim_token="a", claimed_by="gone:1:aa", first_attempt_at=now)
    live = seed.event(status="processing", processing_deadline_at=now + timedelta(minutes=1),
                      claim_token="b", claimed_by="here:1:bb", first_attempt_at=now)
    rescuer = Rescuer(engine, clock=lambda: now)
    assert rescuer.run_once() == 1
    assert seed.get(expired).status == "pending" and seed.get(expired).claim_token is None
    assert seed.get(live).status == "processing"
    assert rescuer.run_once() == 0
    later = Rescuer(engine, clock=lambda: now + timedelta(minutes=2))
    assert later.run_once() == 1 and seed.get(live).status == "pending"


def test_folder_folds_when_the_rollups_lag_and_not_before(engine: Engine, seed: Any,
                                                          now: Any, db_url: str) -> None:
    seed.events(4, status="sent", sent_at=now - timedelta(hours=2), quantity=3)
    settings = make_settings(db_url)
    clock = [now]
    folder = RollupFolder(engine, settings, clock=lambda: clock[0])
    assert folder.run_once() is True
    with reading(engine) as conn:
        mark = rollups.read_mark(conn, rollups.SENT_USAGE)
    assert (mark.events, mark.quantity) == (4, 12)
    assert folder.run_once() is False                      # fresh: one small read
    clock[0] = now + rollups.FOLD_EVERY + timedelta(minutes=1)
    assert folder.run_once() is True


class Counting:
    def __init__(self, name: str, fail: bool = False) -> None:
        self.name, self.fail, self.runs = name, fail, 0

    def run_once(self) -> int:
        self.runs += 1
        if self.fail:
            raise RuntimeError("database went away")
        return self.runs


def test_maintenance_runs_each_service_on_its_cadence(caplog: pytest.LogCaptureFixture
                                                      ) -> None:
    t = [100.0]
    fast, slow, broken = Counting("fast"), Counting("slow"), Counting("broken", fail=True)
    m = Maintenance([Scheduled(fast, 1.0), Scheduled(slow, 10.0), Scheduled(broken, 5.0)],
                    monotonic=lambda: t[0])
    with caplog.at_level(logging.ERROR):
        assert m.run_due() == pytest.approx(1.0)        # everything runs at first
        assert (fast.runs, slow.runs, broken.runs) == (1, 1, 1)
        t[0] += 0.5
        m.run_due()
        assert (fast.runs, slow.runs, broken.runs) == (1, 1, 1)
        t[0] += 0.5
        m.run_due()
        assert (fast.runs, slow.runs, broken.runs) == (2, 1, 1)
        t[0] += 4.0
        m.run_due()                                      # the broken one again, 5 s later
        assert (fast.runs, slow.runs, broken.runs) == (3, 1, 2)
    assert sum("maintenance broken failed" in r.getMessage() for r in caplog.records) == 2


def test_a_draining_process_runs_the_rescuer_the_folder_the_pruner_and_the_reporter(
        engine: Engine, db_url: str) -> None:
    """And the notifier with its deliverer, with or without an API key."""
    settings = make_settings(db_url, claim_timeout_seconds=40.0, stripe_api_key=None,
                             prune_interval_seconds=900.0)
    scheduled = services_for(engine, settings, gateway_from(settings))
    assert {(s.service.name, s.every_seconds) for s in scheduled} == {
        ("rescue", 10.0), ("fold", 60.0), ("prune", 900.0), ("usage-reports", 60.0),
        ("defer-unsendable", 60.0), ("notifier", 30.0), ("notify-delivery", 5.0)}


def test_with_a_key_it_also_reads_stripe_back(engine: Engine, db_url: str) -> None:
    settings = make_settings(db_url, events_poll_seconds=15.0, meters_refresh_seconds=120.0,
                             billing_refresh_seconds=600.0)
    scheduled = services_for(engine, settings, gateway_from(settings))
    names = {s.service.name: s.every_seconds for s in scheduled}
    assert names == {"rescue": 7.5, "fold": 60.0, "prune": 3600.0, "usage-reports": 60.0,
                     "defer-unsendable": 60.0, "meters": 120.0, "stripe-events": 15.0,
                     "stripe-billing": 600.0, "invoice-first": 15.0, "reconcile": 300.0,
                     "notifier": 30.0, "notify-delivery": 5.0}


def test_rescue_is_not_part_of_a_drain_pass(engine: Engine, seed: Any, now: Any,
                                            db_url: str) -> None:
    """A pass claims and sends; expired claims wait for the rescuer (its own cadence)."""
    from webapp.worker import Drainer

    seed.tenant("acme", "cus_acme")
    stuck = seed.event(status="processing", processing_deadline_at=now - timedelta(hours=1),
                       claim_token="x", claimed_by="gone:1:aa", stripe_customer_id="cus_acme",
                       first_attempt_at=now - timedelta(hours=1))
    drainer = Drainer(engine, make_settings(db_url), None)
    try:
        assert drainer.drain_once().rescued == 0
    finally:
        drainer.close()
    assert seed.get(stuck).status == "processing"
    assert claims.rescue_expired(engine, now=now) == 1
