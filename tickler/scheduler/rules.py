"""The rules an event must follow, whoever submits it (HTTP API, Python API, bulk import).

The `check_*` functions return an error message, or None when the value is fine. The field
rules (`item_key`, `schedule_on`, ...) take a value as JSON gives it and return it loaded, or
raise RuleError; `new_event` applies them all to one event and is what decides: the API's
schema, its batch fast path and the importer each call it (or its field rules), so they accept
and refuse the same things with the same messages.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from typing import Any

from tickler.scheduler.models import Event, Lease, NewEvent

QUEUE_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
MAX_KEY_LENGTH = 255
# The furthest ahead an event may be scheduled; beyond it a typo (a year 20260) is more likely
# than intent, and PostgreSQL's interval arithmetic stays far from its limits.
MAX_SCHEDULE_AHEAD = timedelta(days=366 * 100)
MAX_DELAY_SECONDS = MAX_SCHEDULE_AHEAD.total_seconds()
MAX_ATTEMPTS_LIMIT = 1000
MIN_PRIORITY = -100
MAX_PRIORITY = 100

# RFC 3339 date-time, with "T" (or "t") and a mandatory offset ("Z" or ±hh:mm).
# ASCII digits only: `\d` alone would also match other scripts' digits.
_RFC3339 = re.compile(
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?([Zz]|[+-][0-9]{2}:[0-9]{2})$"
)
# What scheduling does when the key has an open event (the API's and the importer's choices).
SCHEDULE_ON_CONFLICT = ("reject", "ignore", "replace", "debounce")


def check_queue_name(name: str) -> str | None:
    if not QUEUE_NAME.match(name):
        return "Must be 1-63 characters: lowercase letters, digits, '_', '.', '-', starting with a letter or digit."
    return None


# Printable ASCII but '/' and space: a key made of these alone breaks no rule of check_key (the
# common case, answered without looking each character's category up).
_PLAIN_KEY = re.compile(rf"[!-.0-~]{{1,{MAX_KEY_LENGTH}}}")


def _is_forbidden_char(ch: str) -> bool:
    return ch == "/" or ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp")


def check_key(value: str) -> str | None:
    """item_key / group_key: 1-255 characters, no '/', no whitespace or control characters."""
    if _PLAIN_KEY.fullmatch(value):
        return None
    if not value:
        return "Must not be empty."
    if len(value) > MAX_KEY_LENGTH:
        return f"Must be at most {MAX_KEY_LENGTH} characters."
    bad = next((ch for ch in value if _is_forbidden_char(ch)), None)
    if bad is not None:
        return f"Must not contain '/', whitespace or control characters (found U+{ord(bad):04X})."
    return None


# /events/<segment> endpoints beside /events/{item_key} (tests/test_openapi_routes.py keeps this
# list complete): keys of these names could not be addressed.
ENDPOINT_SEGMENTS = ("batch", "cancel", "retry")
# Keys that cannot be addressed at /events/{item_key}: URL clients collapse `.` and `..`.
UNADDRESSABLE_KEYS = (".", "..", *ENDPOINT_SEGMENTS)


def check_item_key(value: str) -> str | None:
    """check_key, and not a key that /events/{item_key} cannot address (UNADDRESSABLE_KEYS)."""
    if value in (".", ".."):
        return "Must not be '.' or '..' (they cannot be addressed in a URL)."
    if value in UNADDRESSABLE_KEYS:
        return f"Must not be {value!r}: /events/{value} is an endpoint, not a key's URL."
    return check_key(value)


def parse_rfc3339(value: str) -> datetime:
    """Parse an RFC 3339 date-time with an offset; raise ValueError with a readable message."""
    if not _RFC3339.match(value):
        raise ValueError("Must be an RFC 3339 date-time with an offset, e.g. 2026-11-22T09:00:00Z.")
    text = value.upper().replace("Z", "+00:00")
    # Python parses at most 6 fractional digits; RFC 3339 allows more. Keep microseconds.
    text = re.sub(r"(\.\d{6})\d+", r"\1", text)
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError("Not a valid date-time (check the day, month and hour ranges).") from None
    try:
        return parsed.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:59:59-23:59 is a valid text past datetime's last instant
        raise ValueError("Out of range once converted to UTC.") from None


def check_schedule_on(value: datetime, now: datetime) -> str | None:
    if value.year < 1970:
        return "Must not be before 1970."
    if value - now > MAX_SCHEDULE_AHEAD:
        return "Must be at most 100 years ahead."
    return None


def format_timestamp(value: datetime | None) -> str | None:
    """RFC 3339 in UTC with 'Z', as every tickler response spells time."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def duration_units(seconds: float) -> list[tuple[int, str]]:
    """A duration for people, in its two largest units: [(3, "m"), (12, "s")]; seconds alone
    under a minute. The dashboard and the command line each spell it their way."""
    whole = int(seconds)
    for size, unit, smaller_size, smaller in ((86400, "d", 3600, "h"), (3600, "h", 60, "m"), (60, "m", 1, "s")):
        if whole >= size:
            return [(whole // size, unit), (whole % size // smaller_size, smaller)]
    return [(whole, "s")]


def record_json(record: Any, names: Sequence[str]) -> dict[str, Any]:
    """These fields of a record (an event, a schedule), in this order, as tickler's JSON spells
    them: times (and tuples of times) in RFC 3339."""
    out: dict[str, Any] = {}
    for name in names:
        value = getattr(record, name)
        if isinstance(value, datetime):
            value = format_timestamp(value)
        elif isinstance(value, tuple):
            value = [format_timestamp(v) for v in value]
        out[name] = value
    return out


def check_data(data: dict[str, Any], max_bytes: int) -> tuple[str, str] | None:
    """`data` must be storable as jsonb and fit the size limit.

    Returns ("invalid" | "too_large", message), or None when it is fine. PostgreSQL's jsonb
    refuses NUL characters and lone surrogates, so they are refused here, before any write.
    """
    return data_text(data, max_bytes)[1]


def data_text(data: dict[str, Any], max_bytes: int) -> tuple[str, tuple[str, str] | None]:
    """`data` as compact JSON text, and check_data's verdict on it (one encoding for both)."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    # Look for the NUL character itself: searching the JSON text for "\\u0000" would also
    # refuse a string holding a backslash followed by "u0000", which jsonb stores fine.
    if "\\u0000" in text and _has_nul(data):
        return text, ("invalid", "Must not contain NUL characters (\\u0000).")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return text, ("invalid", "Must not contain lone UTF-16 surrogates.")
    if size > max_bytes:
        return text, ("too_large", f"Event data is {size} bytes; the limit is {max_bytes}.")
    return text, None


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any("\x00" in key or _has_nul(item) for key, item in value.items())
    if isinstance(value, list):
        return any(_has_nul(item) for item in value)
    return False


def check_text(value: str, max_length: int) -> str | None:
    """Free text (a cancel reason, an error message): no control characters, bounded length."""
    if len(value) > max_length:
        return f"Must be at most {max_length} characters."
    if any(unicodedata.category(ch) in ("Cc", "Cs") and ch not in "\t\n" for ch in value):
        return "Must not contain control characters."
    return None


# -- one new event ---------------------------------------------------------------------------------

REQUIRED = "Missing data for required field."
NOT_NULL = "Field may not be null."
UNKNOWN = "Unknown field."
NOT_BOTH = "Give schedule_on or delay_seconds, not both."
NEW_EVENT_FIELDS = (
    "item_key",
    "group_key",
    "schedule_on",
    "delay_seconds",
    "data",
    "max_attempts",
    "priority",
    "fairness_key",
)


class RuleError(ValueError):
    """A value breaks a rule; str() is the message for its field."""


class RuleErrors(ValueError):
    """Values break rules: `errors` maps each field to its messages."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__("; ".join(f"{k}: {' '.join(v)}" for k, v in errors.items()))
        self.errors = errors


def _range(value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise RuleError(f"Must be greater than or equal to {low} and less than or equal to {high}.")


def _of_type(value: Any, kind: type, message: str) -> Any:
    """`value` when it is a `kind`; else the message (NOT_NULL for null)."""
    if value is None:
        raise RuleError(NOT_NULL)
    if not isinstance(value, kind):
        raise RuleError(message)
    return value


def _string(value: Any) -> str:
    text: str = _of_type(value, str, "Not a valid string.")
    return text


def _checked(value: Any, check: Callable[[str], str | None]) -> str:
    text = _string(value)
    problem = check(text)
    if problem:
        raise RuleError(problem)
    return text


def item_key(value: Any) -> str:
    return _checked(value, check_item_key)


def key(value: Any) -> str:
    """A group_key, or a key prefix in a filter."""
    return _checked(value, check_key)


def group_key(value: Any) -> str | None:
    return None if value is None else key(value)


def schedule_on(value: Any, now: datetime | None = None) -> datetime:
    if value is None:
        raise RuleError(NOT_NULL)
    if not isinstance(value, str):
        raise RuleError("Must be a string holding an RFC 3339 date-time.")
    try:
        when = parse_rfc3339(value)
    except ValueError as error:
        raise RuleError(str(error)) from None
    problem = check_schedule_on(when, now or datetime.now(UTC))
    if problem:
        raise RuleError(problem)
    return when


def number(value: Any) -> float:
    """A JSON number (integer or decimal): not a string, not a boolean, finite."""
    if value is None:
        raise RuleError(NOT_NULL)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RuleError("Must be a number.")
    try:
        result = float(value)
    except OverflowError:
        raise RuleError("Must be a finite number.") from None
    if result != result or result in (float("inf"), float("-inf")):
        raise RuleError("Must be a finite number.")
    return result


def integer(value: Any) -> int:
    """A JSON integer: not a string, not a boolean, not 3.5. 3.0 is 3: JSON has one number type,
    and JSON Schema's "integer" (what /openapi.json promises) is any number without a fraction."""
    if value is None:
        raise RuleError(NOT_NULL)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RuleError("Must be an integer.")
    return value


def delay_seconds(value: Any) -> float:
    """A wait in seconds (delay_seconds, debounce_max_seconds): from 0 to MAX_DELAY_SECONDS."""
    seconds = number(value)
    _range(seconds, 0, MAX_DELAY_SECONDS)
    return seconds


def max_attempts(value: Any) -> int:
    attempts = integer(value)
    _range(attempts, 1, MAX_ATTEMPTS_LIMIT)
    return attempts


def priority(value: Any) -> int:
    """SPEC §10: -100..100, higher first."""
    level = integer(value)
    _range(level, MIN_PRIORITY, MAX_PRIORITY)
    return level


def fairness_key(value: Any) -> str | None:
    """SPEC §10: item_key rules; null is none."""
    return None if value is None else _checked(value, check_item_key)


def data(value: Any) -> dict[str, Any]:
    """The shape of `data`; its size and content are check_data's (a size is 413, not 400)."""
    mapping: dict[str, Any] = _of_type(value, dict, "Not a valid mapping type.")
    return mapping


def on_conflict(value: Any) -> str:
    text = _string(value)
    if text not in SCHEDULE_ON_CONFLICT:
        raise RuleError(f"Must be one of: {', '.join(SCHEDULE_ON_CONFLICT)}.")
    return text


debounce_max_seconds = delay_seconds


def check_when(given: Mapping[str, Any]) -> dict[str, list[str]]:
    """The rule across fields: a time is given at most one way."""
    if "schedule_on" in given and "delay_seconds" in given:
        return {"schedule_on": [NOT_BOTH], "delay_seconds": [NOT_BOTH]}
    return {}


def _field_rules(now: datetime) -> dict[str, Callable[[Any], Any]]:
    return {
        "item_key": item_key,
        "group_key": group_key,
        "schedule_on": lambda value: schedule_on(value, now),
        "delay_seconds": delay_seconds,
        "data": data,
        "max_attempts": max_attempts,
        "priority": priority,
        "fairness_key": fairness_key,
    }


def new_event(given: Mapping[str, Any], now: datetime | None = None) -> NewEvent:
    """One event to schedule, from its JSON object; raise RuleErrors naming every bad field."""
    rules = _field_rules(now or datetime.now(UTC))
    errors: dict[str, list[str]] = {}
    loaded: dict[str, Any] = {}
    for name, value in given.items():
        rule = rules.get(name)
        if rule is None:
            errors[name] = [UNKNOWN]
            continue
        try:
            loaded[name] = rule(value)
        except RuleError as error:
            errors[name] = [str(error)]
    for name in ("item_key", "data"):
        if name not in given:
            errors[name] = [REQUIRED]
    for name, messages in check_when(given).items():
        errors.setdefault(name, []).extend(messages)
    if errors:
        raise RuleErrors(errors)
    return NewEvent.of(loaded)


# What every interface shows of an event: all but its lease (a lease has a JSON of its own) and
# its trace context (a pull claim adds it, see lease_to_json; a webhook sends it as a header).
EVENT_JSON_FIELDS = tuple(
    f.name for f in fields(Event) if f.name not in ("lease_id", "lease_expires_on", "traceparent", "tracestate")
)


def event_to_json(event: Event) -> dict[str, Any]:
    """An event as every tickler interface shows it (HTTP responses, webhook bodies)."""
    return record_json(event, EVENT_JSON_FIELDS)


def lease_to_json(lease: Lease) -> dict[str, Any]:
    return {
        "lease_id": lease.lease_id,
        "expires_at": format_timestamp(lease.expires_at),
        "group_key": lease.group_key,
        "events": [_with_trace_context(event_to_json(e), e) for e in lease.events],
    }


def _with_trace_context(found: dict[str, Any], event: Event) -> dict[str, Any]:
    """A claimed event as a pull consumer sees it: with its producer's trace context, if it has one."""
    if event.traceparent is not None:
        found["traceparent"] = event.traceparent
        if event.tracestate is not None:
            found["tracestate"] = event.tracestate
    return found
