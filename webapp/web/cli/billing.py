"""The commands about Stripe's billing periods: ``periods`` (the periods that are closing and
what of them Stripe has not accepted yet), ``invoices`` (each finalized metered line against
the project's own figure, and its verdict), ``late`` (usage that came after its invoice was
finalized) and ``unbilled`` (usage that lands on no invoice). Thin, like the others: bring
the judge up to date, read, print."""

from __future__ import annotations

import json
from datetime import date, datetime
from typing import TYPE_CHECKING

import click

from ...db import reading
from ...outbox.billing_watch import keep_unbilled
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
    from ...outbox.evidence import as_number
    from ...outbox.late import late_events
    from ...outbox.late_lines import short_lines

    svc = services()
    find_late(svc.engine, now=svc.clock())  # what was sent since the last look
    with reading(svc.engine) as conn:
        found = late_events(conn)
        short = short_lines(conn)
    units = sum(e.quantity for e in found) + sum(s.units for s in short)
    if as_json:
        click.echo(json.dumps({"units": as_number(units),
                               "events": [e.as_dict() for e in found]
                               + [s.as_dict() for s in short]}))
        return
    for e in found:
        click.echo(f"{e.id}  {e.tenant_id}  {e.stripe_customer_id}  {e.meter}  {e.quantity}  "
                   f"occurred {e.occurred_at.isoformat()}  "
                   + (f"sent {e.sent_at.isoformat()}" if e.sent_at else f"{e.status}")
                   + f"  invoice {e.invoice_id} finalized {e.finalized_at.isoformat()}")
    for s in short:
        click.echo(f"-  {s.tenant_id or '(no tenant)'}  {s.stripe_customer_id}  {s.meter}  "
                   f"{as_number(s.units)}  invoice {s.invoice_id}'s line is short: Stripe took "
                   f"these units before it finalized and left them off")
    click.echo(f"{len(found)} late event(s), {len(short)} short line(s), "
               f"{as_number(units)} unit(s)")


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
@click.argument("ids", nargs=-1, type=int)
@click.option("--line", "line", default=None, metavar="INVOICE_ID/ITEM_ID",
              help="A short line's missing units instead of events.")
@click.option("--reason", required=True, type=click.Choice(list(RESOLVE_REASONS)))
@click.option("--note", required=True)
def late_write_off(ids: tuple[int, ...], line: str | None, reason: str, note: str) -> None:
    """Close late events unbilled, with a reason code and a note; or, with ``--line``, the
    units a short invoice line lacks (Stripe has those events: they are never sent again)."""
    from ...outbox.late import write_off
    from ...outbox.late_lines import write_off_line

    if bool(ids) == bool(line):
        raise click.UsageError("give late event ids, or --line INVOICE_ID/ITEM_ID, not both")
    svc = services()
    try:
        if line is not None:
            invoice_id, sep, item_id = line.partition("/")
            if not sep or not invoice_id or not item_id:
                raise click.BadParameter("must be INVOICE_ID/ITEM_ID", param_hint="--line")
            result = write_off_line(svc.engine, invoice_id, item_id, actor=actor(),
                                    reason=reason, note=note, now=svc.clock())
            if result.already:
                click.echo(f"line {line}: handled before; nothing more done")
            else:
                click.echo(f"wrote off the units short on line {line}; "
                           f"audit entry {result.audit_id}")
            return
        result = write_off(svc.engine, ids, actor=actor(), reason=reason, note=note,
                           now=svc.clock())
    except OperationError as exc:
        raise click.ClickException(str(exc)) from exc
    _said(result, "wrote off")


def _day_option(value: str | None, name: str) -> date | None:
    if value is None:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError as exc:
        raise click.BadParameter(f"{value!r} is not a day (YYYY-MM-DD)",
                                 param_hint=name) from exc


#: Lines ``invoices`` prints in one write.
ECHO_BATCH = 1000


@click.command("invoices")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--tenant", default=None, help="Only the lines of this tenant's customer.")
@click.option("--from", "from_day", default=None, metavar="YYYY-MM-DD",
              help="Finalized on or after this day (default: 35 days ago).")
@click.option("--to", "to_day", default=None, metavar="YYYY-MM-DD",
              help="Finalized on or before this day (default: today).")
def invoices(as_json: bool, tenant: str | None, from_day: str | None,
             to_day: str | None) -> None:
    """Every finalized metered invoice line against the project's own figure for its
    customer, meter and period: Stripe's quantity (invoiced), what Stripe took before the
    finalization (ours), what reached it after or not at all (late), what may have reached it
    on either side (uncertain), and the verdict."""
    from ...outbox.evidence import as_number
    from ...read.invoices import stream_lines, window

    svc = services()
    now = svc.clock()
    try:
        lo, hi = window(_day_option(from_day, "--from"), _day_option(to_day, "--to"), now)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--from/--to") from exc
    find_late(svc.engine, now=now)          # judge the lines read since the last look
    count = 0
    with reading(svc.engine) as conn:
        # Printed as they are read, a thousand at a time: a window of 100,000 lines starts
        # at once, and the terminal is not flushed line by line.
        if as_json:
            click.echo('{"invoices": [', nl=False)
        batch: list[str] = []
        for line in stream_lines(conn, lo, hi, tenant_id=tenant):
            if as_json:
                batch.append((", " if count else "") + json.dumps(line.as_dict()))
            else:
                batch.append(f"{line.invoice_id}  {line.invoice_status}  "
                             f"{line.tenant_id or '(no tenant)'}  {line.stripe_customer_id}  "
                             f"{line.meter}  {_day(line.period_start)} - "
                             f"{_day(line.period_end)}  invoiced {as_number(line.invoiced)}  "
                             f"ours {line.ours}  late {line.late}  "
                             f"uncertain {line.uncertain}  {line.verdict}\n")
            count += 1
            if len(batch) == ECHO_BATCH or count == 1:
                click.echo("".join(batch), nl=False)
                batch.clear()
        if batch:
            click.echo("".join(batch), nl=False)
    if as_json:
        click.echo("]}")
        return
    click.echo(f"{count} finalized line(s) from {lo.date()} to {hi.date()}")


@click.command("unbilled")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def unbilled(as_json: bool) -> None:
    """Usage Stripe took that no invoice will carry: in a trial, while the subscription was
    paused, after it ended without a final invoice, or with no metered item on the meter."""
    from ...outbox.unbilled import unbilled_events

    svc = services()
    keep_unbilled(svc.engine, now=svc.clock())
    with reading(svc.engine) as conn:
        found = unbilled_events(conn)
    units = sum(e.quantity for e in found)
    if as_json:
        click.echo(json.dumps({"units": units, "events": [e.as_dict() for e in found]}))
        return
    for e in found:
        click.echo(f"{e.id}  {e.tenant_id}  {e.stripe_customer_id}  {e.meter}  {e.quantity}  "
                   f"occurred {e.occurred_at.isoformat()}  {e.reason.replace('_', ' ')}")
    click.echo(f"{len(found)} event(s), {units} unit(s) on no invoice")


COMMANDS: list[click.Command] = [periods, invoices, late, unbilled]
