"""The commands over the core: ``db upgrade``, ``serve``, ``worker``, ``drain``, ``stats``,
``users …``, ``enqueue``, ``requeue``, ``resolve``, ``pause`` and ``resume``. Thin: parse,
call one function, print."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from typing import NoReturn

import click

from ...outbox.operations import RESOLVE_REASONS
from ...users import ROLES
from .common import actor, parse_time, services

# -- commands -------------------------------------------------------------------------------------

@click.group("db")
def db_group() -> None:
    """Database schema."""


@db_group.command("upgrade")
def db_upgrade() -> None:
    """Migrate the database to the newest schema (safe to run twice)."""
    from ...migrate import current_revision, upgrade
    from ...models import utcnow
    from ...outbox.producers import record_default_meter

    upgrade(services().engine)
    record_default_meter(services().engine, services().settings.stripe_meter_event_name,
                         now=utcnow())
    click.echo(f"database at revision {current_revision(services().engine)}")


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 64))
def serve(host: str, port: int, workers: int) -> NoReturn:
    """Serve the dashboard with gunicorn; the drainer runs inside it."""
    if services().settings.drainer_enabled:
        services().check_session_state()  # at once, before gunicorn (its workers' look again)
    env = dict(os.environ)
    env.pop("FLASK_RUN_FROM_CLI", None)
    args = [sys.executable, "-m", "gunicorn", "--workers", str(workers), "--threads", "4",
            "--bind", f"{host}:{port}", "--graceful-timeout", "30",
            "--access-logfile", "-", "--no-control-socket",
            "--logger-class", "webapp.gunicorn_logging.GunicornLogger", "webapp.wsgi:app"]
    os.execve(sys.executable, args, env)  # noqa: S606 - fixed argv, no shell


@click.command("worker")
def worker() -> None:
    """Drain in the foreground until SIGTERM/SIGINT; then finish or release what is held."""
    drainer = services().drainer()
    drainer.announce("worker")
    if drainer.gateway is None:
        click.echo("STRIPE_API_KEY is not set: the worker will send nothing until it is.",
                   err=True)

    def stop(signum: int, _frame: object) -> None:
        drainer.request_stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    from ...worker import Maintenance, freeze_startup_objects, run_drainer

    maintenance = Maintenance(services().maintenance())
    freeze_startup_objects()
    maintenance.start()
    try:
        run_drainer(drainer)
    finally:
        maintenance.stop()


@click.command("drain")
@click.option("--once", is_flag=True, help="One pass (one batch); otherwise until nothing is due.")
def drain(once: bool) -> None:
    """Drain due events and print a JSON summary."""
    from ...worker import Rescuer

    drainer = services().drainer()
    drainer.shards = False  # a one-off: it does not take a share from the running workers
    try:
        rescued = Rescuer(services().engine).run_once() if drainer.gateway is not None else 0
        summary = drainer.drain_once()
        summary.rescued = rescued
        if not once:
            total = summary.as_dict()
            while summary.claimed and not summary.paused:
                summary = drainer.drain_once()
                for k, v in summary.as_dict().items():
                    if isinstance(v, int) and not isinstance(v, bool):
                        total[k] = int(total[k]) + v  # type: ignore[call-overload]
            total.update(paused=summary.paused, pause_reason=summary.pause_reason,
                         skipped=summary.skipped, breaker=summary.breaker)
            click.echo(json.dumps(total))
            return
        click.echo(json.dumps(summary.as_dict()))
    finally:
        drainer.close()


@click.command("stats")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def stats(as_json: bool) -> None:
    """Counts by status, the oldest pending age, the state of sending (the dashboard's
    status line) and the pause switch."""
    from ...read.stats import stats as compute

    data = compute(services().engine, now=services().clock(),
                   api_key_here=services().settings.stripe_mode != "none",
                   retention_days=services().settings.retention_days,
                   meter_event_api=services().settings.meter_event_api,
                   stripe_api_base=services().settings.stripe_api_base,
                   stripe_meter_events_base=services().settings.meter_events_base)
    if as_json:
        click.echo(json.dumps(data))
        return
    for status, n in data["counts"].items():  # type: ignore[attr-defined]
        click.echo(f"{status:>10}  {n}")
    click.echo(f"oldest pending age: {data['oldest_pending_age_seconds']} s")
    # Whether sending is fine is the status line's decision (read.health) alone; the pause
    # switch is one of its inputs, shown as what it is.
    state = data["health"]
    click.echo(f"sending: {state['title']} - {state['detail']}")  # type: ignore[index]
    click.echo("pause switch: " + (f"on ({data['pause_reason'] or 'no reason given'})"
                                   if data["paused"] else "off"))
    click.echo(f"meter event API: {data['meter_event_api']}")
    click.echo(f"Stripe API: {data['stripe_api_base']}; meter event streams: "
               f"{data['stripe_meter_events_base']}")


@click.group("users")
def users() -> None:
    """Dashboard users."""


@users.command("create")
@click.argument("email")
@click.option("--role", required=True, type=click.Choice(ROLES))
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input.")
def users_create(email: str, role: str, password_stdin: bool) -> None:
    """Create a user; the password comes from a prompt or standard input."""
    from ...users import create_user

    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    create_user(services().engine, email, password, role, now=services().clock(), actor=actor())
    click.echo(f"created {email.strip().lower()} ({role})")


def _on_user(email: str, change: Callable[..., str], *args: object) -> str:
    """Apply ``change(engine, user_id, *args, now=, actor=)`` to the user with ``email``;
    the email it names (audited as the CLI user)."""
    from ...users import user_id_by_email

    engine = services().engine
    return change(engine, user_id_by_email(engine, email), *args, now=services().clock(),
                  actor=actor())


@users.command("set-role")
@click.argument("email")
@click.option("--role", required=True, type=click.Choice(ROLES))
def users_set_role(email: str, role: str) -> None:
    """Give a user another role; their sessions end."""
    from ...users import set_role

    click.echo(f"{_on_user(email, set_role, role)} is now {role}; their sessions have ended")


@users.command("deactivate")
@click.argument("email")
def users_deactivate(email: str) -> None:
    """Deactivate a user; their sessions end at once."""
    from ...users import set_active

    click.echo(f"{_on_user(email, set_active, False)} deactivated")


@users.command("activate")
@click.argument("email")
def users_activate(email: str) -> None:
    """Reactivate a user (they sign in anew)."""
    from ...users import set_active

    click.echo(f"{_on_user(email, set_active, True)} reactivated")


@users.command("end-sessions")
@click.argument("email")
def users_end_sessions(email: str) -> None:
    """Sign a user out on every device."""
    from ...users import end_sessions

    click.echo(f"every session of {_on_user(email, end_sessions)} has ended")


@users.command("reset-password")
@click.argument("email")
def users_reset_password(email: str) -> None:
    """A new random password, printed once; the user must change it at their next log-in.
    Also lifts a log-in lock on the account (the way back in for a locked-out admin)."""
    from ...users import reset_password, user_id_by_email

    engine = services().engine
    done, password = reset_password(engine, user_id_by_email(engine, email),
                                    now=services().clock(), actor=actor())
    click.echo(f"temporary password for {done} (shown once; they must change it): {password}")


@click.command("enqueue")
@click.option("--tenant", required=True)
@click.option("--quantity", required=True, type=int)
@click.option("--key", required=True, help="The idempotency key (Stripe's identifier).")
@click.option("--meter", default=None)
@click.option("--occurred-at", default=None, help="ISO 8601 with a time zone; default now.")
def enqueue(tenant: str, quantity: int, key: str, meter: str | None,
            occurred_at: str | None) -> None:
    """Enqueue one usage event (prints its id)."""
    from sqlalchemy.orm import Session

    from ...outbox import enqueue_usage

    when = parse_time(occurred_at) if occurred_at else None
    with Session(services().engine) as db, db.begin():
        row = enqueue_usage(db, tenant_id=tenant, quantity=quantity, idempotency_key=key,
                            meter=meter or services().settings.stripe_meter_event_name,
                            occurred_at=when)
        click.echo(json.dumps({"id": row.id, "status": row.status, "key": row.idempotency_key}))


@click.command("requeue")
@click.argument("ids", nargs=-1, type=int, required=True)
@click.option("--force", is_flag=True,
              help="Also requeue events whose outcome is unknown past Stripe's 24-hour dedupe "
                   "window. Stripe may already have them: check before forcing, or bill twice.")
def requeue(ids: tuple[int, ...], force: bool) -> None:
    """Send dead or rejected events again (rejected ones under a new identifier)."""
    from ...outbox.operations import requeue as do_requeue

    svc = services()
    if force:
        click.echo("warning: --force resends events Stripe may already have recorded; "
                   "a resend outside its dedupe window bills twice.", err=True)
    result = do_requeue(svc.engine, ids, actor=actor(), now=services().clock(), force=force,
                        window_seconds=svc.settings.dedupe_window_seconds)
    click.echo(f"requeued {len(result.event_ids)} event(s)")


@click.command("resolve")
@click.argument("ids", nargs=-1, type=int, required=True)
@click.option("--reason", required=True,
              type=click.Choice(list(RESOLVE_REASONS)))
@click.option("--note", required=True)
def resolve(ids: tuple[int, ...], reason: str, note: str) -> None:
    """Close dead or rejected events by hand, with a reason and a note (kept in history)."""
    from ...outbox.operations import resolve as do_resolve

    result = do_resolve(services().engine, ids, actor=actor(), reason=reason, note=note,
                        now=services().clock())
    click.echo(f"resolved {len(result.event_ids)} event(s)")


@click.command("pause")
@click.option("--reason", default=None)
def pause(reason: str | None) -> None:
    """Stop sending, for every worker, until ``resume``."""
    from ...outbox.operations import pause as do_pause

    do_pause(services().engine, actor=actor(), reason=reason, now=services().clock())
    click.echo("sending paused")


@click.command("resume")
def resume() -> None:
    """Restart sending."""
    from ...outbox.operations import resume as do_resume

    do_resume(services().engine, actor=actor(), now=services().clock())
    click.echo("sending resumed")


COMMANDS: list[click.Command] = [db_group, serve, worker, drain, stats, users, enqueue,
                                 requeue, resolve, pause, resume]
