"""The worker's loop by hand, for tests that drive the drainer and the poll of Stripe's
error reports one step at a time."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine

from webapp.worker import Drainer, MeterRefresher, event_poller, gateway_from


def drain_all(drainer: Drainer) -> None:
    """Drain until a pass claims nothing."""
    while drainer.drain_once().claimed:
        pass


def poll_reports(engine: Engine, settings: Any) -> Any:
    """One poll of Stripe's error reports, as the worker makes it (a report naming a meter
    Stripe lacks reads the meters again); its summary."""
    gateway = gateway_from(settings)
    assert gateway is not None
    try:
        meters = MeterRefresher(engine, gateway)
        return event_poller(engine, gateway, settings, on_meter_codes=meters.run_once).run_once()
    finally:
        gateway.close()
