"""The dashboard at /ui/: server-rendered pages over the store, for people (SPEC §7).

Sign-in starts a session kept on the server, named by a random id in a signed, HttpOnly,
SameSite=Strict cookie (never the token); every form that changes something carries a CSRF token.
The pages read through the store only; the buttons call the same store operations as the HTTP
API, as the signed-in principal.
"""

from __future__ import annotations

from flask import Blueprint, Flask, render_template
from werkzeug.exceptions import HTTPException

from tickler.api.ui import actions, erasures, pages, schedules, session, settings, tokens, traces
from tickler.scheduler.errors import Invalid, NotFound, TicklerError

bp = Blueprint(
    "ui",
    __name__,
    url_prefix="/ui",
    template_folder="templates",
    static_folder="static",
    static_url_path="/static",
)
session.install(bp)
actions.install(bp)
schedules.install(bp)
settings.install(bp)
tokens.install(bp)
erasures.install(bp)
traces.install(bp)
pages.install(bp)  # last: its catch-all answers the paths no other page has


@bp.errorhandler(HTTPException)
def _http_error(error: HTTPException) -> tuple[str, int]:
    status = error.code or 500
    return render_template("ui/error.html", status=status, title=error.name, detail=error.description), status


@bp.errorhandler(TicklerError)
def _domain_error(error: TicklerError) -> tuple[str, int]:
    # Another tenant's queue is "not found", exactly like one that does not exist.
    status = 404 if isinstance(error, NotFound) else 400 if isinstance(error, Invalid) else 409
    title = {404: "Not found", 400: "Not valid", 409: "Conflict"}[status]
    return render_template("ui/error.html", status=status, title=title, detail=error.detail), status


def register(app: Flask) -> None:
    """Mount the dashboard on the app and configure its session cookie."""
    settings = app.extensions["tickler"].settings
    app.config.update(
        SESSION_COOKIE_NAME="tickler_ui",
        SESSION_COOKIE_PATH="/ui",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Strict",
        SESSION_COOKIE_SECURE=settings.secure_cookies,
        PERMANENT_SESSION_LIFETIME=session.SESSION_SECONDS,
        # The cookie keeps the end its session had at sign-in (see DashboardSessions).
        SESSION_REFRESH_EACH_REQUEST=False,
    )
    if settings.secret_key:
        app.secret_key = settings.secret_key
    traces.configure(app)
    app.session_interface = session.DashboardSessions()
    app.register_blueprint(bp)
