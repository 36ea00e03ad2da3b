"""Issue 15, bulk mapping on the mappings page: a CSV file or Stripe's customers, previewed
(added, changed old → new, unchanged, bad lines or conflicts), then exactly the previewed
changes applied and audited as the acting admin — or, when a mapping changed meanwhile,
nothing applied and a fresh preview shown. Admins only; CSRF-protected."""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from typing import Any

import pytest
from conftest import make_settings
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import Engine, select

from webapp import create_app
from webapp.models import AuditEntry, utcnow
from webapp.outbox.operations import set_tenant

from .conftest import csrf_of, login
from .test_tenant_import import tenants

SNAP_RE = re.compile(r'name="snapshot" value="([^"]+)"')
GOOD = ("tenant_id,stripe_customer_id,name\n"
        "acme,cus_acme,\n"            # unchanged
        "globex,cus_globex2,Globex\n"  # changed
        "umbrella,cus_umb,Umbrella\n")  # added


def upload(client: FlaskClient, text: str | bytes, *, token: str | None = None,
           name: str = "tenants.csv") -> Any:
    data: dict[str, Any] = {"file": (io.BytesIO(text.encode() if isinstance(text, str)
                                                else text), name)}
    if token is not None:
        data["csrf_token"] = token
    return client.post("/mappings/import", data=data, content_type="multipart/form-data")


def apply(client: FlaskClient, snapshot: str, token: str) -> Any:
    return client.post("/mappings/apply", data={"snapshot": snapshot, "csrf_token": token})


def snapshot_of(html: str) -> str:
    found = SNAP_RE.search(html)
    assert found, html[:2000]
    return found.group(1)


def audit(engine: Engine) -> list[tuple[str, str | None]]:
    """The bulk mapping entries of the audit log (log-ins are audited too)."""
    with engine.connect() as conn:
        rows = conn.execute(select(AuditEntry.action, AuditEntry.note, AuditEntry.actor)
                            .where(AuditEntry.action.like("tenants_%"))
                            .order_by(AuditEntry.id)).all()
    assert all(r.actor == "admin@example.com" for r in rows)  # the acting person
    return [(r.action, r.note) for r in rows]


@pytest.fixture
def app(db_url: str, engine: Engine, fake_stripe: Any) -> Flask:
    """The dashboard with a key, against the fake (which, knowing no customer, has every
    one: Stripe's checks of the customers are ``test_mapping_checks``'s)."""
    return create_app({"TESTING": True},
                      settings=make_settings(db_url, stripe_api_base=fake_stripe.base_url),
                      engine=engine, start_drainer=False)


@pytest.fixture
def mapped(engine: Engine) -> None:
    now = utcnow()
    set_tenant(engine, "acme", stripe_customer_id="cus_acme", name="Acme", now=now)
    set_tenant(engine, "globex", stripe_customer_id="cus_oldglobex", name=None, now=now)


def test_an_admin_previews_a_file_then_applies_exactly_it(
        client_as: Callable[[str | None], FlaskClient], engine: Engine, mapped: None) -> None:
    admin = client_as("admin")
    page = admin.get("/mappings").get_data(as_text=True)
    assert "Upload a CSV" in page and "Sync from Stripe" in page
    token = csrf_of(admin, "/mappings")
    before = tenants(engine)
    preview = upload(admin, GOOD, token=token)
    assert preview.status_code == 200
    html = preview.get_data(as_text=True)
    assert 'data-k="added">1<' in html and 'data-k="changed">1<' in html
    assert 'data-k="unchanged">1<' in html and "Apply these 2 changes" in html
    assert "cus_oldglobex" in html and "cus_globex2" in html  # old → new
    assert tenants(engine) == before and audit(engine) == []   # a preview writes nothing

    done = apply(admin, snapshot_of(html), token)
    assert done.status_code == 303 and done.headers["Location"].endswith("/mappings")
    assert tenants(engine) == {"acme": ("cus_acme", "Acme"), "globex": ("cus_globex2", "Globex"),
                               "umbrella": ("cus_umb", "Umbrella")}
    [(action, note)] = audit(engine)
    assert action == "tenants_import" and "tenants.csv: 1 added, 1 changed" in (note or "")
    shown = admin.get("/mappings").get_data(as_text=True)
    assert "Applied: 1 added, 1 changed, 1 unchanged." in shown


def test_a_file_with_bad_lines_is_shown_and_cannot_be_applied(
        client_as: Callable[[str | None], FlaskClient], engine: Engine, mapped: None) -> None:
    admin = client_as("admin")
    token = csrf_of(admin, "/mappings")
    html = upload(admin, "tenant_id,stripe_customer_id\nnewco,cus_new\n,cus_x\n"
                         "acme,acct_1\n<b>x</b>,cus_y,z\n", token=token).get_data(as_text=True)
    assert "3 bad lines: nothing can be applied" in html
    assert "line 3: the tenant id is empty" in html and "line 4: Stripe customer id" in html
    assert "<b>x</b>" not in html  # escaped
    assert 'name="snapshot"' not in html and "Apply these" not in html
    assert audit(engine) == []


