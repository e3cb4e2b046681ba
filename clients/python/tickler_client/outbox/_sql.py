"""The outbox's SQL: the schema file and the named statements of queries.sql, read once, and how
they run on the caller's connection (psycopg 3, psycopg2, or SQLAlchemy)."""

from __future__ import annotations

import re
from importlib.resources import files
from typing import Any

SCHEMA_SQL = files("tickler_client.outbox").joinpath("schema.sql").read_text(encoding="utf-8")


def _named(text: str) -> dict[str, str]:
    blocks = re.split(r"^-- name: (\w+)\n", text, flags=re.MULTILINE)
    return {name: body.strip() for name, body in zip(blocks[1::2], blocks[2::2], strict=True)}


QUERIES = _named(files("tickler_client.outbox").joinpath("queries.sql").read_text(encoding="utf-8"))


def run(conn: Any, name: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    """Run a named statement on the caller's connection, in its transaction; its rows, if any.

    A SQLAlchemy `Connection` runs it through `exec_driver_sql` (its driver's `%(name)s` style:
    psycopg and psycopg2 alike); anything else is taken as a DB-API connection (psycopg 3 or
    psycopg2) and gets a cursor of its own."""
    sql = QUERIES[name]
    if hasattr(conn, "exec_driver_sql"):
        result = conn.exec_driver_sql(sql, params or {})
        return [tuple(row) for row in result.fetchall()] if result.returns_rows else []
    with conn.cursor() as cursor:
        cursor.execute(sql, params or {})
        return [tuple(row) for row in cursor.fetchall()] if cursor.description else []


def run_script(conn: Any, script: str) -> None:
    """Run a file of statements (the schema) on the caller's connection."""
    if hasattr(conn, "exec_driver_sql"):
        conn.exec_driver_sql(script)
        return
    with conn.cursor() as cursor:
        cursor.execute(script)
