"""Dashboard sign-in, sign-out, the session's principal, CSRF tokens and the pages' security headers.

The session cookie holds the SHA-256 of the token, the way the token table knows it: the token
itself is never stored in the cookie nor put in a URL. Each request looks the hash up again, so a
revoked token signs its sessions out (after the principal cache's few seconds).
"""

from __future__ import annotations

import hmac
import secrets
import threading
from typing import Any
from urllib.parse import urlsplit

from flask import Blueprint, Flask, g, redirect, render_template, request, session, url_for
from flask.sessions import SecureCookieSession, SecureCookieSessionInterface
from werkzeug.exceptions import BadRequest
from werkzeug.wrappers import Response

from tickler.api import context
from tickler.api.ui.store import dashboard
from tickler.scheduler.models import Principal

_secret_lock = threading.Lock()

# Pages anyone may open: the sign-in form and the stylesheet/script.
_PUBLIC_ENDPOINTS = frozenset({"ui.sign_in", "ui.sign_in_post", "ui.static"})

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
    raw = session.get("token_hash")
    if not isinstance(raw, str):
        return None
    try:
        token_hash = bytes.fromhex(raw)
    except ValueError:
        return None
    ext = context.tickler()
    return ext.principals.get(token_hash, lambda: dashboard().principal_by_hash(token_hash))


def signed_in() -> Principal:
    found: Principal = g.principal
    return found


def _safe_next(target: str | None) -> str:
    """Only a path of the dashboard itself: never an absolute URL elsewhere (open redirect)."""
    if target:
        parts = urlsplit(target)
        if not parts.scheme and not parts.netloc and parts.path.startswith("/ui/") and "\\" not in target:
            return target
    return url_for("ui.overview")


def sign_in() -> Response | str:
    if g.get("principal") is not None:
        return redirect(_safe_next(request.args.get("next")))
    return render_template("ui/sign_in.html", next=request.args.get("next", ""), error=None)


def sign_in_post() -> tuple[str, int] | Response:
    token = request.form.get("token", "").strip()
    caller = dashboard().principal_by_hash(dashboard().token_hash(token)) if token else None
    if caller is None:
        error = "That token is not valid." if token else "Paste a token to sign in."
        return render_template("ui/sign_in.html", next=request.form.get("next", ""), error=error), 401
    # A fresh session (and CSRF token) on every sign-in: nothing set before it carries over.
    session.clear()
    session.permanent = True
    session["token_hash"] = dashboard().token_hash(token).hex()
    csrf_token()
    return redirect(_safe_next(request.form.get("next")), code=303)


def sign_out() -> Response:
    session.clear()
    return redirect(url_for("ui.sign_in"), code=303)


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