def test_a_stale_preview_is_refused_and_a_fresh_one_shown(
        client_as: Callable[[str | None], FlaskClient], engine: Engine, mapped: None) -> None:
    admin = client_as("admin")
    token = csrf_of(admin, "/mappings")
    first = snapshot_of(upload(admin, GOOD, token=token).get_data(as_text=True))
    # Someone maps umbrella elsewhere meanwhile: the preview's "add" is no longer what applies.
    set_tenant(engine, "umbrella", stripe_customer_id="cus_someone", name=None, now=utcnow())
    before = tenants(engine)
    refused = apply(admin, first, token)
    assert refused.status_code == 409
    html = refused.get_data(as_text=True)
    assert "The mappings changed since that preview was made" in html
    assert 'data-k="added">0<' in html and 'data-k="changed">2<' in html
    assert "cus_someone" in html
    assert tenants(engine) == before and audit(engine) == []
    fresh = snapshot_of(html)
    assert apply(admin, fresh, token).status_code == 303
    assert tenants(engine)["umbrella"] == ("cus_umb", "Umbrella")
    assert [a for a, _ in audit(engine)] == ["tenants_import"]
    # The same preview again: it no longer matches (it was applied): refused, nothing written.
    again = apply(admin, fresh, token)
    assert again.status_code == 409 and "Nothing to change" in again.get_data(as_text=True)
    assert len(audit(engine)) == 1


def test_only_admins_and_only_with_the_csrf_token(
        client_as: Callable[[str | None], FlaskClient], engine: Engine, mapped: None) -> None:
    for role in ("viewer", "operator"):
        client = client_as(role)
        page = client.get("/mappings").get_data(as_text=True)
        assert "Upload a CSV" not in page and "Sync from Stripe" not in page
        token = csrf_of(client, "/mappings")
        assert upload(client, GOOD, token=token).status_code == 403
        assert client.post("/mappings/sync", data={"metadata_key": "t",
                                                   "csrf_token": token}).status_code == 403
        assert apply(client, "x", token).status_code == 403
    admin = client_as("admin")
    assert upload(admin, GOOD).status_code == 400  # no CSRF token
    token = csrf_of(admin, "/mappings")
    snap = snapshot_of(upload(admin, GOOD, token=token).get_data(as_text=True))
    assert admin.post("/mappings/apply", data={"snapshot": snap}).status_code == 400
    assert apply(admin, snap[:-4] + "AAAA", token).status_code == 400  # forged
    assert audit(engine) == [] and tenants(engine)["globex"][0] == "cus_oldglobex"


def test_too_large_not_utf8_or_no_file_is_a_plain_400(
        client_as: Callable[[str | None], FlaskClient]) -> None:
    admin = client_as("admin")
    token = csrf_of(admin, "/mappings")
    big = "tenant_id,stripe_customer_id\n" + "t,cus_1\n" * 70_000   # > 512 KB, < 1 MB
    resp = upload(admin, big, token=token)
    assert resp.status_code == 400 and "larger than 512 KB" in resp.get_data(as_text=True)
    assert upload(admin, "x" * (1024 * 1024 + 10), token=token).status_code == 413
    latin = upload(admin, "tenant_id,stripe_customer_id\nm\xfcller,cus_1\n".encode("latin-1"),
                   token=token)
    assert latin.status_code == 400 and "not UTF-8" in latin.get_data(as_text=True)
    none = admin.post("/mappings/import", data={"csrf_token": token},
                      content_type="multipart/form-data")
    assert none.status_code == 400 and "Choose a CSV file" in none.get_data(as_text=True)


def test_a_sync_from_stripe_is_previewed_with_its_conflicts_then_applied(
        app: Flask, users: dict[str, str], engine: Engine, fake_stripe: Any,
        mapped: None) -> None:
    fake_stripe.create_customer("cus_acme", name="Acme", metadata={"tenant": "acme"})
    fake_stripe.create_customer("cus_g", name="Globex", metadata={"tenant": "globex"})
    fake_stripe.create_customer("cus_x1", metadata={"tenant": "dup"})
    fake_stripe.create_customer("cus_x2", metadata={"tenant": "dup"})
    admin = app.test_client()
    assert login(admin, users["admin"]).status_code == 303
    token = csrf_of(admin, "/mappings")
    preview = admin.post("/mappings/sync", data={"metadata_key": "tenant", "csrf_token": token})
    html = preview.get_data(as_text=True)
    assert preview.status_code == 200, html[:2000]
    assert 'data-k="changed">1<' in html and 'data-k="unchanged">1<' in html
    assert "conflict: tenant &#39;dup&#39; is named by 2 Stripe customers" in html
    assert "Apply this change<" in html
    assert audit(engine) == []
    assert apply(admin, snapshot_of(html), token).status_code == 303
    assert tenants(engine)["globex"] == ("cus_g", "Globex") and "dup" not in tenants(engine)
    [(action, note)] = audit(engine)
    assert action == "tenants_sync" and "1 conflicts and 0 invalid entries" in (note or "")
    # Applying checked the customers again from what the listing kept: nothing asked.
    assert fake_stripe.customer_lookups == {}

    bad = admin.post("/mappings/sync", data={"metadata_key": "a[b]", "csrf_token": token})
    assert bad.status_code == 400 and "square brackets" in bad.get_data(as_text=True)
    fake_stripe.set_auth_failure(401)
    down = admin.post("/mappings/sync", data={"metadata_key": "tenant", "csrf_token": token})
    assert down.status_code == 303
    assert "listing customers" in admin.get("/mappings").get_data(as_text=True)
