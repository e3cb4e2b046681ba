"""Loads the named queries of the package's SQL files once, as SQLAlchemy `text()` statements.

`queries.sql` holds the event life cycle; other `*.sql` files beside it hold one area each
(e.g. `operations.sql`). A name may be defined once across all of them.

A `-- fragment: x` block of a file is no query: a line `-- include: x` of a query of the same file
is replaced by its text (e.g. CTEs that several statements share word for word)."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import sqlalchemy as sa

_NAME = re.compile(r"^-- name: ([a-z_]+)\s*$")
_FRAGMENT = re.compile(r"^-- fragment: ([a-z_]+)\s*$")
_INCLUDE = re.compile(r"^\s*-- include: ([a-z_]+)\s*$")


def parse_queries(source: str) -> dict[str, str]:
    """Split `-- name: x` blocks into {name: sql}; the header comments stay with the SQL, and each
    `-- include: y` line becomes the text of the file's `-- fragment: y` block."""
    queries: dict[str, list[str]] = {}
    fragments: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in source.splitlines():
        match = _NAME.match(line)
        fragment = _FRAGMENT.match(line)
        if match:
            if match[1] in queries:
                raise ValueError(f"query {match[1]!r} is defined twice")
            current = queries[match[1]] = []
        elif fragment:
            if fragment[1] in fragments:
                raise ValueError(f"fragment {fragment[1]!r} is defined twice")
            current = fragments[fragment[1]] = []
        elif current is not None:
            current.append(line)

    def expand(lines: list[str]) -> str:
        out = []
        for line in lines:
            include = _INCLUDE.match(line)
            if include is None:
                out.append(line)
            elif include[1] not in fragments:
                raise ValueError(f"fragment {include[1]!r} is not defined")
            else:
                out.append("\n".join(fragments[include[1]]).strip())
        return "\n".join(out).strip().rstrip(";")

    return {name: expand(lines) for name, lines in queries.items()}


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
