"""The alerting rules shipped for Prometheus (``deploy/prometheus``): valid, doing what their
own unit tests say (``promtool check rules`` and ``promtool test rules``), and reading only
metrics that ``/metrics`` really serves. promtool is Debian's ``prometheus`` package, which
``.ci/run`` installs; without it the promtool tests are skipped, unless ``REQUIRE_BROWSER=1``
(CI, where every system tool must be there), where they fail."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

RULES = ROOT / "deploy" / "prometheus"
RULE_FILE = RULES / "billing-outbox.rules.yml"


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        why = "promtool is not installed (Debian's prometheus package)"
        if os.environ.get("REQUIRE_BROWSER") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return found


@pytest.mark.parametrize("args", [("check", "rules", "billing-outbox.rules.yml"),
                                  ("test", "rules", "billing-outbox.rules.test.yml")])
def test_promtool_accepts_the_rules(args: tuple[str, ...]) -> None:
    done = subprocess.run([promtool(), *args], cwd=RULES, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_rules_read_only_metrics_that_are_served() -> None:
    served = set(re.findall(r'"(billing_outbox_[a-z_]+)"',
                            (ROOT / "webapp" / "web" / "metrics.py").read_text()))
    used = set(re.findall(r"\b(billing_outbox_[a-z_]+)", RULE_FILE.read_text()))
    assert used and used <= served, used - served


def test_the_docs_point_at_the_rules() -> None:
    assert "deploy/prometheus/billing-outbox.rules.yml" in (
        Path(ROOT) / "docs" / "notifications.md").read_text()


def _rule(name: str) -> dict[str, Any]:
    import yaml

    groups = yaml.safe_load(RULE_FILE.read_text())["groups"]
    [rule] = [r for g in groups for r in g["rules"] if r.get("alert") == name]
    return dict(rule)


def test_the_rules_thresholds_are_the_dashboards() -> None:
    """A number the dashboard alerts on and the rules repeat is the same in both: the oldest
    waiting event's age (the Overview's "waiting too long") and Stripe's age limit."""
    from webapp.outbox.states import MAX_AGE
    from webapp.read.overview import OLDEST_PENDING_ALERT

    waiting = _rule("BillingOutboxWaitingTooLong")
    [limit] = re.findall(r">\s*(\d+)\s*$", str(waiting["expr"]).strip())
    assert float(limit) == OLDEST_PENDING_ALERT.total_seconds()
    past = _rule("BillingOutboxPastStripeAgeLimit")
    summary = str(past["annotations"]["summary"])
    assert f"({MAX_AGE.days} days)" in summary
