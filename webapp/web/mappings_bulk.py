"""Mapping many tenants from the mappings page: a CSV file (the columns of ``billing-outbox
tenants import``) or Stripe's customers (``tenants sync-from-stripe``), each previewed first.

The preview signs the mappings it planned, and the plan's fingerprint (what would be added,
and what would change from which old values to which new ones), into the form
(``common.sign_snapshot``: for this person, for an hour). Applying plans those same mappings
again in the writing transaction: if the plan differs from the preview's (someone changed a
mapping meanwhile), nothing is written and a fresh preview is shown instead; otherwise exactly
the previewed changes are written and audited once, with the same actions as the commands.
A file with a bad line can be previewed but not applied (the import is all or nothing); a
sync's conflicts are shown and left out, as the command does.

With a key set, a tenant is mapped only to a customer Stripe has: a file's customers are asked
about when it is previewed (once each; a line whose customer Stripe does not have, has deleted
or could not be asked about is a bad line), a sync's come from Stripe's own listing, and both
are checked again when applied (answered from what was kept, within the refresh). Without a
key nothing is asked, and the preview and the message say so.
"""

from __future__ import annotations

import io
from typing import Any

from flask import Blueprint, abort, flash, redirect, url_for
from flask.typing import ResponseReturnValue

from ..outbox.customers import CustomerVerdicts
from ..outbox.operations import OperationError
from ..outbox.tenant_import import (
    ImportPlan,
    Mapping,
    StalePreview,
    apply_mappings,
    fingerprint,
    read_file,
)
from ..outbox.tenant_sync import (
    SYNC_ACTION,
    SyncPlan,
    key_problem,
    listed,
    mappings_from,
    sync_note,
)
from ..stripe_gateway import StripeCallFailed
from ..worker import check_customers, stripe_customers
from .common import now, read_snapshot, render, sign_snapshot, svc
from .errors import back_to
from .params import SNAPSHOT, Text, Upload, accepts
from .security import current_user, require_role

bp = Blueprint("mappings_bulk", __name__)

#: Signs a bulk mapping preview (see ``common.sign_snapshot``).
SNAPSHOT_SALT = "mappings-bulk-v1"
#: The largest file the page takes (larger: the ``tenants import`` command). Its preview,
#: signed into the page, must come back within the app's 1 MB request limit.
MAX_FILE_BYTES = 512 * 1024
#: The longest signed preview a page carries (the form field's own limit is 1,000,000).
MAX_TOKEN = 900_000
#: Rows of each kind listed on a preview (the counts cover them all).
SHOWN = 500
IMPORT_ACTION = "tenants_import"

FILE = Upload("file", MAX_FILE_BYTES)
METADATA_KEY = Text("metadata_key", 100, source="form")


def _user_id_email() -> tuple[int, str]:
    user = current_user()
    assert user is not None
    return user.id, user.email


def _back() -> str:
    url = url_for("tenants.mappings")
    back_to(url)
    return url


def _preview(kind: str, source: str, rows: list[Mapping], out: ImportPlan, *,
             note: str, customers: CustomerVerdicts | None, named: SyncPlan | None = None,
             status: int = 200, stale: bool = False) -> ResponseReturnValue:
    """The preview page; with an apply form carrying the signed plan when it can be applied."""
    token = None
    if not out.bad_lines and (out.added or out.changed):
        token = sign_snapshot(SNAPSHOT_SALT, _user_id_email()[0], kind=kind, source=source,
                              note=note, fp=fingerprint(out),
                              rows=[[m.tenant_id, m.stripe_customer_id, m.name, m.line]
                                    for m in rows])
        if len(token) > MAX_TOKEN:
            abort(400, "This is too many mappings to apply from the page; use the command "
                       "billing-outbox tenants import (or sync-from-stripe) instead.")
    return render("mappings_bulk/preview.html", status=status, kind=kind, source=source,
                  plan=out, named=named, token=token, stale=stale, shown=SHOWN,
                  customers=customers)


