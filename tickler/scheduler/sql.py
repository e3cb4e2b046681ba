"""The named queries of the package's SQL files, and the one way they run.

`queries.sql` holds the event life cycle; other `*.sql` files beside it hold one area each
(e.g. `operations.sql`). A name may be defined once across all of them. Only the files directly
in the package are read, not those of its folders.

A `-- fragment: x` block of a file is no query: a line `-- include: x` of a query of the same file
is replaced by its text (e.g. CTEs that several statements share word for word).

A query runs on a psycopg connection with `run(conn, driver_sql(name), params)`: prepared, its rows
as dicts or tuples (`rowcount`: the number of rows it changed). The connection is a pooled one of
the store's engine (db.driver_rows and db.driver_connection, which also translate the driver's
errors as SQLAlchemy's for the API), the command line's own (plain.py) or a pipeline job's. The
SQL files of a folder (the dashboard's, in store/) are read by `file_queries`. A query is written
with `:name` parameters, read as SQLAlchemy's text() reads them (pyformat), but runs on the driver
only. Neither this module nor plain.py imports SQLAlchemy: a short command starts without it."""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from psycopg.rows import dict_row, tuple_row

if TYPE_CHECKING:
    import psycopg

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


# SQLAlchemy's text() reads a bind parameter as a colon and a name, not after another colon or a
# word character (`::text` casts, `10:30`), and whole: a name followed by a colon (`:scan:` in a
# comment) is none, not a shorter one; `\:` is a literal colon.
_BIND = re.compile(r"(?<![:\w\\]):(\w+)(?![:\w])")


def pyformat(sql: str) -> str:
    """A query of the SQL files in psycopg's parameter style (`%(name)s`), read as SQLAlchemy's
    text() reads it."""
    return _BIND.sub(r"%(\1)s", sql.replace("%", "%%")).replace("\\:", ":")


@cache
def file_queries(package: str, filename: str) -> dict[str, str]:
    """The named queries of one SQL file of `package` (its own names: not those of sources()),
    in psycopg's placeholders, as driver_sql spells them."""
    source = resources.files(package).joinpath(filename).read_text(encoding="utf-8")
    return {name: pyformat(sql) for name, sql in parse_queries(source).items()}


@cache
def driver_sql(name: str) -> str:
    """The named query in psycopg's own placeholders (`%(name)s`), for run() (KeyError names the
    missing query)."""
    return pyformat(sources()[name])


def run(
    conn: psycopg.Connection[Any],
    statement: str,
    params: Mapping[str, Any] | None = None,
    *,
    tuples: bool = False,
    prepare: bool | None = True,
) -> list[Any]:
    """Run one statement (driver_sql(name)) on a psycopg connection, prepared (on the connection,
    once: a statement run again skips parsing and planning); its rows as dicts (`tuples`: as
    tuples), [] for a statement that returns none. `prepare=None`: psycopg's own choice (after a
    few runs), for a connection that runs each statement once (preparing costs a round trip).
    Errors are the driver's: db.driver_connection translates them for the store."""
    with conn.cursor(row_factory=tuple_row if tuples else dict_row) as cursor:
        cursor.execute(statement, params, prepare=prepare)
        # rownumber is None when the statement returned no rows at all (description builds a list)
        return cursor.fetchall() if cursor.rownumber is not None else []


def rowcount(
    conn: psycopg.Connection[Any],
    statement: str,
    params: Mapping[str, Any] | None = None,
    *,
    prepare: bool | None = True,
) -> int:
    """Run one statement as run() does, for the number of rows it changed (a DELETE's, an
    UPDATE's); rows it returns are dropped."""
    with conn.cursor(row_factory=tuple_row) as cursor:
        cursor.execute(statement, params, prepare=prepare)
        return cursor.rowcount
