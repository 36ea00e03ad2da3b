"""Alerts that reach people: the notifier (:mod:`.notifier`) records each alert kind's state
and queues one message per channel per change; the deliverer (:mod:`.deliveries`) sends them
with retries of their own; :mod:`.channels` says them to Slack, a signed webhook and email."""

from .channels import DeliveryFailed, signature, verify
from .deliveries import SETTING, Deliverer, TestResult, run_name, send_test
from .notifier import Notifier, NotifySummary

#: How often the deliverer looks for messages to send.
DELIVER_SECONDS = 5.0

__all__ = ["DELIVER_SECONDS", "SETTING", "Deliverer", "DeliveryFailed", "Notifier",
           "NotifySummary", "TestResult", "run_name", "send_test", "signature", "verify"]
