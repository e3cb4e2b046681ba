"""How the dashboard shows times, ages and numbers (Jinja filters)."""

from __future__ import annotations

from datetime import UTC, datetime

from flask import Blueprint

from tickler.scheduler.rules import duration_units


def when(value: datetime | None) -> str:
    """A UTC time for people: 2026-11-22 18:04:05Z."""
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def age(seconds: float | None) -> str:
    """A duration in its two largest units: 45s, 3m 12s, 2h 5m, 3d 4h."""
    if seconds is None:
        return "—"
    return " ".join(f"{n}{unit}" for n, unit in duration_units(seconds))


def number(value: int | None) -> str:
    """Thin spaces between thousands: 12 345 678."""
    return "—" if value is None else f"{value:,}".replace(",", "\u202f")


def install(bp: Blueprint) -> None:
    bp.add_app_template_filter(when, "when")
    bp.add_app_template_filter(age, "age")
    bp.add_app_template_filter(number, "number")
