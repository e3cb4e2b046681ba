"""The Tokens page (admins only): every API token with when it was last used, issue one (shown
once, on the page that answers the form: never in a URL, a redirect or a log) and revoke one (its
dashboard sessions end at once, and the API stops accepting it).

The form carries a fresh issue key: sending it again (reloading the page that showed the new
token) makes no second token, and says which token that form made. A token for a queue that does
not exist is refused."""

from __future__ import annotations

import re
import secrets

from flask import Blueprint, flash, g, redirect, render_template, request, url_for
from marshmallow import ValidationError
from werkzeug.exceptions import Forbidden
from werkzeug.wrappers import Response

from tickler.api import context
from tickler.api.schemas.tokens import IssueTokenSchema
from tickler.api.tokens import unknown_queues
from tickler.api.ui.session import end_session, signed_in
from tickler.scheduler.store.tokens import TokenInfo

_issue_schema = IssueTokenSchema()


def install(bp: Blueprint) -> None:
    bp.add_url_rule("/tokens", "tokens", tokens_page)
    bp.add_url_rule("/tokens", "create_token", create_token, methods=["POST"])
    bp.add_url_rule("/tokens/<int:token_id>/revoke", "revoke_token", revoke_token, methods=["POST"])


def _require_admin() -> None:
    if not signed_in().is_admin:
        raise Forbidden("Managing tokens needs an admin token.")


def tokens_page() -> str:
    _require_admin()
    return _render()


def _render(
    *,
    created: tuple[str, str] | None = None,
    repeated: TokenInfo | None = None,
    errors: dict[str, str] | None = None,
) -> str:
    tokens = context.store().tokens.list()
    return render_template(
        "ui/tokens.html",
        tokens=tokens,
        created=created,
        repeated=repeated,
        errors=errors or {},
        typed=request.form if errors else {},
        issue_key=secrets.token_urlsafe(18),  # a fresh one for the next form
        own_token_id=g.get("token_id"),
    )


ISSUE_KEY = re.compile(r"^[A-Za-z0-9_-]{16,64}$")


def create_token() -> tuple[str, int]:
    _require_admin()
    queues = [name for name in re.split(r"[\s,]+", request.form.get("queues", "")) if name]
    body = {"name": request.form.get("name", "").strip(), "queues": queues, "admin": request.form.get("admin") == "yes"}
    issue_key = request.form.get("issue_key") or None  # a form from before issue keys has none
    try:
        loaded = _issue_schema.load(body)
    except ValidationError as error:
        errors = {field: " ".join(map(str, messages)) for field, messages in _messages(error).items()}
        return _render(errors=errors), 400
    if issue_key is not None and not ISSUE_KEY.match(issue_key):
        return _render(
            errors={"form": "This form is not one the page made: reload the page and fill it in again."}
        ), 400
    missing = unknown_queues(loaded["queues"])
    if missing:
        return _render(errors={"queues": missing}), 400
    tokens = context.store().tokens
    token, info = tokens.issue_once(
        loaded["name"],
        queues=loaded["queues"],
        is_admin=loaded["admin"],
        issue_key=issue_key,
        actor=signed_in().name,
    )
    if token is None:  # the same form again: its token was made (and shown) the first time
        return _render(repeated=info), 200
    # Answered here, not by a redirect: the token appears this once, in this page's body only.
    return _render(created=(info.principal, token)), 201


def _messages(error: ValidationError) -> dict[str, list[object]]:
    messages = error.messages
    if not isinstance(messages, dict):
        return {"token": [str(messages)]}
    return {str(k): v if isinstance(v, list) else [v] for k, v in messages.items()}


def revoke_token(token_id: int) -> Response:
    _require_admin()
    info = context.store().tokens.revoke(token_id, actor=signed_in().name)
    if info is None:
        flash(f"No token {token_id}.", "error")
        return redirect(url_for("ui.tokens"), code=303)
    context.tickler().principals.clear()  # this process stops accepting it at once
    if token_id == g.get("token_id"):
        end_session()  # it was this session's token: the session is over too
        flash(f"You revoked token {token_id}, the one you were signed in with: sign in with another token.", "ok")
        return redirect(url_for("ui.sign_in"), code=303)
    flash(f"Revoked token {token_id} of {info.principal}: it no longer works, its sessions are over.", "ok")
    return redirect(url_for("ui.tokens"), code=303)
