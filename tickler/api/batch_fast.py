"""A fast path for valid batches and single events.

Loading 10,000 events through marshmallow costs ~60 µs an event, more than the database spends
storing them. Most batches are valid, so this check only answers "certainly valid" — with
scheduler.rules.new_event, the same rules the schema applies — and returns the events; on
anything else it answers None, and the caller loads the body with BatchSchema, which then
reports the errors exactly as everywhere else. It must never accept what the schema refuses.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from tickler.api.jsonio import optional_orjson
from tickler.scheduler import rules
from tickler.scheduler.models import NewEvent
from tickler.scheduler.tracing import TraceContext

_BODY_FIELDS = frozenset({"events", "on_conflict", "debounce_max_seconds"})
_SCHEDULE_ONLY = frozenset({"on_conflict", "debounce_max_seconds"})
# JSON escapes that could put a NUL or a lone surrogate into a string (jsonb refuses both).
_RISKY_ESCAPE = re.compile(rb"\\u(0000|[dD][89a-fA-F])")
_orjson = optional_orjson()


def valid_batch(body: dict[str, Any], *, max_events: int) -> tuple[list[NewEvent], str, float | None] | None:
    """(events, on_conflict, debounce_max_seconds) when the body is certainly valid, else None."""
    if not body.keys() <= _BODY_FIELDS:
        return None
    events = body.get("events")
    try:
        on_conflict = rules.on_conflict(body.get("on_conflict", "reject"))
        debounce_max = body.get("debounce_max_seconds")
        if "debounce_max_seconds" in body:
            debounce_max = rules.debounce_max_seconds(debounce_max)
    except rules.RuleError:
        return None
    if type(events) is not list:
        return None
    if not 1 <= len(events) <= max_events:
        return None
    now = datetime.now(UTC)
    seen: set[str] = set()
    loaded = []
    for item in events:
        if type(item) is not dict:
            return None
        try:
            event = rules.new_event(item, now)
        except rules.RuleErrors:
            return None
        if event.item_key in seen:
            return None
        seen.add(event.item_key)
        loaded.append(event)
    return loaded, on_conflict, debounce_max


def valid_event(body: dict[str, Any]) -> tuple[NewEvent, str, float | None] | None:
    """(event, on_conflict, debounce_max_seconds) when the body of a single-event schedule is
    certainly valid, else None (ScheduleEventSchema then names the errors)."""
    try:
        on_conflict = rules.on_conflict(body["on_conflict"]) if "on_conflict" in body else "reject"
        debounce_max = None
        if "debounce_max_seconds" in body:
            debounce_max = rules.debounce_max_seconds(body["debounce_max_seconds"])
        if "on_conflict" in body or "debounce_max_seconds" in body:
            body = {k: v for k, v in body.items() if k not in _SCHEDULE_ONLY}
        return rules.new_event(body, datetime.now(UTC)), on_conflict, debounce_max
    except (rules.RuleError, rules.RuleErrors):
        return None


def take_item_traces(body: Any) -> list[TraceContext | None]:
    """Take each batch item's own `traceparent`/`tracestate` out of it (SPEC §11), before the item
    is checked: [] when no item has one. A malformed one is ignored, never refused."""
    events = body.get("events") if isinstance(body, dict) else None
    if type(events) is not list:
        return []
    traces: list[TraceContext | None] = []
    found = False
    for item in events:
        if type(item) is dict and ("traceparent" in item or "tracestate" in item):
            found = True
            traces.append(TraceContext.parse(item.pop("traceparent", None), item.pop("tracestate", None)))
        else:
            traces.append(None)
    return traces if found else []


def items_certainly_storable(raw_body: bytes, events: list[NewEvent], max_event_data_bytes: int) -> list[bool]:
    """Per event, True when its data certainly passes the data rules, for a body over the size
    limit (a batch of 10,000): no risky escape in the body, and orjson's compact text of the data at
    most half the limit (orjson and json write the same text but for a float's exponent, a few
    bytes). Without orjson, or for any other event: False (the exact check decides)."""
    if _orjson is None or _RISKY_ESCAPE.search(raw_body) is not None:
        return [False] * len(events)
    half = max_event_data_bytes // 2
    fits = []
    for event in events:
        try:
            fits.append(len(_orjson.dumps(event.data)) <= half)
        except TypeError:  # an integer beyond 64 bits: the exact check
            fits.append(False)
    return fits


def data_is_certainly_storable(raw_body: bytes, max_event_data_bytes: int) -> bool:
    """True when no event's data can break a data rule: the whole body is within the per-event
    size limit, and it has no escape that could hold a NUL or a lone surrogate."""
    return len(raw_body) <= max_event_data_bytes and _RISKY_ESCAPE.search(raw_body) is None
