"""Issue 15, bulk mapping: ``billing-outbox tenants import FILE.csv [--dry-run]`` as the
contract says — all-or-nothing, one line per bad row, added / changed / unchanged counts,
audited once — run as a user would, in a process of its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import cli, worker_env
from sqlalchemy import Engine, select

from webapp.models import AuditEntry, Tenant, utcnow
from webapp.outbox.operations import set_tenant

T = Tenant.__table__


def tenants(engine: Engine) -> dict[str, tuple[str | None, str | None]]:
    with engine.connect() as conn:
        return {r.tenant_id: (r.stripe_customer_id, r.name)
                for r in conn.execute(select(T.c.tenant_id, T.c.stripe_customer_id, T.c.name))}


def audit(engine: Engine) -> list[tuple[str, str | None]]:
    with engine.connect() as conn:
        return [(r.action, r.note) for r in conn.execute(
            select(AuditEntry.action, AuditEntry.note).order_by(AuditEntry.id))]


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "tenants.csv"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_a_file_adds_changes_and_counts_what_was_already_true(
        db_url: str, engine: Engine, tmp_path: Path, fake_stripe: Any) -> None:
    now = utcnow()
    set_tenant(engine, "acme", stripe_customer_id="cus_acme", name="Acme", now=now)
    set_tenant(engine, "globex", stripe_customer_id="cus_old", name="Globex", now=now)
    set_tenant(engine, "initech", stripe_customer_id=None, name=None, now=now)
    # The fake, knowing no customer, has every one (Stripe's refusals: test_mapping_checks).
    env = worker_env(db_url, fake_stripe.base_url)
    path = write(tmp_path, "\ufefftenant_id,stripe_customer_id,name\n"
                           "acme,cus_acme,\n"                 # already true (name kept)
                           "globex,cus_Globex2,Globex Corp\n"  # changed
                           "initech, cus_init ,\n"            # mapped now (spaces trimmed)
                           "\n"
                           "umbrella,cus_umb,Umbrella\n"      # added
                           "umbrella,cus_umb,Umbrella\n")     # the same line twice: once
    before = tenants(engine)
    dry = cli("tenants", "import", path, "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert "1 added, 2 changed, 1 unchanged" in dry.stdout and "dry run" in dry.stdout
    assert tenants(engine) == before and audit(engine) == []

    done = cli("tenants", "import", path, env=env)
    assert done.returncode == 0, done.stderr
    assert "1 added, 2 changed, 1 unchanged" in done.stdout
    assert tenants(engine) == {"acme": ("cus_acme", "Acme"),
                               "globex": ("cus_Globex2", "Globex Corp"),
                               "initech": ("cus_init", None),
                               "umbrella": ("cus_umb", "Umbrella")}
    [(action, note)] = audit(engine)
    assert action == "tenants_import" and "1 added, 2 changed, 1 unchanged" in (note or "")
    assert (note or "").endswith("; customers checked with Stripe")

    again = cli("tenants", "import", path, env=env)
    assert "0 added, 0 changed, 4 unchanged" in again.stdout
    assert len(audit(engine)) == 1  # nothing changed, nothing to audit


def test_one_bad_line_refuses_the_whole_file_naming_every_bad_line(
        db_url: str, engine: Engine, tmp_path: Path) -> None:
    set_tenant(engine, "acme", stripe_customer_id="cus_acme", name=None, now=utcnow())
    path = write(tmp_path, "tenant_id,stripe_customer_id\n"
                           "newco,cus_new\n"
                           ",cus_nobody\n"
                           "acme,acct_123\n"
                           "twice,cus_a\n"
                           "twice,cus_b\n"
                           "short\n")
    before = tenants(engine)
    out = cli("tenants", "import", path, env=worker_env(db_url))
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert any(line.startswith("line 3: the tenant id is empty") for line in lines), lines
    assert any(line.startswith("line 4: Stripe customer id 'acct_123'") for line in lines)
    assert any(line.startswith("line 6: tenant 'twice' is also on line 5") for line in lines)
    assert any(line.startswith("line 7: 1 cells, the header has 2") for line in lines)
    assert "4 bad lines: nothing was changed" in lines[-1]
    assert tenants(engine) == before and audit(engine) == []


def test_a_file_without_the_columns_or_not_there_is_refused(
        db_url: str, tmp_path: Path) -> None:
    env = worker_env(db_url)
    wrong = cli("tenants", "import", write(tmp_path, "tenant,customer\nacme,cus_a\n"), env=env)
    assert wrong.returncode == 1 and "line 1: the first line must name" in wrong.stderr
    missing = cli("tenants", "import", str(tmp_path / "nope.csv"), env=env)
    assert missing.returncode == 2 and missing.stderr.count("\n") <= 2, missing.stderr


def test_many_lines_go_in_batches(db_url: str, engine: Engine, tmp_path: Path) -> None:
    n = 5_003  # more than two batches of inserts, of reads and of updates
    # Without a key: the batches are the point here, not 10,000 questions to Stripe.
    env = {k: v for k, v in worker_env(db_url).items() if k != "STRIPE_API_KEY"}
    rows = "".join(f"t{i:05d},cus_{i:05d},Tenant {i}\n" for i in range(n))
    path = write(tmp_path, "tenant_id,stripe_customer_id,name\n" + rows)
    out = cli("tenants", "import", path, env=env)
    assert out.returncode == 0, out.stderr
    assert f"{n} added, 0 changed, 0 unchanged" in out.stdout
    changed = "".join(f"t{i:05d},cus_X{i:05d}\n" for i in range(n))  # names kept
    out = cli("tenants", "import", write(tmp_path, "tenant_id,stripe_customer_id\n" + changed),
              env=env)
    assert f"0 added, {n} changed, 0 unchanged" in out.stdout
    got = tenants(engine)
    assert len(got) == n and got["t05002"] == ("cus_X05002", "Tenant 5002")
