"""Mapping many tenants at once: ``billing-outbox tenants import FILE.csv [--dry-run]``.

The file has a header naming its columns: ``tenant_id`` and ``stripe_customer_id``, and
``name`` if wanted. It is all-or-nothing: every line is checked first, and one bad line (an
empty tenant id, a customer id that is not ``cus_…``, one tenant given two customers) refuses
the whole file with one message per bad line, nothing changed. Then, with a key set, so does
a line whose customer Stripe does not have, has deleted, or could not be asked about: the
caller asks Stripe (``webapp.worker.check_customers``, once per distinct customer) and passes
its verdicts in, so nothing here touches the network. Otherwise the changes are written in
one transaction, with one audit entry that counts them and says how the customers were
checked. Lines already true are counted as unchanged and not written. An empty ``name``
keeps the name a tenant has.

The planning and writing (:func:`plan`, :func:`apply_mappings`, :func:`fingerprint`) serve
every way of mapping many tenants: this file, Stripe's customers (``tenant_sync``) and the
mappings page's previews.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Connection, Engine, bindparam, insert, select
from sqlalchemy import update as sa_update
from sqlalchemy.exc import IntegrityError

from ..audit import write_audit
from ..models import fit
from .customers import NOT_IN_STRIPE_ADVICE, UNASKED_ADVICE, CustomerVerdicts
from .deferred import undefer_sendable
from .ids import customer_id_problem, tenant_id_problem
from .operations import OperationError
from .sql import TENANTS, text_in

COLUMNS = ("tenant_id", "stripe_customer_id", "name")
#: Stripe's customer ids: ``cus_`` and letters and digits.
#: Lines written (and existing tenants read) per statement.
BATCH = 2000
#: Bad lines reported at most; the count says how many there were in all.
MAX_PROBLEMS = 200


@dataclass(frozen=True)
class Mapping:
    line: int
    tenant_id: str
    stripe_customer_id: str
    name: str | None


@dataclass
class ImportPlan:
    """What importing a file would do: the lines to add and to change, how many are already
    true, and every bad line (when there is one, nothing may be applied)."""

    added: list[Mapping] = field(default_factory=list)
    changed: list[Mapping] = field(default_factory=list)
    unchanged: int = 0
    problems: list[str] = field(default_factory=list)
    bad_lines: int = 0
    #: For each changed tenant, its (customer, name) before the change.
    before: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    #: Of the bad lines: those whose customer Stripe does not have (or has deleted), and
    #: those whose customer Stripe could not be asked about.
    not_in_stripe: int = 0
    unasked: int = 0

    def summary(self) -> str:
        return (f"{len(self.added)} added, {len(self.changed)} changed, "
                f"{self.unchanged} unchanged")

    def bad(self, line: int, why: str) -> None:
        """Count a bad line, and keep its message (the first :data:`MAX_PROBLEMS`)."""
        self.bad_lines += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(f"line {line}: {why}")

    def advice(self) -> list[str]:
        """What to do about the lines Stripe's answers refused, one sentence each kind."""
        out = []
        if self.not_in_stripe:
            one = self.not_in_stripe == 1
            out.append(f"{self.not_in_stripe} {'line names' if one else 'lines name'} a "
                       "customer Stripe does not have (or has deleted): "
                       f"{NOT_IN_STRIPE_ADVICE}")
        if self.unasked:
            out.append(f"Stripe could not be asked about the customer of {self.unasked} "
                       f"line{'s' if self.unasked != 1 else ''}: {UNASKED_ADVICE}")
        return out


