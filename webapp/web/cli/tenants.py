"""The commands about tenants and their usage: ``tenants set|import|sync-from-stripe|list``
(the mapping to Stripe customers, one or many at once) and ``usage`` (the Tenants & usage
numbers for scripts). Thin, like the others: parse, call one function, print."""

from __future__ import annotations

import itertools
import json
import os
import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any, TextIO, cast

import click

from ...status import PROCESSING
from ...stripe_gateway import StripeCallFailed
from .common import actor, services

if TYPE_CHECKING:
    from ...outbox.customers import CustomerVerdicts


@click.group("tenants")
def tenants() -> None:
    """The tenant → Stripe customer mapping."""


@tenants.command("set")
@click.argument("tenant_id")
@click.option("--stripe-customer", required=True, help="cus_…")
@click.option("--name", default=None)
def tenants_set(tenant_id: str, stripe_customer: str, name: str | None) -> None:
    """Map TENANT_ID to a Stripe customer (its waiting events become sendable). With
    STRIPE_API_KEY set, Stripe is asked first: a customer it does not have, has deleted, or
    could not be asked about is refused and nothing changes."""
    from ...outbox.operations import OperationError, mapping_problem, set_tenant

    problem = mapping_problem(tenant_id, stripe_customer)
    if problem:
        raise OperationError(problem)
    customers = _verdicts([stripe_customer])
    set_tenant(services().engine, tenant_id, stripe_customer_id=stripe_customer, name=name,
               now=services().clock(), actor=actor(), customers=customers)
    click.echo(f"{tenant_id} -> {stripe_customer}")
    if not customers.checked:
        click.echo(f"{stripe_customer}: {customers.how}", err=True)


def _verdicts(customer_ids: Iterable[str]) -> CustomerVerdicts:
    """What Stripe says of these customers (nothing asked without a key)."""
    from ...worker import check_customers

    svc = services()
    return check_customers(svc.engine, svc.gateway(), svc.settings, customer_ids,
                           clock=svc.clock)


@tenants.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, readable=True))
@click.option("--dry-run", is_flag=True, help="Check the file (and, with a key, its "
              "customers in Stripe) and count the changes; change no mapping.")
def tenants_import(file: str, dry_run: bool) -> None:
    """Map many tenants from a CSV file (columns tenant_id,stripe_customer_id[,name]):
    all or nothing; one bad line refuses the file, each one named. With STRIPE_API_KEY set,
    Stripe is asked about each customer the file names, once: one it does not have, has
    deleted, or could not be asked about makes its line a bad one."""
    from ...outbox.tenant_import import import_mappings, read_file

    with open(file, encoding="utf-8-sig", newline="") as fh:
        try:
            rows, result = read_file(fh)
        except UnicodeDecodeError:
            click.echo(f"{file}: not UTF-8 text; save it as CSV UTF-8 and try again", err=True)
            raise SystemExit(1) from None
    customers = None
    if not result.bad_lines:
        # Stripe is asked only about a file that is otherwise good: a bad line would refuse
        # it anyway, and a long file's customers take a while to ask about.
        customers = _verdicts({m.stripe_customer_id for m in rows})
        result = import_mappings(services().engine, rows, result, customers=customers,
                                 now=services().clock(), actor=actor(),
                                 source=os.path.basename(file), dry_run=dry_run)
    if result.bad_lines:
        for problem in result.problems:
            click.echo(problem, err=True)
        for advice in result.advice():
            click.echo(advice, err=True)
        more = result.bad_lines - len(result.problems)
        click.echo((f"(and {more} more) " if more else "")
                   + f"{result.bad_lines} bad line{'s' if result.bad_lines != 1 else ''}: "
                   "nothing was changed", err=True)
        raise SystemExit(1)
    click.echo(("dry run, nothing written: would be " if dry_run else "")
               + result.summary())
    if customers is not None and not customers.checked:
        click.echo(f"the customers were {customers.how}", err=True)


@tenants.command("sync-from-stripe")
@click.option("--metadata-key", required=True, metavar="KEY",
              help="The key of the Stripe customers' metadata that holds the tenant id.")
@click.option("--dry-run", is_flag=True, help="Read Stripe and count the changes; change "
              "no mapping.")
def tenants_sync(metadata_key: str, dry_run: bool) -> None:
    """Map each tenant named in a Stripe customer's metadata (under KEY) to that customer;
    the customer's name, when it has one, becomes the tenant's. A tenant mapped to another
    customer is changed, as the import does. Nothing is guessed: a tenant named by two or
    more customers (a conflict) is left as it is, and a value that cannot be a tenant id is
    skipped; each is reported on a line of its own, the other mappings are applied all the
    same (one transaction, audited once), and the exit status is then 1. Tenants no
    customer names are left as they are."""
    from ...outbox.tenant_sync import key_problem, sync_mappings
    from ...worker import stripe_customers
    from .stripe_calls import StripeUnreachable, _gateway

    problem = key_problem(metadata_key)
    if problem:
        raise click.BadParameter(problem, param_hint="--metadata-key")
    svc = services()
    try:
        customers = stripe_customers(
            svc.engine, _gateway(), metadata_key,
            max_requests_per_second=svc.settings.stripe_max_requests_per_second,
            now=svc.clock())
    except StripeCallFailed as exc:
        raise StripeUnreachable(f"{exc}; nothing was changed") from exc
    named, done = sync_mappings(svc.engine, customers, key=metadata_key, now=svc.clock(),
                                actor=actor(), dry_run=dry_run)
    click.echo(f"{named.customers} Stripe customers, {named.named} naming a tenant under "
               f"{metadata_key!r}")
    click.echo(("dry run, nothing written: would be " if dry_run else "") + done.summary())
    if named.reported:
        for line in named.problems:
            click.echo(line, err=True)
        more = named.reported - len(named.problems)
        click.echo((f"(and {more} more) " if more else "")
                   + f"{named.conflicts} conflicts, {named.invalid} invalid entries: those "
                   "tenants were not changed"
                   + ("" if dry_run else "; every other mapping was applied"), err=True)
        raise SystemExit(1)


