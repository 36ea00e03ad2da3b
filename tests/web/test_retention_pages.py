"""What retention looks like to the people at the screen: the Overview says how long events
are kept and how many went, a search that finds nothing and an event that is no longer there
say why it may be, and ``stats --json`` carries the same figures."""

from __future__ import annotations

from datetime import timedelta
from html import unescape
from typing import Any

from webapp.outbox import rollups
from webapp.outbox.retention import prune
from webapp.read.stats import stats


def test_retention_is_explained_where_rows_are_missed(client_as: Any, engine: Any, seed: Any,
                                                     now: Any) -> None:
    old = now - timedelta(days=50)
    gone = seed.event(status="sent", now=old)
    seed.event(status="resolved", now=old)
    seed.event(status="pending", now=now)
    viewer = client_as("viewer")
    page = unescape(viewer.get("/").get_data(as_text=True))
    assert "kept 40 days after their last change" in page
    assert "removed so far" not in page
    rollups.fold(engine, now=now, margin=timedelta(minutes=15))
    assert prune(engine, now=now, retention_days=40).pruned == 2

    page = unescape(viewer.get("/").get_data(as_text=True))
    assert "2 removed so far, the last" in page
    missing = viewer.get(f"/events/{gone}")
    assert missing.status_code == 404
    assert "removed 40 days after their last change" in unescape(missing.get_data(as_text=True))
    miss = unescape(viewer.get("/search?q=no-such-key-anywhere").get_data(as_text=True))
    assert "Nothing matches" in miss and "removed 40 days after their last change" in miss

    data = stats(engine, now=now, retention_days=40)
    pruned = data["pruned"]
    assert isinstance(pruned, dict)
    assert (pruned["events"], pruned["retention_days"]) == (2, 40)
    assert pruned["last_at"] is not None
