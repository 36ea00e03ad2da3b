"""The in-app drainer: an APScheduler 3 ``BackgroundScheduler`` that calls the worker's
``drain_once`` and the maintenance services' ``run_once`` on their cadence, and nothing else.

With several gunicorn workers on one host, each would start a scheduler; claims keep that
correct, but it multiplies polling for nothing. So one worker per host and database holds a
non-blocking file lock and runs the jobs; the others try the lock on each tick and take over
if its holder dies (the kernel drops the lock with the process). Replicas on other hosts
drain too: that is how sending scales, and the claims and lane locks keep it exactly-once in
effect.
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import logging
import os
import tempfile
from collections.abc import Callable
from typing import IO

from apscheduler.schedulers.background import BackgroundScheduler

from ..services import Services
from ..stripe_gateway import StripeCallFailed

log = logging.getLogger(__name__)

#: At most this many full batches are drained in one tick before the next tick is due.
MAX_BATCHES_PER_TICK = 50


class HostLock:
    """An exclusive, non-blocking per-host lock on a file named after the database."""

    def __init__(self, database_url: str) -> None:
        digest = hashlib.sha256(database_url.encode()).hexdigest()[:16]
        self.path = os.path.join(tempfile.gettempdir(), f"billing-outbox-drainer-{digest}.lock")
        self._fh: IO[str] | None = None

    def try_acquire(self) -> bool:
        """Hold the lock (or keep holding it); False while another process holds it."""
        if self._fh is not None:
            return True
        fh = open(self.path, "a+")  # noqa: SIM115 - held for the life of the process
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            return False
        self._fh = fh
        return True

    def release(self) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None


def start_scheduler(svc: Services) -> BackgroundScheduler:
    """Start the drain job (every OUTBOX_POLL_INTERVAL_SECONDS) and the maintenance jobs
    (each on its own cadence); all coalesced, one run of each at a time."""
    drainer = svc.drainer()
    drainer.announce("app")
    lock = HostLock(svc.settings.database_url)

    def holding_lock(job: Callable[[], object], name: str) -> Callable[[], None]:
        def tick() -> None:
            if not lock.try_acquire():
                return
            try:
                job()
            except StripeCallFailed as exc:  # Stripe's trouble, not ours: one line
                log.warning("in-app %s: %s; trying again at the next tick", name, exc)
            except Exception:
                log.exception("in-app %s failed; trying again at the next tick", name)
        return tick

    def drain() -> None:
        # Keep draining while full batches come back, up to a bounded pass.
        for _ in range(MAX_BATCHES_PER_TICK):
            summary = drainer.drain_once()
            if summary.claimed < svc.settings.batch_size or drainer.stopping.is_set():
                break

    scheduler = BackgroundScheduler(timezone="UTC", job_defaults={
        "coalesce": True, "max_instances": 1, "misfire_grace_time": None})
    scheduler.add_job(holding_lock(drain, "drain"), "interval",
                      seconds=svc.settings.poll_interval_seconds, id="drain",
                      next_run_time=svc.clock())
    for scheduled in svc.maintenance():
        service = scheduled.service
        scheduler.add_job(holding_lock(service.run_once, service.name), "interval",
                          seconds=scheduled.every_seconds, id=service.name,
                          next_run_time=svc.clock())
    scheduler.start()

    def shutdown() -> None:
        """Stop the jobs (the running ones finish), then let go of lanes and the lock; once."""
        atexit.unregister(shutdown)
        if not scheduler.running:
            return
        drainer.request_stop()
        scheduler.shutdown(wait=True)
        drainer.close()
        lock.release()

    svc.stop_scheduler = shutdown
    atexit.register(shutdown)
    log.info("in-app drainer scheduled every %.2fs", svc.settings.poll_interval_seconds)
    return scheduler
