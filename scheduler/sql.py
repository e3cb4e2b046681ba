"""Loads the named queries of `queries.sql` once, as SQLAlchemy `text()` statements."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

import sqlalchemy as sa

_NAME = re.compile(r"^-- name: ([a-z_]+)\s*$")


def parse_queries(source: str) -> dict[str, str]:
    """Split `-- name: x` blocks into {name: sql}; the header comments stay with the SQL."""
    queries: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in source.splitlines():
        match = _NAME.match(line)
        if match:
            if match[1] in queries:
                raise ValueError(f"query {match[1]!r} is defined twice")
            current = queries[match[1]] = []
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines).strip().rstrip(";") for name, lines in queries.items()}


@cache
def queries() -> dict[str, sa.TextClause]:
    source = resources.files("scheduler").joinpath("queries.sql").read_text(encoding="utf-8")
    return {name: sa.text(sql) for name, sql in parse_queries(source).items()}


def q(name: str) -> sa.TextClause:
    """The named query `name` (KeyError names the missing query)."""
    return queries()[name]
