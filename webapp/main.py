"""The ``billing-outbox`` console script: the command group of :mod:`webapp.web.cli` over
an app built without the drainer and the pages, each refusal in one line on stderr."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click
from flask.cli import FlaskGroup
from sqlalchemy.exc import OperationalError, ProgrammingError

from .config import ConfigError

# -- entry point ----------------------------------------------------------------------------------

def _known_error(exc: BaseException) -> str | None:
    from .outbox import IdempotencyConflict, InvalidUsage
    from .outbox.operations import OperationError
    from .users import UserError

    if isinstance(exc, ConfigError | OperationError | InvalidUsage | IdempotencyConflict
                  | UserError):
        return str(exc)
    if isinstance(exc, ProgrammingError | OperationalError):
        text = str(exc.orig) if getattr(exc, "orig", None) is not None else str(exc)
        first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
        if "no such table" in first or "does not exist" in first:
            return (f"the database schema is missing or old ({first}); "
                    "run: billing-outbox db upgrade")
        return f"database error: {first}"
    return None


def main(argv: list[str] | None = None) -> None:
    """The ``billing-outbox`` console script."""
    from .app import create_app

    group = FlaskGroup(name="billing-outbox",
                       create_app=lambda: create_app(start_drainer=False, pages=False),
                       add_default_commands=False, add_version_option=False,
                       load_dotenv=False, set_debug_flag=False,
                       help="billing-outbox: usage to Stripe from a transactional outbox.")
    run: Callable[..., Any] = group.main
    try:
        rv = run(args=argv, prog_name="billing-outbox", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("billing-outbox: aborted", err=True)
        sys.exit(1)
    except click.ClickException as exc:
        click.echo(f"billing-outbox: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except Exception as exc:  # noqa: BLE001 - mapped to one line below, or re-raised
        message = _known_error(exc)
        if message is None:
            raise
        click.echo(f"billing-outbox: {message}", err=True)
        sys.exit(2 if isinstance(exc, ConfigError) else 1)
    sys.exit(rv if isinstance(rv, int) else 0)
