"""What every command shares: the services of the app it runs in, who is running it (for
the audit log) and times given on the command line."""

from __future__ import annotations

import getpass
import os
from datetime import datetime

import click
from flask import current_app

from ...services import Services, services_of


def services() -> Services:
    """The services of the app the command runs in."""
    return services_of(current_app)


def actor() -> str:
    """Who runs a command, for the audit log: ``cli:<login>``."""
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:  # noqa: BLE001 - no login name in some containers
        return f"cli:uid{os.getuid()}"


def parse_time(value: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"not an ISO 8601 time: {value!r}") from None
    if parsed.tzinfo is None:
        raise click.BadParameter("needs a time zone, e.g. 2026-01-31T12:00:00Z")
    return parsed
