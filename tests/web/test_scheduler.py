"""The in-app scheduler only calls ``run_once``/``drain_once`` on a cadence: one job for the
drain and one per maintenance service, and it stops cleanly."""

from __future__ import annotations

from conftest import make_settings
from sqlalchemy import Engine

from webapp.db import make_session_factory
from webapp.services import Services
from webapp.web.scheduler import start_scheduler


def test_jobs_are_the_drain_and_each_maintenance_service(engine: Engine, db_url: str) -> None:
    settings = make_settings(db_url, stripe_api_key=None, claim_timeout_seconds=40.0)
    svc = Services(settings, engine, make_session_factory(engine))
    scheduler = start_scheduler(svc)
    try:
        jobs = {job.id: job.trigger.interval.total_seconds() for job in scheduler.get_jobs()}
        assert jobs == {"drain": settings.poll_interval_seconds, "rescue": 10.0, "fold": 60.0,
                        "prune": settings.prune_interval_seconds, "usage-reports": 60.0,
                        "defer-unsendable": 60.0, "notifier": 30.0, "notify-delivery": 5.0}
    finally:
        assert svc.stop_scheduler is not None
        svc.stop_scheduler()
    assert not scheduler.running
    assert svc.drainer().stopping.is_set()




def test_the_process_calls_stripe_through_one_gateway(engine: Engine, db_url: str) -> None:
    """Built once by ``Services`` and handed to the drainer and every service that reads
    Stripe; nothing builds another."""
    settings = make_settings(db_url, stripe_api_base="http://127.0.0.1:9")
    svc = Services(settings, engine, make_session_factory(engine))
    gateway = svc.gateway()
    assert gateway is not None and svc.gateway() is gateway
    assert svc.drainer().gateway is gateway
    readers = {s.service.name: s.service for s in svc.maintenance()}
    assert {name for name, s in readers.items() if getattr(s, "source", None) is gateway} == {
        "meters", "stripe-billing", "stripe-events", "reconcile"}
    assert svc.drainer().meters is not None
    assert svc.drainer().meters.refresher.source is gateway


def test_without_a_key_there_is_no_gateway_and_nothing_reads_stripe(engine: Engine,
                                                                     db_url: str) -> None:
    settings = make_settings(db_url, stripe_api_key=None)
    svc = Services(settings, engine, make_session_factory(engine))
    assert svc.gateway() is None and svc.drainer().gateway is None
    assert svc.drainer().meters is None
    assert not any(hasattr(s.service, "source") for s in svc.maintenance())