@tenants.command("list")
@click.option("--json", "as_json", is_flag=True)
def tenants_list(as_json: bool) -> None:
    """Every tenant and its Stripe customer."""
    from ...db import reading
    from ...read.tenants import tenants_list

    with reading(services().engine) as conn:
        rows = [{k: r[k] for k in ("tenant_id", "name", "stripe_customer_id")}
                for r in tenants_list(conn)]
    if as_json:
        click.echo(json.dumps(rows))
        return
    for row in rows:
        click.echo(f"{row['tenant_id']}\t{row['stripe_customer_id'] or '-'}\t{row['name'] or ''}")


def _parse_day(value: str | None) -> date | None:
    if value is None:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"not a date (YYYY-MM-DD): {value!r}") from None


#: ``usage --json`` writes its rows this many at a time.
ROWS_PER_WRITE = 1000


@click.command("usage")
@click.option("--from", "start", default=None, help="First UTC day (YYYY-MM-DD); default: "
              "the first of this month.")
@click.option("--to", "end", default=None, help="Last UTC day, included; default: today.")
@click.option("--tenant", default=None, help="One tenant only.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def usage(start: str | None, end: str | None, tenant: str | None, as_json: bool) -> None:
    """The Tenants & usage numbers: events and units per tenant and meter, by status, for the
    events that occurred (UTC days) in the period, as Stripe bills them."""
    from ...read.tenants import USAGE_STATUSES, month_start
    from ...read.usage_table import usage_rows_streamed

    now = services().clock()
    first = _parse_day(start) or month_start(now)
    last = _parse_day(end) or now.astimezone(UTC).date()
    if last < first:
        raise click.BadParameter(f"--to {last} is before --from {first}")
    statuses = (*USAGE_STATUSES, PROCESSING)
    out = sys.stdout
    if as_json:
        _usage_json(out, first, last, tenant, statuses)
        return
    # Streamed from one snapshot, a thousand rows at a time.
    rows = usage_rows_streamed(services().engine, start=first, end=last, tenant_id=tenant,
                               in_flight_apart=True)
    # The query runs before anything is written: a database that fails it leaves nothing
    # half written.
    first_row = next(rows, None)
    if first_row is not None:
        rows = itertools.chain([first_row], rows)
    out.write(f"usage that occurred {first} – {last} (UTC days): events / units\n")
    out.write("\t".join(["tenant", "customer", "meter", *statuses, "stripe"]) + "\n")
    for r in rows:
        out.write("\t".join([r.tenant_id, r.stripe_customer_id or "-", r.meter, *(
            f"{r.events[s]}/{r.quantity[s]}" for s in statuses),
            f"{r.stripe_units:g} ({r.compared_days} days)" if r.stripe_units is not None
            else "not compared yet"]) + "\n")


def _usage_json(out: TextIO, first: date, last: date, tenant: str | None,
                statuses: tuple[str, ...]) -> None:
    """``usage --json``: the same bytes as ``json.dumps`` of the whole document, streamed
    from one snapshot a thousand rows at a time (at 100,000 tenants, building the whole
    document in memory first took ten times its size), each thousand encoded in one call,
    each row's object built straight from the database's cells."""
    from ...outbox.sql import as_utc
    from ...read.usage_table import usage_cells_streamed

    parts = usage_cells_streamed(services().engine, start=first, end=last, tenant_id=tenant,
                                 in_flight_apart=True)
    # The query runs before anything is written: a database that fails it leaves no half
    # document behind.
    first_part = next(parts, None)
    n = len(statuses)
    keys = [(f"{s}_events", 4 + i, f"{s}_units", 4 + n + i) for i, s in enumerate(statuses)]
    # A period's rows share the few times its reconciliations ran: each written out once.
    stamps: dict[object, str] = {}

    def as_dict(r: Sequence[Any]) -> dict[str, object]:
        row: dict[str, object] = {"tenant_id": r[0], "stripe_customer_id": r[3], "meter": r[1]}
        for events_key, events_at, units_key, units_at in keys:
            row[events_key], row[units_key] = r[events_at], r[units_at]
        stripe, units, days, at = r[4 + 2 * n:8 + 2 * n]
        if days is None:  # no day of the period was compared: Stripe's figure is null
            row.update(stripe_units=None, compared_units=None, compared_days=0,
                       compared_at=None)
            return row
        figure = float(stripe)
        row["stripe_units"] = int(figure) if figure.is_integer() else figure
        row["compared_units"], row["compared_days"] = int(units), int(days)
        stamp = stamps.get(at)
        if stamp is None:  # a compared row always has its time
            stamp = stamps[at] = cast(datetime, as_utc(at)).isoformat()
        row["compared_at"] = stamp
        return row

    head = json.dumps({"from": first.isoformat(), "to": last.isoformat(), "rows": []})
    out.write(head[:-2])
    sep = ""
    for part in itertools.chain([first_part] if first_part is not None else [], parts):
        for i in range(0, len(part), ROWS_PER_WRITE):
            out.write(sep + json.dumps([as_dict(r) for r in part[i:i + ROWS_PER_WRITE]])[1:-1])
            sep = ", "
    out.write("]}\n")


COMMANDS: list[click.Command] = [tenants, usage]
