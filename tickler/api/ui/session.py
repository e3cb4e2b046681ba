"""Dashboard sign-in, sign-out, the session's principal, CSRF tokens and the pages' security headers.

Sessions live on the server (scheduler/store/ui_sessions.py): the signed cookie carries a random
session id and the CSRF token, never the API token, and no page puts a token in a URL. Every
request looks the session up, with its token: signing out, the session's fixed end (activity
does not move it) or revoking the token ends it at once, whoever holds a copy of the cookie.
"""

from __future__ import annotations

import hmac
import secrets
import threading
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from flask import Blueprint, Flask, g, redirect, render_template, request, session, url_for
from flask.sessions import SecureCookieSession, SecureCookieSessionInterface
from werkzeug.exceptions import BadRequest
from werkzeug.wrappers import Response

from tickler.api import context
from tickler.api.ui.store import dashboard, sessions
from tickler.scheduler.models import Principal
from tickler.scheduler.store.tokens import hash_token

_secret_lock = threading.Lock()

# A session ends this long after sign-in, however busy it is.
SESSION_SECONDS = 12 * 3600

# Pages anyone may open: the sign-in form and the stylesheet/script.
# An unknown path is a 404 for anyone (signing in would not make it a page).
_PUBLIC_ENDPOINTS = frozenset({"ui.sign_in", "ui.sign_in_post", "ui.static", "ui.unknown"})

_CSP = (
    "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


class CSRFRefused(BadRequest):
    description = "The form's security token is missing or stale. Go back, reload the page and try again."


def install(bp: Blueprint) -> None:
    bp.before_request(_load_session)
    bp.after_request(_security_headers)
    bp.add_url_rule("/sign-in", "sign_in", sign_in, methods=["GET"])
    bp.add_url_rule("/sign-in", "sign_in_post", sign_in_post, methods=["POST"])
    bp.add_url_rule("/sign-out", "sign_out", sign_out, methods=["POST"])
    bp.app_context_processor(lambda: {"csrf_token": csrf_token})


class DashboardSessions(SecureCookieSessionInterface):
    """Flask's signed-cookie sessions, with the key loaded before the first dashboard session is
    opened (Flask opens the session before any before_request hook runs)."""

    def open_session(self, app: Flask, request: Any) -> SecureCookieSession | None:
        if not app.secret_key and request.path.startswith("/ui/"):
            with _secret_lock:
                if not app.secret_key:
                    # Without TICKLER_SECRET_KEY: the key kept in the database, read once per process.
                    app.secret_key = dashboard().session_secret()
        return super().open_session(app, request)

    def get_expiration_time(self, app: Flask, session: Any) -> datetime | None:
        """The cookie ends when the session does: rewriting it (a flash message) never extends it."""
        ends = session.get("ends")
        if isinstance(ends, (int, float)):
            return datetime.fromtimestamp(ends, UTC)
        return super().get_expiration_time(app, session)


def csrf_token() -> str:
    """This session's CSRF token (made on first use)."""
    token = session.get("csrf")
    if not isinstance(token, str):
        token = session["csrf"] = secrets.token_urlsafe(32)
    return token


def _check_csrf() -> None:
    given = request.form.get("csrf_token", "")
    expected = session.get("csrf")
    if not isinstance(expected, str) or not given or not hmac.compare_digest(given.encode(), expected.encode()):
        raise CSRFRefused()


def _load_session() -> Response | None:
    if request.method == "POST":
        _check_csrf()
    caller = _principal_of_session()
    if caller is not None:
        g.principal = caller
        return None
    if request.endpoint in _PUBLIC_ENDPOINTS:
        return None
    if request.method != "GET":
        return redirect(url_for("ui.sign_in"), code=303)
    return redirect(url_for("ui.sign_in", next=request.full_path if request.query_string else request.path))


def _principal_of_session() -> Principal | None:
    session_id = session.get("sid")
    if not isinstance(session_id, str):
        return None
    # Not cached: a sign-out in another process must end this session at once.
    live = sessions().find(session_id)
    if live is None:
        return None
    g.token_id = live.token_id
    return live.principal


def signed_in() -> Principal:
    found: Principal = g.principal
    return found


def safe_target(target: str | None, under: str = "/ui/") -> str | None:
    """`target` if it is a path of the dashboard under `under`; None for anything else: an
    absolute URL or `//host` (an open redirect), a backslash, a control character or a space
    (CR/LF would split the Location header)."""
    if not target or not target.startswith(under) or "//" in target or "\\" in target:
        return None
    if not under.endswith("/") and target[len(under) : len(under) + 1] not in ("", "/", "?"):
        return None  # /ui/queues/emails-2 is not a page of /ui/queues/emails
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in target):
        return None
    parts = urlsplit(target)
    if parts.scheme or parts.netloc:
        return None
    return target


def _safe_next(target: str | None) -> str:
    return safe_target(target) or url_for("ui.overview")


def sign_in() -> Response | str:
    if g.get("principal") is not None:
        return redirect(_safe_next(request.args.get("next")))
    return render_template("ui/sign_in.html", next=safe_target(request.args.get("next")) or "", error=None)


def sign_in_post() -> tuple[str, int] | Response:
    token = request.form.get("token", "").strip()
    caller = dashboard().principal_by_hash(dashboard().token_hash(token)) if token else None
    if caller is None:
        error = "That token is not valid." if token else "Paste a token to sign in."
        return render_template("ui/sign_in.html", next=request.form.get("next", ""), error=error), 401
    # A fresh session (and CSRF token) on every sign-in: nothing set before it carries over.
    _end_session()
    admin = caller.name if caller.is_admin else None
    session_id, ends = sessions().start(token, lifetime_seconds=SESSION_SECONDS, admin=admin)
    context.tickler().token_use.used(hash_token(token))  # a sign-in is a use of the token
    session.permanent = True
    session["sid"] = session_id
    session["ends"] = ends.timestamp()
    csrf_token()
    return redirect(_safe_next(request.form.get("next")), code=303)


def sign_out() -> Response:
    _end_session()
    return redirect(url_for("ui.sign_in"), code=303)


def end_session() -> None:
    """End this session on the server (its token was revoked, say): the next page is sign-in."""
    _end_session()


def _end_session() -> None:
    """End the cookie's session on the server (a copy of the cookie is refused from now on)."""
    session_id = session.get("sid")
    if isinstance(session_id, str):
        sessions().end(session_id)
    session.clear()


def _security_headers(response: Response) -> Response:
    headers: dict[str, Any] = {
        "Content-Security-Policy": _CSP,
        "X-Frame-Options": "DENY",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "same-origin",
    }
    if request.endpoint != "ui.static":
        headers["Cache-Control"] = "no-store"
    for name, value in headers.items():
        response.headers.setdefault(name, value)
    return response
