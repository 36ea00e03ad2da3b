"""/metrics: valid Prometheus text, aggregates only, counters that survive a fold."""

from __future__ import annotations

import math
import re
from datetime import timedelta

from webapp.models import utcnow
from webapp.outbox import rollups

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
SAMPLE = re.compile(rf"^({NAME})(\{{(.*)\}})? (\S+)( -?\d+)?$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\.)*)"(,|$)')


def parse(text: str) -> dict[str, dict]:
    """A strict reader of the text exposition format 0.0.4: families with their TYPE/HELP and
    samples as {(name, frozenset(labels)): value}. Raises AssertionError on anything off."""
    assert text.endswith("\n")
    families: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            assert re.fullmatch(NAME, name) and help_text
            families.setdefault(name, {"samples": {}})["help"] = help_text
            continue
        if line.startswith("# TYPE "):
            name, kind = line[7:].split(" ")
            assert kind in ("counter", "gauge", "histogram", "summary", "untyped")
            fam = families.setdefault(name, {"samples": {}})
            assert "type" not in fam, f"second TYPE for {name}"
            assert not fam["samples"], f"TYPE after samples for {name}"
            fam["type"] = kind
            current = name
            continue
        assert not line.startswith("#") or line.startswith("# "), line
        if line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, _, raw_labels, value = m.group(1), m.group(2), m.group(3), m.group(4)
        labels = {}
        if raw_labels:
            pos = 0
            while pos < len(raw_labels):
                lm = LABEL.match(raw_labels, pos)
                assert lm, f"bad labels in {line!r}"
                assert lm.group(1) not in labels
                labels[lm.group(1)] = lm.group(2)
                pos = lm.end()
        number = float(value)  # accepts +Inf/-Inf/NaN as Python does
        family = current
        assert family is not None and (name == family or (
            families[family]["type"] in ("histogram", "summary")
            and name in (f"{family}_bucket", f"{family}_sum", f"{family}_count"))), line
        key = (name, frozenset(labels.items()))
        assert key not in families[family]["samples"], f"duplicate series {line!r}"
        families[family]["samples"][key] = number
    for name, fam in families.items():
        assert "type" in fam and "help" in fam, name
        if fam["type"] == "histogram":
            buckets = sorted(((float(dict(k[1])["le"]), v) for k, v in fam["samples"].items()
                              if k[0] == f"{name}_bucket"))
            assert buckets and math.isinf(buckets[-1][0])
            counts = [v for _, v in buckets]
            assert counts == sorted(counts), "buckets are cumulative"
            assert fam["samples"][(f"{name}_count", frozenset())] == counts[-1]
        if fam["type"] == "counter":
            assert all(v >= 0 for v in fam["samples"].values())
    return families


def value(families, name, **labels) -> float:
    key = (name, frozenset(labels.items()))
    for fam in families.values():
        if key in fam["samples"]:
            return fam["samples"][key]
    raise KeyError(key)


def seed_traffic(seed, now) -> None:
    seed.tenant("secret-tenant", "cus_SECRET")
    ev = seed.event(status="retrying", tenant_id="secret-tenant", idempotency_key="secret-key",
                    created_at=now - timedelta(minutes=10))
    seed.events(3, status="sent")
    seed.event(status="dead")
    for ms, outcome, at in ((20, "delivered", now), (300, "delivered", now),
                            (7000, "unknown", now - timedelta(hours=2)),
                            (None, "not_executed", now - timedelta(hours=3))):
        seed.attempt(ev, duration_ms=ms, outcome=outcome, attempted_at=at)


def test_metrics_parse_and_match(app, seed, now) -> None:
    seed_traffic(seed, now)
    resp = app.test_client().get("/metrics")          # no session needed
    assert resp.status_code == 200
    assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    text = resp.get_data(as_text=True)
    fams = parse(text)
    assert value(fams, "billing_outbox_events", status="sent") == 3
    assert value(fams, "billing_outbox_events", status="retrying") == 1
    assert value(fams, "billing_outbox_events", status="dead") == 1
    assert value(fams, "billing_outbox_paused") == 0
    assert 590 <= value(fams, "billing_outbox_oldest_waiting_age_seconds") <= 700
    assert value(fams, "billing_outbox_stripe_attempts_total", outcome="delivered") == 2
    assert value(fams, "billing_outbox_stripe_attempts_total", outcome="not_executed") == 1
    assert value(fams, "billing_outbox_stripe_attempts_total", outcome="systemic") == 0
    h = "billing_outbox_stripe_request_duration_seconds"
    assert fams[h]["type"] == "histogram"
    assert value(fams, f"{h}_bucket", le="0.025") == 1
    assert value(fams, f"{h}_bucket", le="0.5") == 2
    assert value(fams, f"{h}_bucket", le="+Inf") == 3
    assert value(fams, f"{h}_sum") == 7.32
    for secret in ("secret-tenant", "cus_SECRET", "secret-key", "sk_test"):
        assert secret not in text
    assert value(fams, "billing_outbox_stripe_mode_info", mode="test") == 1


def test_counters_do_not_move_when_rows_are_folded(app, engine, seed, now) -> None:
    seed_traffic(seed, now)
    before = parse(app.test_client().get("/metrics").get_data(as_text=True))
    # fold everything, including the rows that were "live" a moment ago
    rollups.fold(engine, now=now + timedelta(hours=4),
                            margin=rollups.fold_margin(30))
    after = parse(app.test_client().get("/metrics").get_data(as_text=True))
    for name in ("billing_outbox_stripe_attempts_total",
                 "billing_outbox_stripe_request_duration_seconds", "billing_outbox_events"):
        assert before[name]["samples"] == after[name]["samples"], name


def test_paused_flag(app, engine) -> None:
    from webapp.outbox import operations

    operations.pause(engine, actor="t", reason="x", now=utcnow())
    fams = parse(app.test_client().get("/metrics").get_data(as_text=True))
    assert value(fams, "billing_outbox_paused") == 1


def test_the_parser_rejects_broken_text() -> None:
    import pytest

    for bad in ("metric 1\n", "# TYPE m gauge\nm{a=\"1\"} x\n", "# TYPE m gauge\nm 1",
                "# HELP m h\n# TYPE m gauge\nm 1\nm 2\n"):
        with pytest.raises((AssertionError, ValueError)):
            parse(bad)
