"""The users page (admin): create with a role, deactivate, reactivate; all audited."""

from __future__ import annotations

from sqlalchemy import select

from webapp.models import AuditEntry, User
from webapp.read.audit import NOT_SIGN_IN

from .conftest import PASSWORD, csrf_of, login


def user_id(engine, email: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(User.id).where(User.email == email)).scalar_one())


def test_admin_creates_a_user_who_can_sign_in(client_as, engine, users) -> None:
    admin = client_as("admin")
    resp = admin.post("/users", data={"email": "Finance@Example.com", "role": "viewer",
                                      "password": PASSWORD, "csrf_token": csrf_of(admin)})
    assert resp.status_code == 303
    html = admin.get("/users").get_data(as_text=True)
    assert "finance@example.com" in html and "Created finance@example.com" in html
    assert login(client_as(None), "finance@example.com").status_code == 303
    with engine.connect() as conn:
        entry = conn.execute(select(AuditEntry.__table__).where(NOT_SIGN_IN)).one()
    assert (entry.action, entry.actor, entry.note) == ("user_create", users["admin"],
                                                       "finance@example.com as viewer")


def test_bad_new_users_change_nothing(client_as, seed, users) -> None:
    admin = client_as("admin")
    token = csrf_of(admin)
    for form in ({"email": users["viewer"], "role": "viewer", "password": PASSWORD},
                 {"email": "x@example.com", "role": "root", "password": PASSWORD},
                 {"email": "x@example.com", "role": "viewer", "password": "short"},
                 {"email": "not-an-email", "role": "viewer", "password": PASSWORD}):
        before = seed.snapshot()
        assert admin.post("/users", data={**form, "csrf_token": token}).status_code == 303
        assert seed.snapshot() == before
    assert "Nothing changed" in admin.get("/users").get_data(as_text=True)


def test_deactivate_and_reactivate(client_as, engine, users) -> None:
    victim = client_as("operator")
    admin = client_as("admin")
    uid = user_id(engine, users["operator"])
    resp = admin.post(f"/users/{uid}/deactivate", data={"csrf_token": csrf_of(admin)})
    assert resp.status_code == 303
    assert victim.get("/").status_code == 302                 # their session ended
    assert login(client_as(None), users["operator"]).status_code == 401
    admin.post(f"/users/{uid}/activate", data={"csrf_token": csrf_of(admin)})
    assert login(client_as(None), users["operator"]).status_code == 303
    with engine.connect() as conn:
        actions = list(conn.execute(select(AuditEntry.__table__.c.action).where(NOT_SIGN_IN)
                                    .order_by(AuditEntry.__table__.c.id)).scalars())
    assert actions == ["user_deactivate", "user_activate"]


def test_admin_cannot_lock_themselves_out(client_as, engine, users, seed) -> None:
    admin = client_as("admin")
    before = seed.snapshot()
    admin.post(f"/users/{user_id(engine, users['admin'])}/deactivate",
               data={"csrf_token": csrf_of(admin)})
    assert seed.snapshot() == before
    assert admin.get("/users").status_code == 200
    assert admin.post("/users/99999/deactivate",
                      data={"csrf_token": csrf_of(admin)}).status_code == 303
    assert seed.snapshot() == before


def test_the_same_user_created_at_once_is_refused_not_a_500(engine) -> None:
    """A double click on Create: one user, the other click told it exists (was an
    IntegrityError, a 500, on PostgreSQL)."""
    from concurrent.futures import ThreadPoolExecutor

    from webapp.models import utcnow
    from webapp.users import UserError, create_user

    def attempt(_: int) -> str:
        try:
            create_user(engine, "twice@example.com", "amber-falcon-orchard-71", "viewer",
                        now=utcnow())
            return "created"
        except UserError as exc:
            return str(exc)

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(attempt, range(8)))
    assert results.count("created") == 1
    assert all(r == "a user twice@example.com already exists" for r in results
               if r != "created")
