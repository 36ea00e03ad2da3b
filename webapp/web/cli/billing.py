"""The commands about Stripe's billing periods: ``periods`` (the periods that are closing and
what of them Stripe has not accepted yet) and ``late`` (usage that came after its invoice was
finalized). Thin, like the others: read, print."""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING

import click

from ...db import reading
from ...outbox.late import find_late
from ...outbox.operations import RESOLVE_REASONS, OperationError
from ...stripe_gateway import StripeCallFailed
from .common import actor, services
from .stripe_calls import StripeUnreachable, _gateway

if TYPE_CHECKING:
    from ...outbox.late import LateResult


def _span(seconds: float | None) -> str:
    if seconds is None:
        return "no draft yet"
    if seconds <= 0:
        return "finalizing now"
    minutes = int(seconds // 60)
    return f"{minutes // 60} h {minutes % 60} min left" if minutes >= 60 else f"{minutes} min left"


def _day(value: datetime) -> str:
    return value.strftime("%Y-%m-%d %H:%M")


@click.command("periods")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--refresh", is_flag=True,
              help="Read Stripe's subscriptions and invoices first (needs STRIPE_API_KEY).")
def periods(as_json: bool, refresh: bool) -> None:
    """The billing periods that are closing: each tenant and meter whose last period ended
    and whose invoice is still a draft, or whose period ends within a day, with the events
    and units of that period Stripe has not accepted yet; and the late usage."""
    from ...read.periods import periods_summary

    svc = services()
    if refresh:
        from ...worker import billing_refresher

        try:
            billing_refresher(svc.engine, _gateway(), svc.settings, clock=svc.clock).run_once()
        except StripeCallFailed as exc:
            raise StripeUnreachable(str(exc)) from exc
    now = svc.clock()
    find_late(svc.engine, now=now)          # what was sent since the last look
    with reading(svc.engine) as conn:
        summary = periods_summary(conn, now)
    if as_json:
        click.echo(json.dumps(summary.as_dict()))
        return
    if not summary.closing:
        click.echo("no billing period is closing")
    for p in summary.closing:
        invoice = (f"invoice {p.invoice_id} ({p.invoice_status}, {_span(p.seconds_left(now))})"
                   if p.invoice_id else "no invoice yet")
        unsent = (f"{p.unsent_events} event(s), {p.unsent_units} unit(s) not at Stripe"
                  if p.unsent_events else "everything at Stripe")
        click.echo(f"{p.tenant_id or '(no tenant)'}  {p.stripe_customer_id}  {p.meter}  "
                   f"{_day(p.period_start)} - {_day(p.period_end)}  {invoice}  {unsent}")
    click.echo(f"late usage: {summary.late_events} event(s), {summary.late_units} unit(s)")


@click.group("late", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def late(ctx: click.Context, as_json: bool) -> None:
    """Events of a period whose invoice was finalized before Stripe accepted them (or that
    are still unsent): they are on no invoice. ``bill-next`` and ``write-off`` handle them."""
    if ctx.invoked_subcommand is not None:
        return
    from ...outbox.late import late_events

    svc = services()
    find_late(svc.engine, now=svc.clock())  # what was sent since the last look
    with reading(svc.engine) as conn:
        found = late_events(conn)
    units = sum(e.quantity for e in found)
    if as_json:
        click.echo(json.dumps({"units": units, "events": [e.as_dict() for e in found]}))
        return
    for e in found:
        click.echo(f"{e.id}  {e.tenant_id}  {e.stripe_customer_id}  {e.meter}  {e.quantity}  "
                   f"occurred {e.occurred_at.isoformat()}  "
                   + (f"sent {e.sent_at.isoformat()}" if e.sent_at else f"{e.status}")
                   + f"  invoice {e.invoice_id} finalized {e.finalized_at.isoformat()}")
    click.echo(f"{len(found)} late event(s), {units} unit(s)")


def _said(result: LateResult, verb: str) -> None:
    for event_id, action in result.already.items():
        click.echo(f"event {event_id}: handled before ({action.replace('_', ' ')}); "
                   f"nothing more done")
    if result.audit_id is not None:
        click.echo(f"{verb} {len(result.handled)} event(s); audit entry {result.audit_id}")


@late.command("bill-next")
@click.argument("ids", nargs=-1, type=int, required=True)
@click.option("--note", required=True)
def late_bill_next(ids: tuple[int, ...], note: str) -> None:
    """Bill late events on the customer's next invoice: one new event each, timestamped now,
    under a new identifier linked to the original, sent like any other."""
    from ...outbox.late import bill_next

    svc = services()
    try:
        result = bill_next(svc.engine, ids, actor=actor(), note=note, now=svc.clock())
    except OperationError as exc:
        raise click.ClickException(str(exc)) from exc
    for original, new in result.new_events.items():
        click.echo(f"event {original}: billed on the next invoice as event {new}")
    _said(result, "billed")


@late.command("write-off")
@click.argument("ids", nargs=-1, type=int, required=True)
@click.option("--reason", required=True, type=click.Choice(list(RESOLVE_REASONS)))
@click.option("--note", required=True)
def late_write_off(ids: tuple[int, ...], reason: str, note: str) -> None:
    """Close late events unbilled, with a reason code and a note."""
    from ...outbox.late import write_off

    svc = services()
    try:
        result = write_off(svc.engine, ids, actor=actor(), reason=reason, note=note,
                           now=svc.clock())
    except OperationError as exc:
        raise click.ClickException(str(exc)) from exc
    _said(result, "wrote off")


COMMANDS: list[click.Command] = [periods, late]
