"""The WSGI application, for a server started in a checkout that names this file's module, `wsgi`.

The application lives in tickler/wsgi.py (`gunicorn tickler.wsgi:app`, as deployed); this file only
re-exports it, a module of its own rather than a second name for that file.
"""

from tickler.wsgi import app

__all__ = ["app"]
