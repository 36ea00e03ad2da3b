"""The web layer: one blueprint per area, plus the cross-cutting pieces.

``security`` (user, roles, CSRF, headers, error pages) and ``common`` (rendering a page or
its htmx fragment, filters) are installed first; each blueprint is a thin view over one
function of ``webapp.queries`` (reads) or ``webapp.outbox.ops`` (actions).
"""

from __future__ import annotations

from flask import Flask


def register_blueprints(app: Flask) -> None:
    from . import (
        audit,
        auth,
        common,
        dashboard,
        dead_letters,
        events,
        health,
        metrics,
        security,
        tenants,
        users,
    )

    security.init_app(app)
    common.init_app(app)
    for module in (health, metrics, auth, dashboard, tenants, dead_letters, events, audit,
                   users):
        app.register_blueprint(module.bp)
