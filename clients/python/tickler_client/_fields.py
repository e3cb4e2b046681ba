"""Turning Python arguments into the JSON fields of requests."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any


class Unset(enum.Enum):
    """Marks an argument that was not given (where None has a meaning of its own)."""

    UNSET = 0


UNSET = Unset.UNSET


def timestamp(value: datetime | str) -> str:
    """RFC 3339 with an offset. A naive datetime is refused here: the server would guess nothing."""
    if isinstance(value, str):
        return value
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{value!r} has no timezone; give an aware datetime (e.g. tzinfo=timezone.utc)")
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def seconds(value: float | timedelta) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def when(schedule_on: datetime | str | None, delay: float | timedelta | None) -> dict[str, Any]:
    """`schedule_on` and/or `delay_seconds` as given (the server refuses both at once, with a 400)."""
    fields: dict[str, Any] = {}
    if schedule_on is not None:
        fields["schedule_on"] = timestamp(schedule_on)
    if delay is not None:
        fields["delay_seconds"] = seconds(delay)
    return fields


def statuses(value: str | Iterable[str] | None) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return ",".join(value)


def without_none(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}
