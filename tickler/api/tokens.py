"""/v1/tokens (admin): issue, list and revoke API tokens. A token is shown once, when issued."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify

from tickler.api import auth, context
from tickler.api.schemas.tokens import IssueTokenSchema
from tickler.scheduler.errors import Invalid, NotFound
from tickler.scheduler.rules import format_timestamp
from tickler.scheduler.store.tokens import TokenInfo

bp = Blueprint("tokens", __name__, url_prefix="/tokens")


_issue_schema = IssueTokenSchema()


def token_json(info: TokenInfo) -> dict[str, Any]:
    return {
        "id": info.id,
        "name": info.principal,
        "admin": info.is_admin,
        "queues": list(info.queues),
        "created_on": format_timestamp(info.created_on),
        "revoked_on": format_timestamp(info.revoked_on),
        "last_used_at": format_timestamp(info.last_used_on),
    }


def unknown_queues(names: list[str]) -> str | None:
    """What is wrong with a new token's queues: those that do not exist (None: all do)."""
    if not names:
        return None
    known = {queue.name for queue in context.store().queues.list(sorted(set(names)))}
    missing = sorted(set(names) - known)
    if not missing:
        return None
    listed = ", ".join(repr(name) for name in missing)
    return f"No queue named {listed}: create the queue first (PUT /v1/queues/{{queue}}), then its token."


@bp.post("")
def issue() -> Response:
    caller = auth.require_admin()
    fields_ = _issue_schema.load(context.json_body())
    missing = unknown_queues(fields_["queues"])
    if missing:
        raise Invalid("The token names a queue that does not exist.", errors={"queues": [missing]})
    token, info = context.store().tokens.issue(
        fields_["name"], queues=fields_["queues"], is_admin=fields_["admin"], actor=caller.name
    )
    response = jsonify({**token_json(info), "token": token})
    response.status_code = 201
    return response


@bp.get("")
def list_tokens() -> Response:
    auth.require_admin()
    return jsonify({"tokens": [token_json(t) for t in context.store().tokens.list()]})


@bp.delete("/<int:token_id>")
def revoke(token_id: int) -> Response:
    caller = auth.require_admin()
    info = context.store().tokens.revoke(token_id, actor=caller.name)
    if info is None:
        raise NotFound(f"No token {token_id}.")
    context.tickler().principals.clear()  # this process stops accepting it at once
    return jsonify(token_json(info))
