"""How events, timelines and queues look in responses."""

from __future__ import annotations

import contextlib
import re
from datetime import datetime
from typing import Any

from tickler.api.schemas.events import TimelineEntrySchema
from tickler.scheduler.models import Event, Queue, TimelineEntry
from tickler.scheduler.rules import format_timestamp

_timeline_schema = TimelineEntrySchema(many=True)


def event_json(event: Event, **extra: Any) -> dict[str, Any]:
    """What EventSchema dumps (tests/test_render.py holds them equal), written out: the
    schema's dump costs more than the rest of a single-event schedule's response."""
    body: dict[str, Any] = {
        "id": event.id,
        "queue": event.queue,
        "item_key": event.item_key,
        "group_key": event.group_key,
        "schedule_on": format_timestamp(event.schedule_on),
        "data": event.data,
        "status": event.status,
        "enqueued_on": format_timestamp(event.enqueued_on),
        "enqueued_by": event.enqueued_by,
        "dequeued_on": format_timestamp(event.dequeued_on),
        "dequeued_by": event.dequeued_by,
        "claimed_on": format_timestamp(event.claimed_on),
        "claimed_by": event.claimed_by,
        "redeliver_count": event.redeliver_count,
        "max_attempts": event.max_attempts,
        "last_error": event.last_error,
        "version": event.version,
        "priority": event.priority,
        "fairness_key": event.fairness_key,
        "changed_on": format_timestamp(event.changed_on),
    }
    body.update(extra)
    return body


# Timeline details written by SQL carry PostgreSQL's rendering of a time (`+00:00`); responses
# spell every time one way (`Z`). Only keys that name a time are touched, never client text.
_TIME_KEY = re.compile(r"_(at|on|since|until)$")


def _one_time_format(details: Any) -> Any:
    if not isinstance(details, dict):
        return details
    spelled = dict(details)
    for key, value in details.items():
        if isinstance(value, str) and _TIME_KEY.search(key):
            with contextlib.suppress(ValueError):
                spelled[key] = format_timestamp(datetime.fromisoformat(value))
    return spelled


def timeline_json(item_key: str, entries: list[TimelineEntry], archived: dict[str, Any] | None) -> dict[str, Any]:
    dumped = _timeline_schema.dump(entries)
    for entry in dumped:
        entry["details"] = _one_time_format(entry.get("details"))
    body: dict[str, Any] = {"item_key": item_key, "entries": dumped}
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
        "max_in_flight": queue.max_in_flight,
        "rate_per_second": queue.rate_per_second,
        "retention_days": queue.retention_days,
        "archive_before_prune": queue.archive_before_prune,
        "fair_share": queue.fair_share,
        "max_in_flight_per_key": queue.max_in_flight_per_key,
        "paused": queue.paused,
        "created_on": format_timestamp(queue.created_on),
        "updated_on": format_timestamp(queue.updated_on),
    }
    if counts is not None:
        body["counts"] = counts
    if signing_secret is not None:
        body["signing_secret"] = signing_secret
    return body
