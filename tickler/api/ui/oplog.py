"""The Operations log page (admins only): the log of changes, newest first, filtered by queue,
actor, action and time, a page at a time (the same filters and cursor as GET /v1/audit)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from flask import Blueprint, render_template, request, url_for
from marshmallow import ValidationError
from werkzeug.exceptions import Forbidden

from tickler.api.audit import encode_cursor, load_filter
from tickler.api.ui.session import signed_in
from tickler.api.ui.store import audit_log
from tickler.scheduler.errors import Invalid
from tickler.scheduler.store.audit import ACTIONS, Entry

PAGE_SIZE = 50
_FILTERS = ("queue", "actor", "action", "since")


def install(bp: Blueprint) -> None:
    bp.add_url_rule("/audit", "audit", audit_page)


def audit_page() -> tuple[str, int]:
    if not signed_in().is_admin:
        raise Forbidden("The operations log is for admins.")
    typed = {name: request.args.get(name, "").strip() for name in (*_FILTERS, "cursor")}
    given = {name: value for name, value in typed.items() if value}
    entries: list[Entry] = []
    errors: dict[str, str] = {}
    next_url = None
    try:
        where, _ = load_filter({**given, "limit": str(PAGE_SIZE)})
    except ValidationError as error:
        errors = _flatten(error.messages)
    except Invalid as error:
        errors = {k: " ".join(v) for k, v in (error.extra.get("errors") or {}).items()}
    else:
        found = audit_log().page(where, limit=PAGE_SIZE + 1)
        entries = found[:PAGE_SIZE]
        if len(found) > PAGE_SIZE:
            args = {k: v for k, v in given.items() if k != "cursor"} | {"cursor": encode_cursor(entries[-1].id)}
            next_url = f"{url_for('ui.audit')}?{urlencode(args)}"
    page = render_template(
        "ui/audit.html", entries=entries, typed=typed, errors=errors, actions=ACTIONS, next_url=next_url
    )
    return page, 400 if errors else 200


def _flatten(messages: Any) -> dict[str, str]:
    if not isinstance(messages, dict):
        return {"filter": str(messages)}
    return {str(k): " ".join(map(str, v)) if isinstance(v, list) else str(v) for k, v in messages.items()}
