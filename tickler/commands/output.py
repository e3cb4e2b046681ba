"""Printing for people (aligned columns) and for scripts (JSON)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from tickler.scheduler.rules import duration_units  # rules and models import no SQLAlchemy


def print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return str(value)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Plain columns, as wide as their widest cell; the last column is not padded."""
    texts = [[cell(value) for value in row] for row in rows]
    widths = [max([len(h), *(len(row[i]) for row in texts)]) for i, h in enumerate(headers)]
    for row in [list(headers), *texts]:
        padded = [text.ljust(width) for text, width in zip(row[:-1], widths[:-1], strict=True)]
        print("  ".join([*padded, row[-1]]).rstrip())


def print_fields(pairs: Sequence[tuple[str, Any]]) -> None:
    """One `name  value` line per field."""
    width = max(len(name) for name, _ in pairs)
    for name, value in pairs:
        print(f"{name.ljust(width)}  {cell(value)}")


def age(seconds: float) -> str:
    """A duration for people: 42s, 3m10s, 2h05m, 3d04h."""
    # the second unit padded to two digits, so that a column of ages lines up
    return "".join(f"{n:02d}{unit}" if i else f"{n}{unit}" for i, (n, unit) in enumerate(duration_units(seconds)))
