"""The rules an event must follow, whoever submits it (HTTP API, Python API, bulk import).

Each check returns an error message, or None when the value is fine, so that callers can
collect messages per field instead of stopping at the first.
"""

from __future__ import annotations

import json
import re
import unicodedata
from datetime import UTC, datetime, timedelta
from typing import Any

QUEUE_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
MAX_KEY_LENGTH = 255
# The furthest ahead an event may be scheduled; beyond it a typo (a year 20260) is more likely
# than intent, and PostgreSQL's interval arithmetic stays far from its limits.
MAX_SCHEDULE_AHEAD = timedelta(days=366 * 100)
MAX_DELAY_SECONDS = MAX_SCHEDULE_AHEAD.total_seconds()
MAX_ATTEMPTS_LIMIT = 1000

# RFC 3339 date-time, with "T" (or "t") and a mandatory offset ("Z" or ±hh:mm).
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$")
ON_CONFLICT_CHOICES = ("reject", "ignore", "replace")


def check_queue_name(name: str) -> str | None:
    if not QUEUE_NAME.match(name):
        return "Must be 1-63 characters: lowercase letters, digits, '_', '.', '-', starting with a letter or digit."
    return None


def _is_forbidden_char(ch: str) -> bool:
    return ch == "/" or ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp")


def check_key(value: str) -> str | None:
    """item_key / group_key: 1-255 characters, no '/', no whitespace or control characters."""
    if not value:
        return "Must not be empty."
    if len(value) > MAX_KEY_LENGTH:
        return f"Must be at most {MAX_KEY_LENGTH} characters."
    bad = next((ch for ch in value if _is_forbidden_char(ch)), None)
    if bad is not None:
        return f"Must not contain '/', whitespace or control characters (found U+{ord(bad):04X})."
    return None


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
    return parsed.astimezone(UTC)


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


def check_data(data: dict[str, Any], max_bytes: int) -> tuple[str, str] | None:
    """`data` must be storable as jsonb and fit the size limit.

    Returns ("invalid" | "too_large", message), or None when it is fine. PostgreSQL's jsonb
    refuses NUL characters and lone surrogates, so they are refused here, before any write.
    """
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    # Look for the NUL character itself: searching the JSON text for "\\u0000" would also
    # refuse a string holding a backslash followed by "u0000", which jsonb stores fine.
    if "\\u0000" in text and _has_nul(data):
        return "invalid", "Must not contain NUL characters (\\u0000)."
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return "invalid", "Must not contain lone UTF-16 surrogates."
    if size > max_bytes:
        return "too_large", f"Event data is {size} bytes; the limit is {max_bytes}."
    return None


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
