"""/v1/tokens (admin): issue, list and revoke API tokens. A token is shown once, when issued."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify
from marshmallow import Schema, ValidationError, fields, validate, validates

from api import context
from api.schemas import StrictBoolean, Text
from scheduler.errors import NotFound
from scheduler.rules import check_queue_name, format_timestamp
from scheduler.store.tokens import TokenInfo

bp = Blueprint("tokens", __name__, url_prefix="/tokens")


class IssueTokenSchema(Schema):
    """POST /v1/tokens."""

    name = Text(
        required=True,
        max_length=200,
        validate=validate.Length(min=1),
        metadata={"description": "The principal: the client service the token belongs to."},
    )
    queues = fields.List(fields.String(), load_default=list, validate=validate.Length(max=1000))
    admin = StrictBoolean(load_default=False)

    @validates("queues")
    def _queues(self, value: list[str], **kwargs: Any) -> None:
        bad = [name for name in value if check_queue_name(name)]
        if bad:
            raise ValidationError(f"Not a queue name: {bad[0]!r}.")


class TokenSchema(Schema):
    id = fields.Integer()
    name = fields.String()
    admin = fields.Boolean()
    queues = fields.List(fields.String())
    created_on = fields.String()
    revoked_on = fields.String(allow_none=True)
    token = fields.String(metadata={"description": "Only in the answer to POST: the one time it is shown."})


_issue_schema = IssueTokenSchema()


def token_json(info: TokenInfo) -> dict[str, Any]:
    return {
        "id": info.id,
        "name": info.principal,
        "admin": info.is_admin,
        "queues": list(info.queues),
        "created_on": format_timestamp(info.created_on),
        "revoked_on": format_timestamp(info.revoked_on),
    }


@bp.post("")
def issue() -> Response:
    context.require_admin()
    fields_ = _issue_schema.load(context.json_body())
    token, info = context.store().tokens.issue(fields_["name"], queues=fields_["queues"], is_admin=fields_["admin"])
    response = jsonify({**token_json(info), "token": token})
    response.status_code = 201
    return response


@bp.get("")
def list_tokens() -> Response:
    context.require_admin()
    return jsonify({"tokens": [token_json(t) for t in context.store().tokens.list()]})


@bp.delete("/<int:token_id>")
def revoke(token_id: int) -> Response:
    context.require_admin()
    info = context.store().tokens.revoke(token_id)
    if info is None:
        raise NotFound(f"No token {token_id}.")
    context.tickler().principals.clear()  # this process stops accepting it at once
    return jsonify(token_json(info))
