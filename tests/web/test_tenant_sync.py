"""Issue 15, bulk mapping: ``billing-outbox tenants sync-from-stripe --metadata-key KEY
[--dry-run]`` run as a user would, in a process of its own, against the fake Stripe through the
real SDK: every page of customers, deleted ones skipped, conflicts reported and never guessed,
the rest applied in one transaction audited once as ``tenants_sync``."""

from __future__ import annotations

from typing import Any

from conftest import cli, worker_env
from sqlalchemy import Engine

from webapp.models import utcnow
from webapp.outbox.operations import set_tenant
from webapp.outbox.tenant_sync import StripeCustomer, mappings_from
from webapp.stripe_gateway import SdkGateway

from .test_tenant_import import audit, tenants

KEY = "tenant_id"


def sync(db_url: str, fake: Any, *args: str) -> Any:
    return cli("tenants", "sync-from-stripe", "--metadata-key", KEY, *args,
               env=worker_env(db_url, fake.base_url))


def test_a_sync_maps_named_tenants_and_changes_a_remapped_one(
        db_url: str, engine: Engine, fake_stripe: Any) -> None:
    now = utcnow()
    set_tenant(engine, "acme", stripe_customer_id="cus_acme", name="Acme", now=now)
    set_tenant(engine, "globex", stripe_customer_id="cus_oldglobex", name="Globex", now=now)
    set_tenant(engine, "left", stripe_customer_id="cus_left", name=None, now=now)
    fake = fake_stripe
    fake.create_customer("cus_acme", name="Acme", metadata={KEY: "acme"})       # unchanged
    fake.create_customer("cus_globex2", name=None, metadata={KEY: " globex "})  # changed
    fake.create_customer("cus_umb", name="Umbrella", metadata={KEY: "umbrella"})  # added
    fake.create_customer("cus_other", name="No tenant", metadata={"plan": "pro"})
    fake.create_customer("cus_gone", deleted=True)
    before = tenants(engine)

    dry = sync(db_url, fake, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "4 Stripe customers, 3 naming a tenant" in dry.stdout
    assert "dry run, nothing written: would be 1 added, 1 changed, 1 unchanged" in dry.stdout
    assert tenants(engine) == before and audit(engine) == []

    done = sync(db_url, fake)
    assert done.returncode == 0, done.stderr
    assert "1 added, 1 changed, 1 unchanged" in done.stdout
    assert tenants(engine) == {"acme": ("cus_acme", "Acme"),
                               "globex": ("cus_globex2", "Globex"),  # no name: kept
                               "umbrella": ("cus_umb", "Umbrella"),
                               "left": ("cus_left", None)}           # never unmapped
    [(action, note)] = audit(engine)
    assert action == "tenants_sync" and "'tenant_id'" in (note or "")
    assert "1 added, 1 changed, 1 unchanged" in (note or "")

    again = sync(db_url, fake)
    assert again.returncode == 0 and "0 added, 0 changed, 3 unchanged" in again.stdout
    assert len(audit(engine)) == 1  # nothing changed, nothing audited


def test_conflicts_and_bad_values_are_reported_and_the_rest_applied(
        db_url: str, engine: Engine, fake_stripe: Any) -> None:
    set_tenant(engine, "twice", stripe_customer_id="cus_keep", name="Twice", now=utcnow())
    fake = fake_stripe
    fake.create_customer("cus_t1", metadata={KEY: "twice"})
    fake.create_customer("cus_t2", metadata={KEY: "twice"})
    fake.create_customer("cus_n1", metadata={KEY: "newco"})
    fake.create_customer("cus_n2", metadata={KEY: "newco"})   # a new tenant named twice
    fake.create_customer("cus_long", metadata={KEY: "x" * 101})
    fake.create_customer("cus_blank", metadata={KEY: "   "})
    fake.create_customer("cus_fine", name="Fine", metadata={KEY: "fine"})

    dry = sync(db_url, fake, "--dry-run")
    assert dry.returncode == 1
    assert "would be 1 added, 0 changed, 0 unchanged" in dry.stdout
    lines = dry.stderr.strip().splitlines()
    assert ("conflict: tenant 'twice' is named by 2 Stripe customers (cus_t1, cus_t2); it "
            "was not changed") in lines
    assert any(line.startswith("conflict: tenant 'newco'") for line in lines)
    assert any(line.startswith("customer 'cus_long': tenant id 'xxx") for line in lines)
    assert "customer 'cus_blank': the tenant id is empty; skipped" in lines
    assert lines[-1] == "2 conflicts, 2 invalid entries: those tenants were not changed"
    assert audit(engine) == []

    done = sync(db_url, fake)
    assert done.returncode == 1 and "1 added, 0 changed, 0 unchanged" in done.stdout
    assert done.stderr.strip().splitlines()[-1].endswith("every other mapping was applied")
    assert tenants(engine) == {"twice": ("cus_keep", "Twice"), "fine": ("cus_fine", "Fine")}
    [(action, note)] = audit(engine)
    assert action == "tenants_sync" and "2 conflicts and 2 invalid entries" in (note or "")


def test_every_page_is_read_and_a_rerun_changes_nothing(
        db_url: str, engine: Engine, fake_stripe: Any) -> None:
    fake = fake_stripe
    for i in range(250):
        fake.create_customer(f"cus_{i:04d}", name=f"Tenant {i}", metadata={KEY: f"t{i:04d}"})
        if i % 50 == 0:
            fake.create_customer(f"cus_del{i}", deleted=True)
    done = sync(db_url, fake)
    assert done.returncode == 0, done.stderr
    assert "250 Stripe customers" in done.stdout and "250 added, 0 changed" in done.stdout
    assert fake.customer_list_calls == 3  # 255 listed, 100 a page
    got = tenants(engine)
    assert len(got) == 250 and got["t0249"] == ("cus_0249", "Tenant 249")
    again = sync(db_url, fake)
    assert "0 added, 0 changed, 250 unchanged" in again.stdout
    assert len(audit(engine)) == 1


def test_stripe_unreachable_or_a_bad_key_changes_nothing(
        db_url: str, engine: Engine, fake_stripe: Any) -> None:
    fake_stripe.create_customer("cus_a", metadata={KEY: "a"})
    fake_stripe.set_auth_failure(401)
    out = sync(db_url, fake_stripe)
    assert out.returncode == 1 and "listing customers" in out.stderr
    assert "nothing was changed" in out.stderr and tenants(engine) == {}
    bad = cli("tenants", "sync-from-stripe", "--metadata-key", "a[b]",
              env=worker_env(db_url, fake_stripe.base_url))
    assert bad.returncode == 2 and "square brackets" in bad.stderr


def test_the_gateway_pages_through_every_customer(fake_stripe: Any) -> None:
    for i in range(7):
        fake_stripe.create_customer(f"cus_p{i}", name=f"P{i}", metadata={KEY: f"p{i}"})
    fake_stripe.create_customer("cus_x", deleted=True)
    fake_stripe.create_customer("cus_none")
    gateway = SdkGateway("sk_test_123", api_base=fake_stripe.base_url, timeout_seconds=5)
    paced: list[int] = []
    try:
        found = gateway.list_customers(KEY, page_size=3, pace=lambda: paced.append(1))
    finally:
        gateway.close()
    assert [c.id for c in found] == [f"cus_p{i}" for i in range(7)] + ["cus_none"]
    assert found[0] == StripeCustomer("cus_p0", "P0", "p0") and found[-1].tenant_id is None
    assert len(paced) == fake_stripe.customer_list_calls == 3


def test_names_are_trimmed_and_conflicts_counted_once_per_tenant() -> None:
    named = mappings_from([StripeCustomer("cus_a", "  A  ", "a"),
                           StripeCustomer("cus_b", None, "b"),
                           StripeCustomer("cus_c", None, "b"),
                           StripeCustomer("cus_d", None, "b"),
                           StripeCustomer("acct_1", None, "z"),
                           StripeCustomer("cus_e", None, None)])
    assert [(m.tenant_id, m.stripe_customer_id, m.name) for m in named.rows] == [
        ("a", "cus_a", "A")]
    assert (named.customers, named.named, named.conflicts, named.invalid) == (6, 5, 1, 1)
