"""The commands that ask Stripe what became of what it accepted: ``stripe-events poll``,
``reconcile`` and ``cancel``. Thin, like the others: parse, call one function, print."""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING

import click
from flask import current_app

from ..config import ConfigError
from ..outbox.operations import RESOLVE_REASONS
from ..read.words import CANCEL_WORDS
from ..services import Services, services_of
from ..stripe_gateway import StripeCallFailed

if TYPE_CHECKING:
    from ..stripe_gateway import StripeGateway


class StripeUnreachable(click.ClickException):
    """Stripe could not be asked: one line on stderr, exit 1."""

    exit_code = 1


def _svc() -> Services:
    return services_of(current_app)


def _gateway() -> StripeGateway:
    from ..worker import gateway_from

    gateway = gateway_from(_svc().settings)
    if gateway is None:
        raise ConfigError("STRIPE_API_KEY is not set: Stripe cannot be asked")
    return gateway


def _time(value: str | None, name: str) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"not an ISO 8601 time: {value!r}", param_hint=name) from None
    if parsed.tzinfo is None:
        raise click.BadParameter("needs a time zone, e.g. 2026-01-31T00:00:00Z",
                                 param_hint=name)
    return parsed


@click.group("stripe-events")
def stripe_events() -> None:
    """Stripe's reports on events it accepted."""


@stripe_events.command("poll")
def stripe_events_poll() -> None:
    """Read Stripe's error reports since the last one stored; print a JSON summary."""
    from ..worker import MeterRefresher, event_poller

    svc, gateway = _svc(), _gateway()
    meters = MeterRefresher(svc.engine, gateway, clock=svc.clock)
    try:
        summary = event_poller(svc.engine, gateway, svc.settings, clock=svc.clock,
                               on_meter_codes=meters.run_once).run_once()
    except StripeCallFailed as exc:
        raise StripeUnreachable(str(exc)) from exc
    click.echo(json.dumps(summary.as_dict()))


@click.command("reconcile")
@click.option("--since", default=None, help="ISO 8601 with a zone; default: 35 days ago.")
@click.option("--until", default=None, help="ISO 8601 with a zone; default: now.")
@click.option("--tenant", default=None, help="Only this tenant's customer and meters.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def reconcile(since: str | None, until: str | None, tenant: str | None,
              as_json: bool) -> None:
    """Compare the units sent with Stripe's meter event summaries, per UTC day."""
    from ..worker import reconcile as run_reconcile

    svc, gateway = _svc(), _gateway()
    try:
        run = run_reconcile(svc.engine, gateway, svc.settings, since=_time(since, "--since"),
                            until=_time(until, "--until"), tenant_id=tenant, trigger="cli",
                            actor=_actor(), now=svc.clock())
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if as_json:
        click.echo(json.dumps(run.as_dict()))
    else:
        c = run.comparison
        click.echo(f"{run.since:%Y-%m-%d %H:%M} – {run.until:%Y-%m-%d %H:%M} UTC: "
                   f"{c.checked} buckets checked, {c.pending} pending, "
                   f"{len(c.mismatches)} mismatches ({run.calls} calls to Stripe)")
        for m in c.mismatches:
            click.echo(f"  {m.tenant_id} {m.stripe_customer_id} {m.meter} "
                       f"{m.start:%Y-%m-%d %H:%M}–{m.end:%H:%M}: ours {m.local_units}, "
                       f"Stripe {m.stripe_units:g}, difference {m.difference:+g}")
        for note in run.notes:
            click.echo(f"  note: {note}")
    if run.errors:
        raise StripeUnreachable("; ".join(run.errors))


@click.command("cancel", short_help="Cancel sent events at Stripe, within 24 hours.",
               help="Cancel sent events at Stripe. " + " ".join(CANCEL_WORDS))
@click.argument("ids", nargs=-1, type=int, required=True)
@click.option("--reason", required=True, type=click.Choice(list(RESOLVE_REASONS)))
@click.option("--note", required=True)
def cancel(ids: tuple[int, ...], reason: str, note: str) -> None:
    """Cancel the events at Stripe; print Stripe's answer for each and what a cancel does,
    and the events Stripe refused."""
    from ..worker import cancel_events

    svc = _svc()
    outcome = cancel_events(svc.engine, _gateway(), ids, actor=_actor(), reason=reason,
                            note=note, now=svc.clock())
    click.echo(f"cancelled {len(outcome.cancelled)} event(s)")
    for event_id, adjustment in outcome.adjustments.items():
        click.echo(f"  {event_id}: {adjustment.words()}")
    if outcome.cancelled:
        click.echo(f"{CANCEL_WORDS.off_the_meter}\n{CANCEL_WORDS.finalized_invoice}")
    if outcome.refused:
        raise StripeUnreachable("; ".join(f"{i}: {why}" for i, why in outcome.refused))


def _actor() -> str:
    from .cli import actor

    return actor()


COMMANDS: list[click.Command] = [stripe_events, reconcile, cancel]
