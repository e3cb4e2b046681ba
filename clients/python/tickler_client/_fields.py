"""Turning Python arguments into the JSON fields of requests (refusing, before anything is
sent, what the client can tell is wrong)."""

from __future__ import annotations

import enum
import warnings
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from tickler_client.errors import ValidationError


class Unset(enum.Enum):
    """Marks an argument that was not given (where None has a meaning of its own)."""

    UNSET = 0


UNSET = Unset.UNSET


def timestamp(value: datetime | str, name: str = "schedule_on") -> str:
    """RFC 3339 with an offset. A naive datetime is refused before any request (`ValidationError`
    naming the argument): it means a different instant on every machine, and the server would
    refuse its text anyway."""
    if isinstance(value, str):
        return value
    if value.tzinfo is None or value.utcoffset() is None:
        message = f"{value!r} has no timezone; give an aware datetime (e.g. tzinfo=timezone.utc)."
        raise ValidationError(message, errors={name: [message]})
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


def given(**fields: Any) -> dict[str, Any]:
    """The fields whose argument was given (None included: there it means "remove")."""
    return {k: v for k, v in fields.items() if v is not UNSET}


def deprecated(old: str, new: str) -> None:
    """Warn once per call site that `old` is an old name, kept so existing callers keep working."""
    warnings.warn(f"{old} is deprecated; use {new}", DeprecationWarning, stacklevel=4)
