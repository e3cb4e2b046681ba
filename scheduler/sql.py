"""Loads the named queries of the package's SQL files once, as SQLAlchemy `text()` statements.

`queries.sql` holds the event life cycle; other `*.sql` files beside it hold one area each
(e.g. `operations.sql`). A name may be defined once across all of them."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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
def sources() -> dict[str, str]:
    """Every named query of the package's SQL files, as written (`:name` parameters)."""
    found: dict[str, str] = {}
    files = sorted(
        (entry for entry in resources.files("tickler.scheduler").iterdir() if entry.name.endswith(".sql")),
        key=lambda entry: entry.name,
    )
    for entry in files:
        for name, sql in parse_queries(entry.read_text(encoding="utf-8")).items():
            if name in found:
                raise ValueError(f"query {name!r} is defined twice ({entry.name})")
            found[name] = sql
    return found


@cache
def queries() -> dict[str, sa.TextClause]:
    # SQLAlchemy is imported here, not with the module: plain.py reads the same sources without it.
    import sqlalchemy as sa

    return {name: sa.text(sql) for name, sql in sources().items()}


def q(name: str) -> sa.TextClause:
    """The named query `name` (KeyError names the missing query)."""
    return queries()[name]


@cache
def driver_sql(name: str) -> str:
    """The named query in psycopg's own placeholders (`%(name)s`), for a hot path that runs it on
    the driver's connection directly (no SQLAlchemy statement or result processing)."""
    from sqlalchemy.dialects.postgresql import psycopg as pg_psycopg

    return str(q(name).compile(dialect=pg_psycopg.dialect()))  # type: ignore[no-untyped-call]
