"""``notify test``: send a test message on every channel that is set up (or on the one named),
say how each went, and exit 1 naming any that failed."""

from __future__ import annotations

import click

from ...audit import write_audit
from ...config import NOTIFY_CHANNELS
from ...models import utcnow
from .common import actor, services


@click.group("notify")
def notify() -> None:
    """Alerts sent to Slack, a webhook and email."""


@notify.command("test")
@click.option("--channel", type=click.Choice(NOTIFY_CHANNELS),
              help="Only this channel (default: every channel that is set up).")
def notify_test(channel: str | None) -> None:
    """Send a test message now."""
    from ...worker import send_test  # the worker's code loads only for this command

    svc = services()
    settings = svc.settings.notify
    chosen = (channel,) if channel else settings.channels
    if not chosen:
        raise click.ClickException(
            "No channel is set up: set NOTIFY_SLACK_WEBHOOK_URL, NOTIFY_WEBHOOK_URL or "
            "NOTIFY_SMTP_URL")
    who = actor()
    failed = []
    for c in chosen:
        result = send_test(svc.engine, settings, c, by=who, clock=svc.clock)
        with svc.engine.begin() as conn:
            write_audit(conn, actor=who, action="notify.test", reason_code=c,
                        note="sent" if result.ok else f"failed: {result.detail}", now=utcnow())
        click.echo(f"{c}: {'sent' if result.ok else 'FAILED'} — {result.detail}",
                   err=not result.ok)
        if not result.ok:
            failed.append(c)
    if failed:
        raise click.ClickException(f"the test message did not get through on "
                                   f"{', '.join(failed)}")


COMMANDS: list[click.Command] = [notify]
