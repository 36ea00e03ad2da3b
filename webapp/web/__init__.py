"""The web layer: one blueprint per area."""

from __future__ import annotations

from flask import Flask


def register_blueprints(app: Flask) -> None:
    from . import health

    app.register_blueprint(health.bp)
