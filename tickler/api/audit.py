"""/v1/audit (admin): the operations log, newest first, a page at a time."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from flask import Blueprint, Response, jsonify

from tickler.api import auth, context
from tickler.api.schemas.audit import AuditArgsSchema
from tickler.scheduler.errors import Invalid
from tickler.scheduler.rules import format_timestamp
from tickler.scheduler.store.audit import Entry, EntryFilter

bp = Blueprint("audit", __name__, url_prefix="/audit")

_args_schema = AuditArgsSchema()


def encode_cursor(entry_id: int) -> str:
    return base64.urlsafe_b64encode(f"op|{entry_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    try:
        kind, _, raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode().partition("|")
        entry_id = int(raw)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        entry_id, kind = -1, ""
    if kind != "op" or not 0 < entry_id < 2**63:
        raise Invalid("The cursor is not valid.", errors={"cursor": ["Not a cursor from a previous page."]})
    return entry_id


def entry_json(entry: Entry) -> dict[str, Any]:
    return {
        "id": entry.id,
        "at": format_timestamp(entry.at),
        "actor": entry.actor,
        "action": entry.action,
        "queue": entry.queue,
        "before": entry.before,
        "after": entry.after,
    }


def load_filter(args: dict[str, str]) -> tuple[EntryFilter, int]:
    """The filter and page size a query string asks for (400 with per-field messages otherwise)."""
    loaded = _args_schema.load(args)
    before_id = decode_cursor(loaded["cursor"]) if "cursor" in loaded else None
    where = EntryFilter(
        queue=loaded.get("queue"),
        actor=loaded.get("actor"),
        action=loaded.get("action"),
        since=loaded.get("since"),
        before_id=before_id,
    )
    return where, int(loaded["limit"])


@bp.get("")
def list_entries() -> Response:
    auth.require_admin()
    where, limit = load_filter(context.query_args())
    page = context.store().audit.page(where, limit=limit + 1)
    more = len(page) > limit
    page = page[:limit]
    return jsonify(
        {
            "entries": [entry_json(e) for e in page],
            "next_cursor": encode_cursor(page[-1].id) if more else None,
        }
    )
