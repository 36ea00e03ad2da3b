"""Draining the outbox to Stripe, and the maintenance around it; no Flask, clocks injected.

What the rest of the product may use (``webapp.web`` imports nothing deeper):

- :class:`Drainer` — ``drain_once()`` is one pass, ``run()`` the worker's loop;
- :class:`Maintenance` with :func:`services_for` — the rescuer of expired claims and the
  rollup folder, each with a ``run_once()``, run on their cadence;
- :class:`Rescuer`, :class:`RollupFolder` — those services, for a scheduler of its own;
- :func:`freeze_startup_objects` — the ``worker`` command's garbage-collector tweak.

Inside: ``drainer`` (the pass), ``pipeline`` (the loop), ``sending`` (lanes in parallel,
one call per lane), ``lanes/`` (one module per backend), ``shards``, ``throttle``,
``breaker``, ``rescuer``, ``folder``, ``maintenance``, ``process``.
"""

from .drainer import Drainer, DrainSummary
from .folder import RollupFolder
from .maintenance import Maintenance, Scheduled, services_for
from .process import freeze_startup_objects
from .rescuer import Rescuer

__all__ = ["DrainSummary", "Drainer", "Maintenance", "Rescuer", "RollupFolder", "Scheduled",
           "freeze_startup_objects", "services_for"]
