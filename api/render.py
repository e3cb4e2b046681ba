"""How events, timelines and queues look in responses."""

from __future__ import annotations

from typing import Any

from api.schemas import EventSchema, TimelineEntrySchema
from scheduler.models import Event, Queue, TimelineEntry
from scheduler.rules import format_timestamp

_event_schema = EventSchema()
_timeline_schema = TimelineEntrySchema(many=True)


def event_json(event: Event, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = _event_schema.dump(event)
    body.update(extra)
    return body


def timeline_json(item_key: str, entries: list[TimelineEntry], archived: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"item_key": item_key, "entries": _timeline_schema.dump(entries)}
    if archived is not None:
        body["archived"] = archived  # older entries were moved to Parquet by the archive job
    return body


def etag(event: Event) -> str:
    return f'"{event.version}"'


def queue_json(
    queue: Queue, *, counts: dict[str, int] | None = None, signing_secret: str | None = None
) -> dict[str, Any]:
    delivery: dict[str, Any] = {"mode": queue.delivery_mode}
    if queue.delivery_mode == "webhook":
        delivery["url"] = queue.webhook_url
        delivery["timeout_seconds"] = queue.webhook_timeout_seconds
    body: dict[str, Any] = {
        "name": queue.name,
        "delivery": delivery,
        "lease_seconds": queue.lease_seconds,
        "max_attempts": queue.max_attempts,
        "backoff": {
            "initial_seconds": queue.backoff_initial_seconds,
            "max_seconds": queue.backoff_max_seconds,
            "multiplier": queue.backoff_multiplier,
        },
        "created_on": format_timestamp(queue.created_on),
        "updated_on": format_timestamp(queue.updated_on),
    }
    if counts is not None:
        body["counts"] = counts
    if signing_secret is not None:
        body["signing_secret"] = signing_secret
    return body
