"""Runs the maintenance services (the rescuer, the rollup folder, the pruner) on their cadence, in a
thread of their own beside the ``worker`` command's drain loop. The in-app scheduler runs
the same ``run_once()`` calls as APScheduler jobs instead (``webapp.web.scheduler``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from sqlalchemy import Engine

from ..config import Settings
from ..models import utcnow
from ..stripe_gateway import StripeCallFailed, StripeGateway
from . import deferrer, folder, notify, pruner, reconciler, reporter, rescuer
from .invoices import MARK_SECONDS, InvoiceFirst, billing_refresher
from .meters import MeterRefresher
from .stripe_events import event_poller

log = logging.getLogger(__name__)


class Service(Protocol):
    """A maintenance service: a name for the logs, and one unit of work."""

    name: str

    def run_once(self) -> object: ...


@dataclass
class Scheduled:
    """A service and how often it runs."""

    service: Service
    every_seconds: float


def services_for(engine: Engine, settings: Settings, gateway: StripeGateway | None, *,
                 clock: Callable[[], datetime] = utcnow) -> list[Scheduled]:
    """The maintenance a draining process runs, with each service's cadence: the rescuer,
    the rollup folder, the pruner, the usage reporter, the deferrer of unmapped tenants'
    events and the notifier with its deliverer always; with a gateway (``STRIPE_API_KEY``
    set), reading Stripe's meters, its subscriptions and invoices (and marking what a draft
    invoice still needs), its error reports and invoice events, and reconciling when due."""
    out = [Scheduled(rescuer.Rescuer(engine, clock=clock), rescuer.interval_seconds(settings)),
           Scheduled(folder.RollupFolder(engine, settings, clock=clock),
                     folder.INTERVAL_SECONDS),
           Scheduled(pruner.Pruner(engine, settings, clock=clock),
                     settings.prune_interval_seconds),
           Scheduled(reporter.UsageReporter(engine, clock=clock), reporter.INTERVAL_SECONDS),
           Scheduled(deferrer.Deferrer(engine, clock=clock), deferrer.INTERVAL_SECONDS),
           Scheduled(notify.Notifier(engine, settings, clock=clock),
                     settings.notify.check_seconds),
           Scheduled(notify.Deliverer(engine, settings.notify, clock=clock),
                     notify.DELIVER_SECONDS)]
    if gateway is None:
        return out
    meters = MeterRefresher(engine, gateway, clock=clock)
    billing = billing_refresher(engine, gateway, settings, clock=clock)
    out += [Scheduled(meters, settings.meters_refresh_seconds),
            Scheduled(billing, settings.billing_refresh_seconds),
            Scheduled(InvoiceFirst(engine, risk_seconds=settings.invoice_risk_seconds,
                                   clock=clock), MARK_SECONDS),
            Scheduled(event_poller(engine, gateway, settings, clock=clock,
                                   on_meter_codes=meters.run_once,
                                   on_invoice_events=billing.on_invoice_events),
                      settings.events_poll_seconds),
            Scheduled(reconciler.Reconciler(engine, gateway, settings, clock=clock),
                      reconciler.CHECK_SECONDS)]
    return out


class Maintenance:
    """Calls each service's ``run_once()`` when due, until stopped. A failure is logged and
    the service is tried again at its next turn."""

    def __init__(self, scheduled: list[Scheduled], *,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.scheduled = scheduled
        self.monotonic = monotonic
        self.stopping = threading.Event()
        self._due = [0.0] * len(scheduled)
        self._thread: threading.Thread | None = None

    def run_due(self) -> float:
        """Run every service that is due; the seconds until the next one is."""
        now = self.monotonic()
        for i, s in enumerate(self.scheduled):
            if now >= self._due[i]:
                self._due[i] = now + s.every_seconds
                try:
                    s.service.run_once()
                except StripeCallFailed as exc:  # Stripe's trouble, not ours: one line
                    log.warning("maintenance %s: %s; trying again in %.0fs", s.service.name,
                                exc, s.every_seconds)
                except Exception:
                    log.exception("maintenance %s failed; trying again in %.0fs",
                                  s.service.name, s.every_seconds)
        return max(0.0, min(self._due) - self.monotonic()) if self._due else 60.0

    def start(self) -> None:
        """Run in a daemon thread until :meth:`stop`."""
        self._thread = threading.Thread(target=self._loop, name="outbox-maintenance",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop after the service running now, if any."""
        self.stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        while not self.stopping.is_set():
            self.stopping.wait(self.run_due())
