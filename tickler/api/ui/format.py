"""How the dashboard shows times, ages, numbers, event data and timeline details (Jinja filters)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from flask import Blueprint

from tickler.scheduler.models import TimelineEntry
from tickler.scheduler.rules import duration_units


def when(value: datetime | None) -> str:
    """A UTC time for people: 2026-11-22 18:04:05Z."""
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def in_zone(value: datetime | None, zone: str) -> str:
    """A time as the clocks of `zone` (an IANA name) show it: 2026-11-23 09:00 WET."""
    if value is None:
        return "—"
    try:
        local = value.astimezone(ZoneInfo(zone))
    except (ZoneInfoNotFoundError, ValueError):
        return ""
    return local.strftime("%Y-%m-%d %H:%M %Z")


def age(seconds: float | None) -> str:
    """A duration in its two largest units: 45s, 3m 12s, 2h 5m, 3d 4h."""
    if seconds is None:
        return "—"
    return " ".join(f"{n}{unit}" for n, unit in duration_units(seconds))


def number(value: int | None) -> str:
    """Thin spaces between thousands: 12 345 678."""
    return "—" if value is None else f"{value:,}".replace(",", "\u202f")


def pretty_json(value: Any) -> str:
    """JSON for people: indented, keys in the order stored, characters as they are (`O'Brien`,
    `<tom@…>`, `é`). Plain text: the template escapes it for HTML, as it does any other text
    (Jinja's `tojson` escapes for a <script> instead, and sorts the keys)."""
    return json.dumps(value, indent=2, ensure_ascii=False)


def readable(value: Any) -> str:
    """A value recorded in a timeline entry's details, as people read it: lists joined by
    commas, yes/no, times like every other time on the page, objects as compact JSON."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(readable(item) for item in value) or "—"
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    if isinstance(value, str) and len(value) >= 19 and value[4] == "-" and value[10] == "T":
        try:
            return when(datetime.fromisoformat(value))
        except ValueError:
            return value
    return str(value)


# Details shown first, under these labels; the others follow with their own names.
_DETAIL_LABELS = (
    ("attempt", "attempt"),
    ("lease_id", "lease"),
    ("lease_expires_at", "lease until"),
    ("claimed_by", "holder"),
    ("expired_at", "expired at"),
    ("error", "error"),
    ("retry_at", "retry at"),
    ("reason", "reason"),
    ("changed", "changed"),
    ("trace_id", "trace"),  # the template links it to TICKLER_TRACE_URL_TEMPLATE's page
)


def describe_entry(entry: TimelineEntry) -> list[tuple[str, str]]:
    """The details of a timeline entry worth showing, as (label, text) pairs, in a stable order."""
    details = dict(entry.details)
    shown: list[tuple[str, str]] = []
    for key, label in _DETAIL_LABELS:
        if key in details:
            shown.append((label, readable(details.pop(key))))
    shown.extend((key.replace("_", " "), readable(value)) for key, value in details.items())
    return shown


def install(bp: Blueprint) -> None:
    bp.add_app_template_filter(when, "when")
    bp.add_app_template_filter(age, "age")
    bp.add_app_template_filter(in_zone, "in_zone")
    bp.add_app_template_filter(number, "number")
    bp.add_app_template_filter(pretty_json, "pretty_json")
