"""The Tokens page (admins only): every API token, issue one (shown once, on the page that
answers the form: never in a URL, a redirect or a log) and revoke one (its dashboard sessions end
at once, and the API stops accepting it)."""

from __future__ import annotations

import re

from flask import Blueprint, flash, redirect, render_template, request, url_for
from marshmallow import ValidationError
from werkzeug.exceptions import Forbidden
from werkzeug.wrappers import Response

from tickler.api import context
from tickler.api.schemas.tokens import IssueTokenSchema
from tickler.api.ui.session import signed_in

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


def _render(*, created: tuple[str, str] | None = None, errors: dict[str, str] | None = None) -> str:
    tokens = context.store().tokens.list()
    return render_template(
        "ui/tokens.html", tokens=tokens, created=created, errors=errors or {}, typed=request.form if errors else {}
    )


def create_token() -> tuple[str, int]:
    _require_admin()
    queues = [name for name in re.split(r"[\s,]+", request.form.get("queues", "")) if name]
    body = {"name": request.form.get("name", "").strip(), "queues": queues, "admin": request.form.get("admin") == "yes"}
    try:
        loaded = _issue_schema.load(body)
    except ValidationError as error:
        errors = {field: " ".join(map(str, messages)) for field, messages in _messages(error).items()}
        return _render(errors=errors), 400
    token, info = context.store().tokens.issue(
        loaded["name"], queues=loaded["queues"], is_admin=loaded["admin"], actor=signed_in().name
    )
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
    else:
        context.tickler().principals.clear()  # this process stops accepting it at once
        flash(f"Revoked token {token_id} of {info.principal}: it no longer works, its sessions are over.", "ok")
    return redirect(url_for("ui.tokens"), code=303)