def read_file(lines: Iterable[str]) -> tuple[list[Mapping], ImportPlan]:
    """The file's mappings, and a plan holding its bad lines (if any)."""
    out = ImportPlan()
    bad = out.bad
    reader = csv.reader(lines)
    try:
        header = next(reader, None)
    except csv.Error as exc:
        bad(1, f"not CSV ({exc})")
        return [], out
    if header is None:
        bad(1, "the file is empty; its first line names the columns "
               "tenant_id,stripe_customer_id,name")
        return [], out
    names = [h.strip().lower().lstrip("\ufeff") for h in header]
    unknown = [h for h in names if h not in COLUMNS]
    missing = [c for c in COLUMNS[:2] if c not in names]
    if unknown or missing or len(set(names)) != len(names):
        bad(1, "the first line must name the columns tenant_id,stripe_customer_id and "
               f"optionally name (got {','.join(header)!r})")
        return [], out
    at = {name: i for i, name in enumerate(names)}
    seen: dict[str, Mapping] = {}
    rows: list[Mapping] = []
    try:
        for number, row in enumerate(reader, start=2):
            if not any(cell.strip() for cell in row):
                continue  # a blank line
            if len(row) != len(names):
                bad(number, f"{len(row)} cells, the header has {len(names)}")
                continue
            tenant = row[at["tenant_id"]].strip()
            customer = row[at["stripe_customer_id"]].strip()
            name = row[at["name"]].strip() if "name" in at else ""
            why = refused(tenant, customer)
            if why:
                bad(number, why)
                continue
            m = Mapping(number, tenant, customer, fit(TENANTS.c.name, name) if name else None)
            first = seen.get(tenant)
            if first is not None:
                if (first.stripe_customer_id, first.name) != (customer, m.name):
                    bad(number, f"tenant {tenant!r} is also on line {first.line} with "
                                "another customer or name")
                continue
            seen[tenant] = m
            rows.append(m)
    except csv.Error as exc:
        bad(reader.line_num, f"not CSV ({exc})")
    return rows, out


def refused(tenant: str, customer: str) -> str | None:
    """Why this tenant id or customer id cannot be mapped, or None."""
    return tenant_id_problem(tenant) or customer_id_problem(customer)


def refuse_customers(rows: Iterable[Mapping], out: ImportPlan,
                     customers: CustomerVerdicts) -> None:
    """Add a bad line to ``out`` for each row whose customer ``customers`` refuses: the
    tenant, the customer and what Stripe said (or that it could not be asked)."""
    for m in rows:
        why = customers.refusal(m.stripe_customer_id)
        if why is None:
            continue
        if customers.unasked(m.stripe_customer_id):
            out.unasked += 1
        else:
            out.not_in_stripe += 1
        out.bad(m.line, f"tenant {m.tenant_id!r}: {why}")


def plan(conn: Connection, rows: list[Mapping], out: ImportPlan) -> ImportPlan:
    """Sort ``rows`` into added, changed (keeping what each changed tenant has now, in
    ``out.before``) and unchanged against the tenants there are."""
    for i in range(0, len(rows), BATCH):
        chunk = rows[i:i + BATCH]
        have = {r.tenant_id: r for r in conn.execute(
            select(TENANTS.c.tenant_id, TENANTS.c.stripe_customer_id, TENANTS.c.name)
            .where(text_in(conn, TENANTS.c.tenant_id, [m.tenant_id for m in chunk])))}
        for m in chunk:
            now_ = have.get(m.tenant_id)
            if now_ is None:
                out.added.append(m)
            elif now_.stripe_customer_id != m.stripe_customer_id or (
                    m.name is not None and now_.name != m.name):
                out.changed.append(m)
                out.before[m.tenant_id] = (now_.stripe_customer_id, now_.name)
            else:
                out.unchanged += 1
    return out


def fingerprint(out: ImportPlan) -> str:
    """A digest of exactly what ``out`` would change, old values included: a preview's plan
    and the plan at apply time have the same fingerprint only if applying changes the same
    tenants from the same values to the same values."""
    content = [sorted((m.tenant_id, m.stripe_customer_id, m.name) for m in out.added),
               sorted((m.tenant_id, m.stripe_customer_id, m.name, *out.before[m.tenant_id])
                      for m in out.changed),
               out.unchanged]
    return hashlib.sha256(json.dumps(content).encode()).hexdigest()


