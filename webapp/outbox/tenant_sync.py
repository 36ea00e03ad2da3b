"""Mapping tenants from Stripe's own customers:
``billing-outbox tenants sync-from-stripe --metadata-key KEY [--dry-run]``.

Each Stripe customer whose metadata holds ``KEY`` names the tenant it bills: that tenant is
mapped to it (added if new, changed if it had another customer; the customer's name, when it
has one, becomes the tenant's). Nothing is guessed:

- two or more customers naming the same tenant are a *conflict*: that tenant is reported with
  every customer naming it and left exactly as it is;
- a value that cannot be a tenant id (blank, over 100 characters, not printable) and a
  customer id that is not ``cus_…`` are reported and skipped.

What is reported does not hold back the rest: every other mapping is applied, in one
transaction with one audit entry (``tenants_sync``). Tenants no customer names are left as
they are (the sync never unmaps). The planning and writing are the file import's
(``tenant_import``), so both count added / changed / unchanged the same way.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Engine

from ..models import fit
from .customers import ACTIVE, CustomerCheck, CustomerVerdicts
from .sql import TENANTS
from .tenant_import import ImportPlan, Mapping, apply_mappings, refused

#: Conflicts and invalid entries reported at most; the count says how many there were.
MAX_REPORTED = 200
#: The audit action of a sync (the file import's is ``tenants_import``).
SYNC_ACTION = "tenants_sync"
#: The longest metadata key Stripe allows.
MAX_KEY = 40


@dataclass(frozen=True)
class StripeCustomer:
    """One Stripe customer as the sync reads it: its id, its name and the value its metadata
    holds under the key asked for (None when it has none)."""

    id: str
    name: str | None
    tenant_id: str | None


@dataclass
class SyncPlan:
    """The mappings Stripe's customers name, and what cannot be mapped (``problems``: one
    line each, at most :data:`MAX_REPORTED`; ``conflicts`` and ``invalid`` count them all)."""

    rows: list[Mapping]
    customers: int = 0
    named: int = 0
    conflicts: int = 0
    invalid: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def reported(self) -> int:
        return self.conflicts + self.invalid


def key_problem(key: str) -> str | None:
    """Why ``key`` cannot be a Stripe metadata key, or None."""
    if not key.strip():
        return "the metadata key is empty"
    if len(key) > MAX_KEY or "[" in key or "]" in key or not key.isprintable():
        return (f"the metadata key must be 1–{MAX_KEY} printable characters without square "
                "brackets")
    return None


def mappings_from(customers: Iterable[StripeCustomer]) -> SyncPlan:
    """The mappings named by ``customers`` (each tenant once, in the order first named),
    with every conflict and invalid entry reported instead of mapped."""
    out = SyncPlan(rows=[])
    problems = out.problems

    def report(line: str) -> None:
        if len(problems) < MAX_REPORTED:
            problems.append(line)

    by_tenant: defaultdict[str, list[StripeCustomer]] = defaultdict(list)
    for c in customers:
        out.customers += 1
        if c.tenant_id is None:
            continue
        out.named += 1
        tenant = c.tenant_id.strip()
        why = refused(tenant, c.id)
        if why:
            out.invalid += 1
            report(f"customer {c.id[:60]!r}: {why}; skipped")
            continue
        by_tenant[tenant].append(c)
    for tenant, named in by_tenant.items():
        if len(named) > 1:
            out.conflicts += 1
            ids = ", ".join(c.id for c in named[:10]) + (" …" if len(named) > 10 else "")
            report(f"conflict: tenant {tenant!r} is named by {len(named)} Stripe customers "
                   f"({ids}); it was not changed")
            continue
        c = named[0]
        name = (c.name or "").strip()
        out.rows.append(Mapping(len(out.rows) + 1, tenant, c.id,
                                fit(TENANTS.c.name, name) if name else None))
    return out


def sync_mappings(engine: Engine, customers: Iterable[StripeCustomer], *, key: str,
                  now: datetime, actor: str, dry_run: bool = False
                  ) -> tuple[SyncPlan, ImportPlan]:
    """Map every tenant ``customers`` name under ``key`` (unless ``dry_run``), in one
    transaction audited once as ``tenants_sync``: what Stripe named (with what was reported)
    and what was (or would be) done. Raises ``OperationError`` as ``apply_mappings`` does."""
    named = mappings_from(customers)
    done = apply_mappings(engine, named.rows, ImportPlan(), customers=listed(named),
                          now=now, actor=actor, action=SYNC_ACTION,
                          note=sync_note(key, named), dry_run=dry_run)
    return named, done


def listed(named: SyncPlan) -> CustomerVerdicts:
    """The verdicts on the customers a sync maps: they come from Stripe's own listing, which
    leaves deleted customers out, so Stripe has each of them. They are not asked about again
    one by one (the listing already kept them as checked, ``webapp.worker.stripe_customers``)."""
    return CustomerVerdicts.listed(CustomerCheck(m.stripe_customer_id, ACTIVE, name=m.name)
                                   for m in named.rows)


def sync_note(key: str, named: SyncPlan) -> str:
    """The audit entry's note: the metadata key and what was left out."""
    note = f"Stripe customers' metadata {key!r}"
    if named.reported:
        note += f" ({named.conflicts} conflicts and {named.invalid} invalid entries left out)"
    return note
