"""Every requeue guard, proven through both doors a person uses: the ``billing-outbox requeue``
command (a real process) and the dashboard's requeue form. One table of cases; each door must
refuse what the table refuses, changing nothing, and requeue what it allows.

The rule itself is ``webapp.outbox.guards.requeue_check``; this proves that both doors reach
it (a door with a guard of its own that drifted would fail here).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from conftest import cli, worker_env

from webapp.models import utcnow
from webapp.outbox.guards import REQUEUE_AGE_LIMIT
from webapp.outbox.states import DEAD_PAST_WINDOW

from .conftest import csrf_of

WINDOW = 23 * 3600  # the test settings' OUTBOX_DEDUPE_WINDOW (the default)


@dataclass(frozen=True)
class Case:
    name: str
    row: dict[str, Any] | None          # None: an id that names no event
    plain: bool                          # a plain requeue goes ahead
    forced: bool                         # a forced (confirmed) requeue goes ahead
    cli_says: str                        # what the command's one line of refusal names


def _cases() -> list[Case]:
    now = utcnow()
    return [
        Case("dead", dict(status="dead"), True, True, ""),
        Case("dead, unknown outcome inside the window",
             dict(status="dead", first_unknown_at=now - timedelta(seconds=WINDOW - 600)),
             True, True, ""),
        Case("pending", dict(status="pending"), False, False, "only dead or rejected events"),
        Case("sent", dict(status="sent"), False, False, "only dead or rejected events"),
        Case("resolved", dict(status="resolved"), False, False, "only dead or rejected events"),
        Case("no such event", None, False, False, "no such event"),
        Case("past Stripe's 35-day limit",
             dict(status="dead", occurred_at=now - REQUEUE_AGE_LIMIT - timedelta(minutes=1)),
             False, False, "35 days"),
        Case("dead past the dedupe window",
             dict(status="dead", dead_reason=DEAD_PAST_WINDOW,
                  first_unknown_at=now - timedelta(hours=25)), False, True, "--force"),
        Case("unknown outcome older than the window",
             dict(status="dead", first_unknown_at=now - timedelta(seconds=WINDOW + 60)),
             False, True, "--force"),
        Case("rejected (goes out under a new identifier)",
             dict(status="rejected", rejected_at=now, sent_at=now,
                  first_unknown_at=now - timedelta(days=2)), True, True, ""),
        Case("rejected, past Stripe's 35-day limit",
             dict(status="rejected", rejected_at=now, sent_at=now,
                  occurred_at=now - REQUEUE_AGE_LIMIT - timedelta(minutes=1)),
             False, False, "35 days"),
        Case("too old wins over force",
             dict(status="dead", dead_reason=DEAD_PAST_WINDOW,
                  occurred_at=now - timedelta(days=36)), False, False, "35 days"),
    ]


CASES = _cases()


def _make(seed: Any, case: Case) -> int:
    """The case's event, its times taken from now (not from when the tests were collected: a
    long run would otherwise carry "inside the window" past the window)."""
    row = {c.name: c for c in _cases()}[case.name].row
    if row is None:
        return 987654
    return int(seed.event(**row))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_through_the_command(case: Case, db_url: str, seed: Any) -> None:
    event_id = _make(seed, case)
    env = worker_env(db_url)
    before = seed.snapshot()
    plain = cli("requeue", str(event_id), env=env)
    if case.plain:
        assert plain.returncode == 0, plain.stderr
        assert seed.get(event_id).status == "pending"
        return
    assert plain.returncode == 1
    lines = plain.stderr.strip().splitlines()
    assert len(lines) == 1 and case.cli_says in lines[0], lines
    assert seed.snapshot() == before
    forced = cli("requeue", str(event_id), "--force", env=env)
    if case.forced:
        assert forced.returncode == 0, forced.stderr
        assert seed.get(event_id).status == "pending"
    else:
        assert forced.returncode == 1
        assert seed.snapshot() == before


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_through_the_dashboard(case: Case, client_as: Any, seed: Any) -> None:
    event_id = _make(seed, case)
    client = client_as("operator")
    token = csrf_of(client)
    before = seed.snapshot()
    form = {"ids": [event_id], "csrf_token": token, "next": "/dead-letters"}
    plain = client.post("/dead-letters/requeue", data=form)
    if case.plain:
        assert plain.status_code == 303
        assert seed.get(event_id).status == "pending"
        return
    assert seed.snapshot() == before
    if case.forced:
        # Only an explicit, confirmed force sends it: the form asks first.
        assert plain.status_code == 409
        assert 'name="confirm_force"' in plain.get_data(as_text=True)
        unconfirmed = client.post("/dead-letters/requeue", data={**form, "force": "1"})
        assert unconfirmed.status_code == 409 and seed.snapshot() == before
        done = client.post("/dead-letters/requeue",
                           data={**form, "force": "1", "confirm_force": "yes"})
        assert done.status_code == 303
        assert seed.get(event_id).status == "pending"
        return
    assert plain.status_code == 303
    assert "Nothing changed" in client.get("/dead-letters").get_data(as_text=True)
    forced = client.post("/dead-letters/requeue",
                         data={**form, "force": "1", "confirm_force": "yes"})
    assert forced.status_code in (303, 409)
    assert seed.snapshot() == before


@pytest.mark.parametrize("case", [c for c in CASES if c.row is not None and
                                  c.row["status"] == "dead"],
                         ids=lambda c: c.name)  # the rejected have a preview of their own
def test_through_requeue_all_matching(case: Case, client_as: Any, seed: Any) -> None:
    """The bulk preview sorts each event by the same rule: the plain ones are requeued, the
    forced ones only when ticked, the rest never."""
    event_id = _make(seed, case)
    client = client_as("operator")
    preview = client.get("/dead-letters/requeue-all").get_data(as_text=True)
    if not (case.plain or case.forced):
        # Left out of the preview: no form to act on at all.
        assert '<dd data-k="too_old">1</dd>' in preview
        assert 'name="snapshot"' not in preview and "Nothing can be requeued" in preview
        return
    snapshot = preview.split('name="snapshot" value="', 1)[1].split('"', 1)[0]
    before = seed.snapshot()
    resp = client.post("/dead-letters/requeue-all",
                       data={"snapshot": snapshot, "csrf_token": csrf_of(client)})
    assert resp.status_code == 303
    if case.plain:
        assert seed.get(event_id).status == "pending"
        return
    assert seed.snapshot() == before
    client.post("/dead-letters/requeue-all", data={"snapshot": snapshot,
                                                   "include_forced": "yes",
                                                   "csrf_token": csrf_of(client)})
    assert seed.get(event_id).status == ("pending" if case.forced else "dead")


def test_the_pages_say_each_refusal_in_the_guards_words(client_as: Any, seed: Any) -> None:
    """The bulk refusal and the event page's alerts read REQUEUE_BULK_WORDS and
    REQUEUE_PAGE_WORDS: one place for each text, whichever door shows it."""
    from markupsafe import escape

    from webapp.outbox.guards import REQUEUE_BULK_WORDS, REQUEUE_PAGE_WORDS, RequeueCheck

    now = utcnow()
    old = int(seed.event(status="dead", occurred_at=now - timedelta(days=36)))
    sent = int(seed.event(status="sent"))
    unknown = int(seed.event(status="dead", first_unknown_at=now - timedelta(hours=25)))
    client = client_as("operator")
    client.post("/dead-letters/requeue", data={"ids": [old, sent], "csrf_token": csrf_of(client),
                                               "next": "/dead-letters"})
    flashed = client.get("/dead-letters").get_data(as_text=True)
    for check, ids in ((RequeueCheck.WRONG_STATUS, sent), (RequeueCheck.TOO_OLD, old)):
        assert str(escape(f"{REQUEUE_BULK_WORDS[check]}: {ids}")) in flashed
    for event_id, check in ((old, RequeueCheck.TOO_OLD), (unknown, RequeueCheck.FORCE)):
        page = client.get(f"/events/{event_id}").get_data(as_text=True)
        assert str(escape(REQUEUE_PAGE_WORDS[check])) in page
