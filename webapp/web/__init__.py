"""The web layer: one blueprint per area, plus the cross-cutting pieces.

``security`` (user, roles, CSRF, headers), ``templating`` (the templates' helpers) and
``errors`` (the one place errors become pages, fragments or JSON) are installed first; each
blueprint is a thin view over one function of ``webapp.read`` (reads) or
``webapp.outbox.operations`` (actions). ``cli`` and ``scheduler`` sit here too: thin
commands, and the in-app drainer's jobs.
"""

from __future__ import annotations

from flask import Flask


def register_blueprints(app: Flask) -> None:
    from . import (
        api,
        audit,
        auth,
        dashboard,
        dead_letters,
        errors,
        events,
        health,
        invoices,
        mappings_bulk,
        metrics,
        notifications,
        periods,
        reconciliation,
        rejected,
        request_input,
        search,
        security,
        stripe_side,
        templating,
        tenants,
        tokens,
        users,
        webhook,
    )

    request_input.init_app(app)  # the URL converters, before any rule uses them
    security.init_app(app)
    templating.init_app(app)
    errors.init_app(app)
    for module in (health, metrics, webhook, api, auth, dashboard, tenants, dead_letters, rejected,
                   events, search, reconciliation, periods, invoices, stripe_side, audit, users,
                   mappings_bulk, notifications, tokens):
        app.register_blueprint(module.bp)
    app.register_blueprint(auth.account_bp)
