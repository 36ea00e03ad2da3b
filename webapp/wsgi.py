"""The gunicorn entry point: ``gunicorn webapp.wsgi:app``."""

from . import create_app

app = create_app()
