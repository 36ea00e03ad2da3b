"""``billing-outbox``: thin commands over the core (a Flask command group), one module per
area: ``core`` (the database, serving, the worker, users, events and the switch),
``tenants``, ``stripe_calls`` (what asks Stripe), ``retention``, ``billing`` (billing
periods and late usage), ``notify`` (test messages) and ``tokens`` (the ingest API's);
``common`` holds what they share. The console script's ``main()`` is :mod:`webapp.main`,
above the app factory.

``flask --app webapp <command>`` is equivalent. Every command exits 0 on success and
otherwise prints one line on stderr and exits non-zero (1: refused or failed, 2: bad usage or
configuration).
"""

from __future__ import annotations

from flask import Flask


def register_commands(app: Flask) -> None:
    """Add the commands to ``app.cli`` (so ``flask --app webapp …`` has them too)."""
    from . import billing, core, notify, retention, stripe_calls, tenants, tokens

    for command in (core.COMMANDS + tenants.COMMANDS + stripe_calls.COMMANDS
                    + retention.COMMANDS + billing.COMMANDS + notify.COMMANDS
                    + tokens.COMMANDS):
        app.cli.add_command(command)
