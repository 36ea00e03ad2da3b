"""Draining the outbox to Stripe, and the maintenance around it; no Flask, clocks injected.

What the rest of the product may use (``webapp.web`` imports nothing deeper):

- :class:`Drainer` — ``drain_once()`` is one pass; :func:`run_drainer` the worker's loop;
- :class:`Maintenance` with :func:`services_for` — the rescuer of expired claims and the
  rollup folder, each with a ``run_once()``, run on their cadence;
- :class:`Rescuer`, :class:`RollupFolder` — those services, for a scheduler of its own;
- :class:`MeterRefresher`, :class:`EventPoller` (built by :func:`event_poller`; with
  :func:`receive_report`), :func:`customer_directory` (whether Stripe has a customer),
  :func:`check_customers` (whether tenants may be mapped to customers: asked before a mapping),
  :func:`reconcile` and :class:`Reconciler`, :func:`cancel_events` — the exchanges with
  Stripe after its 200 (meters, error reports, reconciliation, cancel);
- :class:`BillingRefresher` (built by :func:`billing_refresher`), :func:`receive_invoice` —
  Stripe's subscriptions and invoices, read on a schedule, on its invoice events and pushed;
- :func:`stripe_customers` — Stripe's customers for the tenant sync;
- :func:`freeze_startup_objects` — the ``worker`` command's garbage-collector tweak;
  :func:`gateway_from` — the Stripe gateway the settings describe.

Inside: ``drainer`` (the pass), ``pipeline`` (the loop), ``sending`` (lanes in parallel,
one call per lane), ``lanes/`` (one module per backend), ``shards``, ``throttle``,
``breaker``, ``rescuer``, ``folder``, ``maintenance``, ``process``.
"""

from .cancelling import CancelOutcome, cancel_events
from .customers import check_customers, customer_directory, stripe_customers
from .drainer import Drainer, DrainSummary
from .folder import RollupFolder
from .invoices import (
    INVOICE_DELETED,
    INVOICE_EVENT_TYPES,
    SUBSCRIPTION_TYPES,
    BillingRefresher,
    RefreshSummary,
    billing_refresher,
    receive_invoice,
    receive_subscription,
)
from .maintenance import Maintenance, Scheduled, services_for
from .meters import MeterRefresher
from .notify import SETTING as NOTIFY_SETTING
from .notify import Deliverer, Notifier, send_test
from .pipeline import run as run_drainer
from .process import freeze_startup_objects, gateway_from
from .reconciler import LEASE_SECONDS as RECONCILE_LEASE_SECONDS
from .reconciler import Reconciler, reconcile
from .report_writer import ReportBusy
from .report_writer import prepare as prepare_report
from .rescuer import Rescuer
from .stripe_events import EventPoller, PollSummary, event_poller, receive_report

__all__ = ["INVOICE_DELETED", "INVOICE_EVENT_TYPES", "SUBSCRIPTION_TYPES", "NOTIFY_SETTING",
           "BillingRefresher", "CancelOutcome",
           "DrainSummary", "Drainer",
           "Deliverer", "EventPoller", "Maintenance", "MeterRefresher", "Notifier", "PollSummary",
           "RECONCILE_LEASE_SECONDS", "Reconciler", "RefreshSummary", "ReportBusy", "Rescuer",
           "RollupFolder", "Scheduled", "cancel_events", "billing_refresher", "check_customers",
           "customer_directory", "event_poller", "freeze_startup_objects", "gateway_from",
           "prepare_report", "receive_invoice", "receive_subscription", "receive_report",
           "reconcile", "run_drainer",
           "send_test", "services_for", "stripe_customers"]