def _verdicts(rows: list[Mapping]) -> CustomerVerdicts:
    """What Stripe says of the rows' customers (each asked once; nothing without a key)."""
    return check_customers(svc().engine, svc().gateway(), svc().settings,
                           {m.stripe_customer_id for m in rows}, clock=svc().clock)


def _plan(rows: list[Mapping], out: ImportPlan, customers: CustomerVerdicts) -> ImportPlan:
    """What applying ``rows`` would do now (nothing is written)."""
    return apply_mappings(svc().engine, rows, out, customers=customers, now=now(), actor="",
                          action="", note="", dry_run=True)


@bp.post("/mappings/import")
@require_role("admin")
@accepts(FILE)
def import_preview() -> ResponseReturnValue:
    """What importing the uploaded CSV would do: every bad line, or the changes."""
    _back()
    upload = FILE.get()
    if upload is None:
        abort(400, "Choose a CSV file to upload (columns tenant_id,stripe_customer_id,name).")
    filename, text = upload
    rows, out = read_file(io.StringIO(text, newline=""))
    customers = None
    if not out.bad_lines:
        # Stripe is asked only about a file that is otherwise good (as the command does).
        customers = _verdicts(rows)
        _plan(rows, out, customers)
    return _preview("import", filename, rows, out, note=filename, customers=customers)


@bp.post("/mappings/sync")
@require_role("admin")
@accepts(METADATA_KEY)
def sync_preview() -> ResponseReturnValue:
    """What mapping the tenants named in Stripe's customers' metadata would do."""
    _back()
    key = METADATA_KEY.get()
    problem = key_problem(key)
    if problem:
        abort(400, f"{problem[0].upper()}{problem[1:]}.")
    gateway = svc().gateway()
    if gateway is None:
        raise OperationError("STRIPE_API_KEY is not set: Stripe cannot be asked")
    try:
        customers = stripe_customers(
            svc().engine, gateway, key,
            max_requests_per_second=svc().settings.stripe_max_requests_per_second, now=now())
    except StripeCallFailed as exc:
        raise OperationError(str(exc)) from exc
    named = mappings_from(customers)
    verdicts = listed(named)
    out = _plan(named.rows, ImportPlan(), verdicts)
    return _preview("sync", key, named.rows, out, note=sync_note(key, named),
                    customers=verdicts, named=named)


@bp.post("/mappings/apply")
@require_role("admin")
@accepts(SNAPSHOT)
def apply() -> ResponseReturnValue:
    """Apply exactly the previewed changes, or show a fresh preview if they are stale."""
    back = _back()
    uid, email = _user_id_email()
    snap: dict[str, Any] = read_snapshot(SNAPSHOT_SALT, uid, SNAPSHOT.get())
    kind, source, note = str(snap["kind"]), str(snap["source"]), str(snap["note"])
    # Each row keeps its line in the file, so a refusal names the line the person sees.
    rows = [Mapping(int(r[3]) if len(r) > 3 else i, str(r[0]), str(r[1]),
                    None if r[2] is None else str(r[2]))
            for i, r in enumerate(snap["rows"], start=1)]
    action = IMPORT_ACTION if kind == "import" else SYNC_ACTION
    # Asked again (from what was kept, within the refresh): a customer deleted in Stripe
    # since the preview is refused here, not mapped.
    customers = _verdicts(rows)
    try:
        done = apply_mappings(svc().engine, rows, ImportPlan(), customers=customers,
                              now=now(), actor=email, action=action, note=note,
                              expected=str(snap["fp"]))
    except StalePreview as stale:
        return _preview(kind, source, rows, stale.plan, note=note, customers=customers,
                        status=409, stale=True)
    if done.bad_lines:
        return _preview(kind, source, rows, done, note=note, customers=customers, status=409)
    if customers.checked:
        flash(f"Applied: {done.summary()}.", "ok")
    else:
        flash(f"Applied: {done.summary()}. Stripe was not asked whether it has these "
              "customers: no Stripe API key is set here.", "warning")
    return redirect(back, code=303)
