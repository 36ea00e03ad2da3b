"""Issue 28: a tenant is mapped only to a customer Stripe has. ``tenants set``, ``tenants
import``, the mapping form and the bulk import page ask Stripe (``GET /v1/customers/{id}``,
through the real SDK against the fake) while a key is set, and refuse an unknown or deleted
customer, or one Stripe could not be asked about, with one line naming it (an import: one line
per row, nothing applied); each customer is asked about once per refresh; without a key each
door maps and says it was not checked; the sync from Stripe keeps the customers it listed as
checked. Commands run as a user would, in processes of their own; SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import cli, make_settings, worker_env
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import Engine, select

from webapp import create_app
from webapp.models import AuditEntry, utcnow
from webapp.outbox.customers import NOT_IN_STRIPE_ADVICE
from webapp.outbox.operations import set_tenant
from webapp.outbox.sql import CUSTOMER_CHECKS
from webapp.services import services_of

from .conftest import csrf_of, login
from .test_mappings_bulk import apply, snapshot_of, upload
from .test_tenant_import import tenants, write

KNOWN, GONE, UNKNOWN = "cus_known", "cus_gone", "cus_unknown"
NO_SUCH = f"Stripe has no customer {UNKNOWN}"
DELETED = f"Stripe customer {GONE} is deleted in Stripe"
NOT_CHECKED = "not checked with Stripe (no STRIPE_API_KEY)"
KEY = "tenant_id"


@pytest.fixture
def fake(fake_stripe: Any) -> Any:
    """Stripe has KNOWN, has GONE deleted, and (customers being known) not UNKNOWN."""
    fake_stripe.create_customer(KNOWN, name="Known Co")
    fake_stripe.create_customer(GONE, deleted=True)
    return fake_stripe


@pytest.fixture
def app(db_url: str, engine: Engine, fake: Any) -> Flask:
    """The dashboard with a key, talking to the fake (``client_as`` signs in to it)."""
    return create_app({"TESTING": True},
                      settings=make_settings(db_url, stripe_api_base=fake.base_url),
                      engine=engine, start_drainer=False)


def run(db_url: str, fake: Any, *args: str, key: bool = True) -> Any:
    env = worker_env(db_url, fake.base_url)
    if not key:
        del env["STRIPE_API_KEY"]
    return cli(*args, env=env)


def mapping_audit(engine: Engine) -> list[tuple[str, str]]:
    """The audit entries of mappings (one tenant, or many), oldest first."""
    with engine.connect() as conn:
        return [(r.action, r.note or "") for r in conn.execute(
            select(AuditEntry.action, AuditEntry.note)
            .where(AuditEntry.action.in_(["tenant_map", "tenants_import", "tenants_sync"]))
            .order_by(AuditEntry.id))]


def kept(engine: Engine) -> dict[str, str]:
    with engine.connect() as conn:
        return {r.customer_id: r.state for r in conn.execute(
            select(CUSTOMER_CHECKS.c.customer_id, CUSTOMER_CHECKS.c.state))}


# -- tenants set ---------------------------------------------------------------------------

def test_tenants_set_refuses_a_customer_stripe_does_not_have_and_maps_one_it_has(
        db_url: str, engine: Engine, fake: Any) -> None:
    set_tenant(engine, "acme", stripe_customer_id="cus_before", name="Acme", now=utcnow())
    before = tenants(engine)
    for customer, said in ((UNKNOWN, NO_SUCH), (GONE, DELETED)):
        out = run(db_url, fake, "tenants", "set", "acme", "--stripe-customer", customer)
        assert out.returncode == 1 and out.stdout == ""
        assert out.stderr.splitlines() == [f"billing-outbox: {said}; {NOT_IN_STRIPE_ADVICE}"]
    assert tenants(engine) == before and mapping_audit(engine) == []

    done = run(db_url, fake, "tenants", "set", "acme", "--stripe-customer", KNOWN)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.strip() == f"acme -> {KNOWN}"
    assert tenants(engine)["acme"] == (KNOWN, "Acme")
    [(action, note)] = mapping_audit(engine)
    assert action == "tenant_map" and note == f"acme -> {KNOWN}; customer checked with Stripe"

    # Another tenant to the same customer within the refresh: Stripe's kept answer is used.
    again = run(db_url, fake, "tenants", "set", "beta", "--stripe-customer", KNOWN)
    assert again.returncode == 0 and tenants(engine)["beta"] == (KNOWN, None)
    # A customer Stripe said it lacks is asked about again (it may have been created since).
    refused_again = run(db_url, fake, "tenants", "set", "beta", "--stripe-customer", UNKNOWN)
    assert refused_again.returncode == 1
    assert refused_again.stderr.splitlines() == [
        f"billing-outbox: {NO_SUCH}; {NOT_IN_STRIPE_ADVICE}"]
    assert fake.customer_lookups == {UNKNOWN: 2, GONE: 1, KNOWN: 1}
    assert kept(engine) == {UNKNOWN: "missing", GONE: "deleted", KNOWN: "active"}


def test_stripe_unreachable_refuses_every_command_saying_it_could_not_be_asked(
        db_url: str, engine: Engine, fake: Any, tmp_path: Path) -> None:
    fake.set_outage(True)
    out = run(db_url, fake, "tenants", "set", "acme", "--stripe-customer", KNOWN)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.splitlines()[-1] == (f"billing-outbox: Stripe could not be asked about "
                                           f"customer {KNOWN}; try again in a moment")
    path = write(tmp_path, f"tenant_id,stripe_customer_id\na,{KNOWN}\nb,{KNOWN}\n")
    imported = run(db_url, fake, "tenants", "import", path)
    assert imported.returncode == 1
    lines = imported.stderr.splitlines()
    assert f"line 2: tenant 'a': Stripe could not be asked about customer {KNOWN}" in lines
    assert f"line 3: tenant 'b': Stripe could not be asked about customer {KNOWN}" in lines
    assert lines[-2:] == ["Stripe could not be asked about the customer of 2 lines: try again "
                          "in a moment", "2 bad lines: nothing was changed"]
    assert tenants(engine) == {} and mapping_audit(engine) == [] and kept(engine) == {}


def test_without_a_key_each_command_maps_and_says_it_was_not_checked(
        db_url: str, engine: Engine, fake: Any, tmp_path: Path) -> None:
    out = run(db_url, fake, "tenants", "set", "acme", "--stripe-customer", UNKNOWN, key=False)
    assert out.returncode == 0 and out.stdout.strip() == f"acme -> {UNKNOWN}"
    assert out.stderr.strip() == f"{UNKNOWN}: {NOT_CHECKED}"
    path = write(tmp_path, f"tenant_id,stripe_customer_id\nb,{GONE}\nc,{KNOWN}\n")
    imported = run(db_url, fake, "tenants", "import", path, key=False)
    assert imported.returncode == 0 and "2 added, 0 changed, 0 unchanged" in imported.stdout
    assert imported.stderr.strip() == f"the customers were {NOT_CHECKED}"
    assert tenants(engine) == {"acme": (UNKNOWN, None), "b": (GONE, None), "c": (KNOWN, None)}
    assert fake.customer_lookups == {}
    assert mapping_audit(engine) == [
        ("tenant_map", f"acme -> {UNKNOWN}; customer {NOT_CHECKED}"),
        ("tenants_import", f"tenants.csv: 2 added, 0 changed, 0 unchanged; customers "
                           f"{NOT_CHECKED}")]


# -- tenants import ------------------------------------------------------------------------

def test_an_import_naming_customers_stripe_lacks_is_refused_one_line_per_row(
        db_url: str, engine: Engine, fake: Any, tmp_path: Path) -> None:
    set_tenant(engine, "acme", stripe_customer_id="cus_before", name=None, now=utcnow())
    before = tenants(engine)
    path = write(tmp_path, "tenant_id,stripe_customer_id,name\n"
                           f"a,{KNOWN},A\n"
                           f"b,{UNKNOWN},\n"
                           f"acme,{GONE},\n"
                           f"d,{UNKNOWN},D\n"
                           f"e,{KNOWN},\n")
    for args in (["--dry-run"], []):
        out = run(db_url, fake, "tenants", "import", path, *args)
        assert out.returncode == 1 and out.stdout == ""
        lines = out.stderr.splitlines()
        assert len(lines) == 5, lines
        assert lines[0].startswith(f"line 3: tenant 'b': {NO_SUCH}")
        assert lines[1].startswith(f"line 4: tenant 'acme': {DELETED}")
        assert lines[2].startswith(f"line 5: tenant 'd': {NO_SUCH}")
        assert lines[3] == ("3 lines name a customer Stripe does not have (or has deleted): "
                            f"{NOT_IN_STRIPE_ADVICE}")
        assert lines[4] == "3 bad lines: nothing was changed"
        assert tenants(engine) == before and mapping_audit(engine) == []
    # Each distinct customer asked about once a run; the second run answered the one Stripe
    # has from what was kept, and asked again about those it lacked (they may exist by now).
    assert fake.customer_lookups == {KNOWN: 1, UNKNOWN: 2, GONE: 2}

    fixed = write(tmp_path, f"tenant_id,stripe_customer_id,name\na,{KNOWN},A\ne,{KNOWN},\n")
    done = run(db_url, fake, "tenants", "import", fixed)
    assert done.returncode == 0 and done.stderr == ""
    assert "2 added, 0 changed, 0 unchanged" in done.stdout
    assert tenants(engine) == {**before, "a": (KNOWN, "A"), "e": (KNOWN, None)}
    assert mapping_audit(engine) == [("tenants_import", "tenants.csv: 2 added, 0 changed, "
                                                        "0 unchanged; customers checked "
                                                        "with Stripe")]
    assert fake.customer_lookups == {KNOWN: 1, UNKNOWN: 2, GONE: 2}


# -- sync from Stripe ----------------------------------------------------------------------

def test_a_sync_keeps_the_customers_it_listed_as_checked(
        db_url: str, engine: Engine, fake: Any) -> None:
    fake.create_customer("cus_s1", name="S1", metadata={KEY: "s1"})
    fake.create_customer("cus_s2", metadata={KEY: "s2"})
    fake.delete_customer("cus_s2")          # deleted in Stripe after it named tenant s2
    fake.create_customer("cus_other", metadata={"plan": "pro"})
    done = run(db_url, fake, "tenants", "sync-from-stripe", "--metadata-key", KEY)
    assert done.returncode == 0, done.stderr
    assert tenants(engine) == {"s1": ("cus_s1", "S1")}        # s2 never mapped to a deleted one
    assert kept(engine) == {"cus_s1": "active"}               # what the sync may map, checked
    [(action, note)] = mapping_audit(engine)
    assert action == "tenants_sync" and note.endswith("; customers listed by Stripe")
    # Mapping another tenant to a listed customer asks Stripe nothing: the listing said so.
    again = run(db_url, fake, "tenants", "set", "s1-eu", "--stripe-customer", "cus_s1")
    assert again.returncode == 0 and fake.customer_lookups == {}


# -- the mapping form ----------------------------------------------------------------------

def flash_on(client: FlaskClient, path: str) -> str:
    html = client.get(path).get_data(as_text=True)
    return html.replace("&#39;", "'")


def test_the_mapping_form_refuses_a_customer_stripe_lacks_in_plain_words(
        client_as: Callable[[str | None], FlaskClient], engine: Engine, fake: Any,
        seed: Any, users: dict[str, str]) -> None:
    seed.event(tenant_id="newco", status="pending")
    admin = client_as("admin")
    token = csrf_of(admin, "/mappings")
    before = seed.snapshot()
    for customer, said in ((UNKNOWN, NO_SUCH), (GONE, DELETED)):
        resp = admin.post("/tenants/mapping", data={"tenant_id": "newco",
                                                    "stripe_customer_id": customer,
                                                    "csrf_token": token})
        assert resp.status_code == 303 and resp.headers["Location"] == "/tenants/newco"
        assert f"Nothing changed: {said}; {NOT_IN_STRIPE_ADVICE}" in flash_on(
            admin, "/tenants/newco")
        assert seed.snapshot() == before

    resp = admin.post("/tenants/mapping", data={"tenant_id": "newco", "name": "New Co",
                                                "stripe_customer_id": KNOWN,
                                                "csrf_token": token})
    assert resp.status_code == 303
    assert f"newco is now billed to {KNOWN} (Stripe has this customer)." in flash_on(
        admin, "/tenants/newco")
    assert tenants(engine) == {"newco": (KNOWN, "New Co")}
    with engine.connect() as conn:
        entry = conn.execute(select(AuditEntry.actor, AuditEntry.action, AuditEntry.note)
                             .where(AuditEntry.action == "tenant_map")).one()
    assert entry == (users["admin"], "tenant_map",
                     f"newco -> {KNOWN} (New Co); customer checked with Stripe")
    listing = admin.get("/mappings").get_data(as_text=True)
    assert "newco" in listing and KNOWN in listing and "New Co" in listing

    # Another tenant to the same customer within the refresh: no second question.
    admin.post("/tenants/mapping", data={"tenant_id": "newco-eu",
                                         "stripe_customer_id": KNOWN, "csrf_token": token})
    assert tenants(engine)["newco-eu"] == (KNOWN, None)
    assert fake.customer_lookups == {UNKNOWN: 1, GONE: 1, KNOWN: 1}

    # Stripe unreachable: refused, saying so, not mapped unchecked.
    fake.set_outage(True)
    admin.post("/tenants/mapping", data={"tenant_id": "newco", "csrf_token": token,
                                         "stripe_customer_id": "cus_brandnew"})
    assert ("Nothing changed: Stripe could not be asked about customer cus_brandnew; try "
            "again in a moment") in flash_on(admin, "/tenants/newco")
    assert tenants(engine)["newco"] == (KNOWN, "New Co")


def test_a_customer_created_after_a_refusal_maps_at_once_and_a_found_one_is_kept(
        app: Flask, client_as: Callable[[str | None], FlaskClient], engine: Engine,
        fake: Any) -> None:
    """A refusal is never from a kept answer: created in Stripe as the message advises, the
    customer maps at the next try. Found, it is asked again only after the refresh."""
    admin = client_as("admin")
    token = csrf_of(admin, "/mappings")
    form = {"tenant_id": "late", "stripe_customer_id": "cus_late", "csrf_token": token}
    admin.post("/tenants/mapping", data=form)
    assert "Stripe has no customer cus_late" in flash_on(admin, "/tenants/late")
    fake.create_customer("cus_late")            # created in Stripe, as the message advises
    admin.post("/tenants/mapping", data=form)
    assert tenants(engine) == {"late": ("cus_late", None)}
    assert fake.customer_lookups == {"cus_late": 2}
    other = dict(form, tenant_id="later")
    admin.post("/tenants/mapping", data=other)  # within the refresh: the kept answer
    assert fake.customer_lookups == {"cus_late": 2}
    svc = services_of(app)
    later = utcnow() + timedelta(seconds=svc.settings.meters_refresh_seconds + 1)
    svc.clock = lambda: later
    admin.post("/tenants/mapping", data=dict(form, tenant_id="latest"))
    assert fake.customer_lookups == {"cus_late": 3}
    assert tenants(engine)["latest"] == ("cus_late", None)


# -- the bulk import page ------------------------------------------------------------------

def test_the_bulk_import_refuses_a_file_naming_customers_stripe_lacks(
        client_as: Callable[[str | None], FlaskClient], engine: Engine, fake: Any) -> None:
    admin = client_as("admin")
    token = csrf_of(admin, "/mappings")
    resp = upload(admin, "tenant_id,stripe_customer_id,name\n"
                         f"a,{KNOWN},A\nb,{UNKNOWN},\nc,{GONE},\n", token=token)
    assert resp.status_code == 200
    html = resp.get_data(as_text=True).replace("&#39;", "'")
    assert "2 bad lines: nothing can be applied" in html
    assert f"line 3: tenant 'b': {NO_SUCH}" in html
    assert f"line 4: tenant 'c': {DELETED}" in html
    assert ("2 lines name a customer Stripe does not have (or has deleted): check the id in "
            "Stripe's dashboard, or create the customer first.") in html
    assert 'name="snapshot"' not in html and "Apply th" not in html
    assert tenants(engine) == {} and mapping_audit(engine) == []
    assert fake.customer_lookups == {KNOWN: 1, UNKNOWN: 1, GONE: 1}


def test_the_bulk_import_applies_known_customers_and_checks_them_again_on_apply(
        app: Flask, client_as: Callable[[str | None], FlaskClient], engine: Engine,
        fake: Any) -> None:
    fake.create_customer("cus_soongone")
    admin = client_as("admin")
    token = csrf_of(admin, "/mappings")
    text = f"tenant_id,stripe_customer_id\na,{KNOWN}\n\nb,cus_soongone\n"
    first = snapshot_of(upload(admin, text, token=token).get_data(as_text=True))
    assert apply(admin, first, token).status_code == 303    # the preview's answers, kept
    assert tenants(engine) == {"a": (KNOWN, None), "b": ("cus_soongone", None)}
    assert fake.customer_lookups == {KNOWN: 1, "cus_soongone": 1}
    assert mapping_audit(engine)[-1][1].endswith("; customers checked with Stripe")

    # Previewed, then the customer is deleted in Stripe and the kept answer grows old:
    # applying asks again and refuses, naming the line of the file.
    text = f"tenant_id,stripe_customer_id\nc,{KNOWN}\n\nd,cus_soongone\n"
    second = snapshot_of(upload(admin, text, token=token).get_data(as_text=True))
    fake.delete_customer("cus_soongone")
    svc = services_of(app)
    later = utcnow() + timedelta(seconds=svc.settings.meters_refresh_seconds + 1)
    svc.clock = lambda: later
    before = tenants(engine)
    refused = apply(admin, second, token)
    assert refused.status_code == 409
    html = refused.get_data(as_text=True).replace("&#39;", "'")
    assert "line 4: tenant 'd': Stripe customer cus_soongone is deleted in Stripe" in html
    assert 'name="snapshot"' not in html
    assert tenants(engine) == before and len(mapping_audit(engine)) == 1


def test_the_bulk_import_unreachable_stripe_refuses_saying_so(
        client_as: Callable[[str | None], FlaskClient], engine: Engine, fake: Any) -> None:
    admin = client_as("admin")
    token = csrf_of(admin, "/mappings")
    fake.set_outage(True)
    html = upload(admin, f"tenant_id,stripe_customer_id\na,{KNOWN}\n",
                  token=token).get_data(as_text=True).replace("&#39;", "'")
    assert f"line 2: tenant 'a': Stripe could not be asked about customer {KNOWN}" in html
    assert ("Stripe could not be asked about the customer of 1 line: try again in a moment"
            in html)
    assert 'name="snapshot"' not in html and tenants(engine) == {}


# -- without a key, on the dashboard -------------------------------------------------------

def test_without_a_key_the_dashboard_maps_and_says_it_was_not_checked(
        db_url: str, engine: Engine, fake: Any, users: dict[str, str]) -> None:
    app = create_app({"TESTING": True}, engine=engine, start_drainer=False,
                     settings=make_settings(db_url, stripe_api_key=None,
                                            stripe_api_base=fake.base_url))
    admin = app.test_client()
    assert login(admin, users["admin"]).status_code == 303
    token = csrf_of(admin, "/mappings")
    admin.post("/tenants/mapping", data={"tenant_id": "acme", "stripe_customer_id": UNKNOWN,
                                         "csrf_token": token})
    assert (f"acme is now billed to {UNKNOWN}. Stripe was not asked whether it has this "
            "customer: no Stripe API key is set here") in flash_on(admin, "/tenants/acme")

    preview = upload(admin, f"tenant_id,stripe_customer_id\nb,{GONE}\n", token=token)
    html = preview.get_data(as_text=True)
    assert preview.status_code == 200 and 'id="not-checked"' in html
    assert apply(admin, snapshot_of(html), token).status_code == 303
    assert ("Applied: 1 added, 0 changed, 0 unchanged. Stripe was not asked whether it has "
            "these customers") in flash_on(admin, "/mappings")
    assert tenants(engine) == {"acme": (UNKNOWN, None), "b": (GONE, None)}
    assert fake.customer_lookups == {}
    assert [note.rsplit("; ", 1)[1] for _, note in mapping_audit(engine)] == [
        f"customer {NOT_CHECKED}", f"customers {NOT_CHECKED}"]
