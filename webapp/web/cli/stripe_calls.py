"""The commands that ask Stripe what became of what it accepted: ``stripe-events poll``,
``reconcile`` (and ``reconcile resend``) and ``cancel``. Thin, like the others: parse, call
one function, print."""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING

import click

from ...config import ConfigError
from ...outbox.operations import RESOLVE_REASONS
from ...read.words import CANCEL_WORDS
from ...stripe_gateway import StripeCallFailed
from .common import services

if TYPE_CHECKING:
    from ...stripe_gateway import StripeGateway


class StripeUnreachable(click.ClickException):
    """Stripe could not be asked: one line on stderr, exit 1."""

    exit_code = 1


def _gateway() -> StripeGateway:
    gateway = services().gateway()
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
    from ...worker import MeterRefresher, event_poller

    svc, gateway = services(), _gateway()
    meters = MeterRefresher(svc.engine, gateway, clock=svc.clock)
    try:
        summary = event_poller(svc.engine, gateway, svc.settings, clock=svc.clock,
                               on_meter_codes=meters.run_once).run_once()
    except StripeCallFailed as exc:
        raise StripeUnreachable(str(exc)) from exc
    click.echo(json.dumps(summary.as_dict()))


@click.group("reconcile", invoke_without_command=True)
@click.option("--since", default=None, help="ISO 8601 with a zone; default: 35 days ago.")
@click.option("--until", default=None, help="ISO 8601 with a zone; default: now.")
@click.option("--tenant", default=None, help="Only this tenant's customer and meters.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def reconcile(ctx: click.Context, since: str | None, until: str | None, tenant: str | None,
              as_json: bool) -> None:
    """Compare the units sent with Stripe's meter event summaries, per UTC day. ``reconcile
    resend`` sends again a day Stripe was found to hold none of."""
    if ctx.invoked_subcommand is not None:
        return
    from ...worker import reconcile as run_reconcile

    svc, gateway = services(), _gateway()
    try:
        run = run_reconcile(svc.engine, gateway, svc.settings, since=_time(since, "--since"),
                            until=_time(until, "--until"), tenant_id=tenant, trigger="cli",
                            actor=_actor(), clock=svc.clock)
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


@reconcile.command("resend", short_help="Send again a day Stripe holds none of.")
@click.option("--tenant", required=True)
@click.option("--meter", required=True)
@click.option("--day", required=True, type=click.DateTime(["%Y-%m-%d"]), help="YYYY-MM-DD (UTC).")
@click.option("--customer", default=None,
              help="The Stripe customer, when the tenant's events of that day went to several.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--dry-run", is_flag=True, help="Show what would be sent again; change nothing.")
def reconcile_resend(tenant: str, meter: str, day: datetime, customer: str | None,
                     as_json: bool, dry_run: bool) -> None:
    """Send a tenant's events of a meter on a UTC day again, under new identifiers, where the
    latest reconciliation that compared that day found Stripe holding none of it (audited).
    Where Stripe holds part of it, nothing is sent: a person chooses the events on the
    Reconciliation page. A day sent again once is not sent again."""
    from ...db import reading
    from ...outbox.findings import bucket_for
    from ...outbox.resend import plan_day, resend_day

    svc = services()
    with reading(svc.engine) as conn:
        bucket = bucket_for(conn, tenant, meter, day.date(), customer)
        plan = plan_day(conn, bucket, now=svc.clock()) if dry_run else None
    audit_id = None
    if plan is None:
        done = resend_day(svc.engine, bucket, actor=_actor(), now=svc.clock())
        plan, audit_id = done.plan, done.audit_id
    if as_json:
        click.echo(json.dumps({
            "dry_run": dry_run, "tenant_id": tenant,
            "stripe_customer_id": bucket.stripe_customer_id, "meter": meter,
            "day": bucket.day.isoformat(), "run_id": plan.finding.run_id,
            "count": len(plan.events), "units": plan.units, "audit_id": audit_id,
            "events": [{"id": e.id, "quantity": e.quantity, "identifier": e.identifier,
                        "new_identifier": e.new_identifier} for e in plan.events]}))
        return
    verb = "would send again" if dry_run else "sent again"
    click.echo(f"{verb} {len(plan.events)} event(s), {plan.units:,} units of {bucket.words()}, "
               f"under new identifiers (reconciliation run {plan.finding.run_id} found Stripe "
               "holding none of that day, so this cannot bill twice)")
    for e in plan.events:
        click.echo(f"  {e.id}: {e.quantity:,} units, {e.identifier} -> {e.new_identifier}")
    if dry_run:
        click.echo("dry run: nothing changed")
    else:
        click.echo(f"audit entry {audit_id}; the worker sends them with the next drain")


@click.command("cancel", short_help="Cancel sent events at Stripe, within 24 hours.",
               help="Cancel sent events at Stripe. " + " ".join(CANCEL_WORDS))
@click.argument("ids", nargs=-1, type=int, required=True)
@click.option("--reason", required=True, type=click.Choice(list(RESOLVE_REASONS)))
@click.option("--note", required=True)
def cancel(ids: tuple[int, ...], reason: str, note: str) -> None:
    """Cancel the events at Stripe; print Stripe's answer for each and what a cancel does,
    and the events Stripe refused."""
    from ...worker import cancel_events

    svc = services()
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
    from .common import actor

    return actor()


COMMANDS: list[click.Command] = [stripe_events, reconcile, cancel]
