"""``billing-outbox prune``: remove terminal rows past ``OUTBOX_RETENTION_DAYS`` (the worker
and the in-app drainer also do it on a schedule). Thin: parse, call one function, print."""

from __future__ import annotations

import json
from datetime import datetime

import click
from flask import current_app

from ...services import services_of
from .common import actor, parse_time


@click.command("prune")
@click.option("--dry-run", is_flag=True, help="Count what would go; remove nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--as-of", "as_of", default=None, metavar="ISO8601",
              help="Count retention back from this time instead of now; a time in the "
                   "future only previews (with --dry-run).")
def prune_command(dry_run: bool, as_json: bool, as_of: str | None) -> None:
    """Remove sent, resolved and cancelled events (and their recorded calls) whose last
    change is older than OUTBOX_RETENTION_DAYS. Dead and rejected events, and events
    waiting or in flight, are never removed; usage totals stay the same."""
    from ...outbox.retention import prune

    svc = services_of(current_app)
    now = svc.clock()
    when: datetime = now
    if as_of is not None:
        when = parse_time(as_of)
        if when > now and not dry_run:
            raise click.UsageError("--as-of in the future only previews what would go: "
                                   "add --dry-run")
    result = prune(svc.engine, now=when, retention_days=svc.settings.retention_days,
                   dry_run=dry_run, actor=actor())
    if as_json:
        click.echo(json.dumps(result.as_json(), sort_keys=True))
    else:
        click.echo(("dry run, nothing removed: " if dry_run else "") + result.summary())


COMMANDS: list[click.Command] = [prune_command]
