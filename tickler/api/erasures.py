"""/v1/erasures (admin, SPEC §12): request the erasure of a subject, follow it, and ask whether a
value was erased. The work is done by the dispatcher (scheduler/erasing.py), not by this process:
a request only logs the erasure, pending."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import Blueprint, Response, jsonify

from tickler.api import auth, context
from tickler.api.schemas.erasures import ErasureLookupArgsSchema, RequestErasureSchema
from tickler.scheduler import erasing
from tickler.scheduler.erasing import Hasher
from tickler.scheduler.errors import NotFound
from tickler.scheduler.rules import format_timestamp
from tickler.scheduler.store.erasures import Erasure, ErasureStore, Selector

bp = Blueprint("erasures", __name__, url_prefix="/erasures")

_request_schema = RequestErasureSchema()
_lookup_schema = ErasureLookupArgsSchema()


def erasure_json(erasure: Erasure) -> dict[str, Any]:
    return {
        "id": erasure.id,
        "status": erasure.status,
        "requested_by": erasure.requested_by,
        "requested_at": format_timestamp(erasure.requested_at),
        "started_at": format_timestamp(erasure.started_at),
        "finished_at": format_timestamp(erasure.finished_at),
        "reason": erasure.reason,
        "queues": None if erasure.queues is None else list(erasure.queues),
        "counts": {
            "open_events": erasure.open_events,
            "finished_events": erasure.finished_events,
            "timeline_entries": erasure.timeline_entries,
            "archive_rows": erasure.archive_rows,
        },
        "note": erasure.note,
    }


def _erasures() -> ErasureStore:
    return ErasureStore(context.store().engine)


def _hashed() -> Callable[[str], str]:
    """The installation's keyed hash, under the key it has now (scheduler/erasing.py)."""
    return Hasher(context.store().engine, context.tickler().settings.secret_key).bound()


@bp.post("")
def request_erasure() -> Response:
    auth.require_admin()
    fields_ = _request_schema.load(context.json_body())
    queues = fields_.get("queues")
    selector = Selector(
        group_key=fields_.get("group_key"),
        item_keys=None if "item_keys" not in fields_ else tuple(dict.fromkeys(fields_["item_keys"])),
        item_key_prefix=fields_.get("item_key_prefix"),
        queues=None if queues is None else tuple(queues),
    )
    erasure = erasing.request(
        context.store().engine,
        selector,
        reason=fields_["reason"],
        requested_by=auth.principal().name,
        secret=context.tickler().settings.secret_key,
    )
    response = jsonify(erasure_json(erasure))
    response.status_code = 202
    response.headers["Location"] = f"/v1/erasures/{erasure.id}"
    return response


@bp.get("/<int:erasure_id>")
def get_erasure(erasure_id: int) -> Response:
    auth.require_admin()
    erasure = _erasures().get(erasure_id)
    if erasure is None:
        raise NotFound(f"No erasure {erasure_id}.")
    return jsonify(erasure_json(erasure))


@bp.get("")
def look_up() -> Response:
    auth.require_admin()
    args = _lookup_schema.load(context.query_args())
    kind = "item_key" if "item_key" in args else "group_key"
    found = _erasures().by_hash(kind, _hashed()(args[kind]))
    return jsonify({"erasures": [erasure_json(erasure) for erasure in found]})
