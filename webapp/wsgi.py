"""The gunicorn entry point: ``gunicorn webapp.wsgi:app``."""

from .app import create_app

app = create_app()