def write_plan(conn: Connection, out: ImportPlan, *, now: datetime) -> None:
    """Write a plan's added and changed tenants in the caller's transaction (batched)."""
    for i in range(0, len(out.added), BATCH):
        conn.execute(insert(TENANTS), [
            {"tenant_id": m.tenant_id, "stripe_customer_id": m.stripe_customer_id,
             "name": m.name, "created_at": now, "updated_at": now}
            for m in out.added[i:i + BATCH]])
    update = (sa_update(TENANTS).where(TENANTS.c.tenant_id == bindparam("t"))
              .values(stripe_customer_id=bindparam("c"), updated_at=now))
    named = update.values(name=bindparam("n"))
    for i in range(0, len(out.changed), BATCH):
        chunk = out.changed[i:i + BATCH]
        with_name = [{"t": m.tenant_id, "c": m.stripe_customer_id, "n": m.name}
                     for m in chunk if m.name is not None]
        without = [{"t": m.tenant_id, "c": m.stripe_customer_id}
                   for m in chunk if m.name is None]
        if with_name:
            conn.execute(named, with_name)
        if without:
            conn.execute(update, without)


class StalePreview(OperationError):
    """The mappings changed since the preview: nothing applied; ``plan`` is a fresh one."""

    def __init__(self, fresh: ImportPlan) -> None:
        super().__init__("the mappings changed since this preview was made; nothing was "
                         "changed. Here is a fresh preview.")
        self.plan = fresh


def apply_mappings(engine: Engine, rows: list[Mapping], out: ImportPlan, *,
                   customers: CustomerVerdicts, now: datetime, actor: str, action: str,
                   note: str, dry_run: bool = False,
                   expected: str | None = None) -> ImportPlan:
    """Plan ``rows`` and (unless ``dry_run``) write the plan in one transaction with one
    audit entry (``action``, ``note``, the counts, and how the customers were checked);
    nothing is written or audited when there is nothing to change.

    ``customers`` is what Stripe said of the rows' customers, asked before this is called:
    a row whose customer it refuses is a bad line (:func:`refuse_customers`), and then, as
    with any bad line already in ``out``, nothing is planned or written. With ``expected`` (a
    preview's :func:`fingerprint`), a plan that differs from the preview's raises
    :class:`StalePreview` and writes nothing. Raises :class:`OperationError` when someone
    mapped one of the new tenants meanwhile."""
    refuse_customers(rows, out, customers)
    if out.bad_lines:
        return out
    try:
        with engine.begin() as conn:
            plan(conn, rows, out)
            if expected is not None and fingerprint(out) != expected:
                raise StalePreview(out)
            if dry_run or not (out.added or out.changed):
                return out
            write_plan(conn, out, now=now)
            # The newly mapped tenants' events put off while they had no customer: due now.
            undefer_sendable(conn, now=now)
            write_audit(conn, actor=actor, action=action, now=now,
                        note=f"{note}: {out.summary()}; customers {customers.how}")
    except IntegrityError:
        # Someone mapped one of these new tenants between the read and the write: the whole
        # set was rolled back; the next run sees that tenant and counts it as it should.
        raise OperationError("a tenant was mapped by someone else meanwhile; nothing was "
                             "changed, try again") from None
    return out


def import_mappings(engine: Engine, rows: list[Mapping], out: ImportPlan, *,
                    customers: CustomerVerdicts, now: datetime, actor: str, source: str,
                    dry_run: bool = False) -> ImportPlan:
    """Apply a file :func:`read_file` read (unless a line is bad, its customer refused by
    ``customers``, or ``dry_run``) in one transaction with one audit entry. The plan says
    what was (or would be) done, or every bad line."""
    if out.bad_lines:
        return out
    return apply_mappings(engine, rows, out, customers=customers, now=now, actor=actor,
                          action="tenants_import", note=source, dry_run=dry_run)
