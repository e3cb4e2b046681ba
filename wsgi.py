"""WSGI entry point: `gunicorn wsgi:app`. Settings come from TICKLER_* environment variables."""

from api import create_app

app = create_app()
