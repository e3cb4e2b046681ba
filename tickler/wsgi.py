"""WSGI entry point: `gunicorn tickler.wsgi:app`. Settings come from TICKLER_* environment variables."""

from tickler.api import create_app

app = create_app()
