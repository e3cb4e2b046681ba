"""tickler's WSGI application without the lean single-event route (api/lean.py): every request
through Flask's request cycle, as before the route. For benchmarks that measure what it saves."""

from tickler.api import create_app

app = create_app(lean_schedule=False)
