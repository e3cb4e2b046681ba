"""GET /v1/queues/{queue}/export: every event a search matches, as CSV or JSON Lines.

The answer is streamed: the search is read a page at a time (keyset, as the search's own pages)
and each page is written out before the next is read, so memory stays the same at any size. The
pages are separate reads, not one snapshot: an event that changes while the export runs may show
in its old or new state, or (if its due time moves past the export's position) not at all.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from flask import Blueprint, Response, stream_with_context

from tickler.api import auth, context
from tickler.api.events import search_filter
from tickler.api.render import event_json
from tickler.api.schemas.events import ExportArgsSchema
from tickler.scheduler.models import Event
from tickler.scheduler.store import SearchFilter, Store

bp = Blueprint("export", __name__, url_prefix="/queues/<queue>/export")

# Events read from the database per page of an export.
PAGE = 1000
# The columns of a CSV export, in order: an event's JSON fields, `data` as JSON text.
CSV_COLUMNS = (
    "id",
    "queue",
    "item_key",
    "group_key",
    "status",
    "schedule_on",
    "priority",
    "fairness_key",
    "enqueued_on",
    "enqueued_by",
    "dequeued_on",
    "dequeued_by",
    "claimed_on",
    "claimed_by",
    "redeliver_count",
    "max_attempts",
    "last_error",
    "version",
    "changed_on",
    "data",
)
MEDIA_TYPES = {"csv": "text/csv; charset=utf-8", "jsonl": "application/jsonl; charset=utf-8"}

_args_schema = ExportArgsSchema()


@bp.get("")
def export(queue: str) -> Response:
    auth.visible_queue(queue)
    return export_response(queue, context.query_args())


def export_response(queue: str, query: dict[str, str]) -> Response:
    """The streamed export of the events a search's query string (ExportArgsSchema) matches, in a
    queue the caller may see (checked by the caller)."""
    args = _args_schema.load(query)
    where = search_filter(args, limit=PAGE)
    lines = _csv_lines if args["format"] == "csv" else _jsonl_lines
    events = matching_events(context.store(), queue, where, args["limit"])
    response = Response(stream_with_context(lines(events)), mimetype=MEDIA_TYPES[args["format"]].split(";")[0])
    response.headers["Content-Type"] = MEDIA_TYPES[args["format"]]
    response.headers["Content-Disposition"] = f'attachment; filename="{queue}-events.{args["format"]}"'
    return response


def matching_events(store: Store, queue: str, where: SearchFilter, limit: int) -> Iterator[Event]:
    """Every event the search matches, at most `limit`, in the search's order, a page at a time."""
    left = limit
    while left > 0:
        page = store.events.search(queue, replace(where, limit=min(where.limit, left)))
        yield from page
        left -= len(page)
        if len(page) < where.limit:
            return
        where = replace(where, after=where.position(page[-1]))


def _jsonl_lines(events: Iterator[Event]) -> Iterator[str]:
    for event in events:
        yield json.dumps(event_json(event), ensure_ascii=False, separators=(",", ":")) + "\n"


def _csv_lines(events: Iterator[Event]) -> Iterator[str]:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")

    def line(values: list[Any]) -> str:
        writer.writerow(values)
        text = buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
        return text

    yield line(list(CSV_COLUMNS))
    for event in events:
        row = event_json(event)
        row["data"] = json.dumps(row["data"], ensure_ascii=False, separators=(",", ":"))
        yield line(["" if row[name] is None else row[name] for name in CSV_COLUMNS])
