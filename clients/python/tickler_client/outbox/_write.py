"""Writing calls into the outbox, inside the caller's transaction: `schedule`, `reschedule` and
`cancel` with the client's arguments, checked here (nothing half-valid is written) and stored
as the HTTP request tickler will be sent."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, get_args

from tickler_client._fields import UNSET, Unset, seconds, timestamp
from tickler_client.errors import ValidationError
from tickler_client.models import OnConflict
from tickler_client.outbox._sql import run


def _refuse(name: str, message: str) -> ValidationError:
    return ValidationError(message, errors={name: [message]})


def _delay_seconds(schedule_on: datetime | str | None, delay: float | timedelta | None) -> float | None:
    if schedule_on is not None and delay is not None:
        raise _refuse("delay", "Give schedule_on or delay, not both.")
    if delay is None:
        return None
    value = seconds(delay)
    if not math.isfinite(value) or value < 0:
        raise _refuse("delay", "Must be a number of seconds, 0 or more.")
    return value


def _json(body: dict[str, Any]) -> str:
    try:
        return json.dumps(body, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as refused:
        raise _refuse("data", f"Cannot be sent as JSON: {refused}.") from None


def _write(conn: Any, queue: str, item_key: str, operation: str, body: dict[str, Any], delay: float | None) -> int:
    if not queue or not item_key:
        raise _refuse("item_key" if queue else "queue", "Must not be empty.")
    params = {
        "queue": queue,
        "item_key": item_key,
        "operation": operation,
        "body": _json(body),
        "delay_seconds": delay,
    }
    [(row_id,)] = run(conn, "insert", params)
    return int(row_id)


def schedule(
    conn: Any,
    queue: str,
    item_key: str,
    data: Mapping[str, Any] | None = None,
    *,
    schedule_on: datetime | str | None = None,
    delay: float | timedelta | None = None,
    group_key: str | None = None,
    max_attempts: int | None = None,
    on_conflict: OnConflict = "reject",
    debounce_max_seconds: float | timedelta | None = None,
) -> int:
    """`Client.schedule`, written in the caller's transaction: tickler is asked once it commits,
    never if it rolls back. `delay` (or no time: now) becomes an absolute time from the database
    clock. Returns the outbox row's id.

    >>> with psycopg.connect(dsn) as conn:  # one transaction
    ...     conn.execute("INSERT INTO account ...")
    ...     outbox.schedule(conn, "emails", f"welcome:{email}", {"template": "welcome"}, delay=3600)
    """
    if on_conflict not in get_args(OnConflict):
        raise _refuse("on_conflict", f"Must be one of: {', '.join(get_args(OnConflict))}.")
    body: dict[str, Any] = {"data": dict(data or {}), "on_conflict": on_conflict}
    if schedule_on is not None:
        body["schedule_on"] = timestamp(schedule_on)
    if group_key is not None:
        body["group_key"] = group_key
    if max_attempts is not None:
        body["max_attempts"] = max_attempts
    if debounce_max_seconds is not None:
        body["debounce_max_seconds"] = seconds(debounce_max_seconds)
    return _write(conn, queue, item_key, "schedule", body, _delay_seconds(schedule_on, delay))


def reschedule(
    conn: Any,
    queue: str,
    item_key: str,
    *,
    schedule_on: datetime | str | None = None,
    delay: float | timedelta | None = None,
    data: Mapping[str, Any] | None = None,
    group_key: str | Unset | None = UNSET,
) -> int:
    """`Client.reschedule`, written in the caller's transaction (`delay` becomes an absolute
    time from the database clock). Returns the outbox row's id."""
    body: dict[str, Any] = {}
    if schedule_on is not None:
        body["schedule_on"] = timestamp(schedule_on)
    if data is not None:
        body["data"] = dict(data)
    if not isinstance(group_key, Unset):
        body["group_key"] = group_key
    delay_seconds = _delay_seconds(schedule_on, delay)
    if not body and delay_seconds is None:
        raise _refuse("schedule_on", "Give schedule_on, delay, data or group_key: something to change.")
    return _write(conn, queue, item_key, "reschedule", body, delay_seconds)


def cancel(conn: Any, queue: str, item_key: str, *, reason: str | None = None) -> int:
    """`Client.cancel`, written in the caller's transaction. Returns the outbox row's id."""
    body = {} if reason is None else {"reason": reason}
    return _write(conn, queue, item_key, "cancel", body, None)
