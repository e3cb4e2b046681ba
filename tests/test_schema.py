"""One current home for the database: a database made from scheduler/database/ (schema.sql and
the code files) equals one brought there by every numbered migration, and each function, trigger
and view is defined once, in the code files."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests import pg
from tickler.scheduler.db import libpq_url
from tickler.scheduler.migrate import CODE_FILES, available_migrations, migrate

ROOT = Path(__file__).resolve().parent.parent
DATABASE = ROOT / "scheduler" / "database"
# The numbered steps from here on move tables and data only.
FIRST_STEP_WITHOUT_CODE = 75

# Everything of the schema that code reads or relies on, in comparable text. Partitions of a day
# are left out (maintenance makes them, by date); so are the `_upgraded` partitions, which hold an
# upgraded database's rows from before history was partitioned and which a new database never had.
_OBJECTS = {
    "column": """
        SELECT c.relname || '.' || a.attname, format_type(a.atttypid, a.atttypmod)
               || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END
               || coalesce(' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid), '')
               || coalesce(' COLLATE ' || nullif(co.collname, 'default'), '')
               || CASE WHEN a.attidentity <> '' THEN ' IDENTITY ' || a.attidentity::text ELSE '' END
               || ' #' || a.attnum
        FROM pg_attribute AS a
        JOIN pg_class AS c ON c.oid = a.attrelid
        LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        LEFT JOIN pg_collation AS co ON co.oid = a.attcollation
        WHERE c.oid = ANY(%(relations)s) AND a.attnum > 0 AND NOT a.attisdropped""",
    "relation": """
        SELECT c.relname, c.relkind::text || ' ' || coalesce(array_to_string(c.reloptions, ','), '')
               || coalesce(' ' || pg_get_partkeydef(c.oid), '')
               || coalesce(' ' || pg_get_expr(c.relpartbound, c.oid), '')
        FROM pg_class AS c WHERE c.oid = ANY(%(relations)s)""",
    "constraint": """
        SELECT c.relname || '.' || k.conname, pg_get_constraintdef(k.oid)
        FROM pg_constraint AS k JOIN pg_class AS c ON c.oid = k.conrelid
        WHERE c.oid = ANY(%(relations)s)""",
    "index": """
        SELECT i.relname, pg_get_indexdef(i.oid)
        FROM pg_index AS x JOIN pg_class AS i ON i.oid = x.indexrelid
        WHERE x.indrelid = ANY(%(relations)s)""",
    "view": """
        SELECT c.relname, pg_get_viewdef(c.oid) FROM pg_class AS c
        WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'v'""",
    "function": """
        SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')', pg_get_functiondef(p.oid)
        FROM pg_proc AS p WHERE p.pronamespace = 'public'::regnamespace""",
    "trigger": """
        SELECT t.tgname || ' ON ' || c.relname, pg_get_triggerdef(t.oid)
        FROM pg_trigger AS t JOIN pg_class AS c ON c.oid = t.tgrelid
        WHERE c.oid = ANY(%(relations)s) AND NOT t.tgisinternal""",
    "type": """
        SELECT t.typname, string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod), ', ' ORDER BY a.attnum)
        FROM pg_type AS t JOIN pg_class AS c ON c.oid = t.typrelid JOIN pg_attribute AS a ON a.attrelid = c.oid
        WHERE t.typnamespace = 'public'::regnamespace AND c.relkind = 'c' GROUP BY t.typname""",
}

_RELATIONS = r"""
    SELECT array_agg(c.oid) FROM pg_class AS c
    WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')
      AND c.relname !~ '_\d{8}(_|$)' AND c.relname !~ '_upgraded$'
      AND c.relname NOT IN ('tickler_migration', 'tickler_code_file')"""


def snapshot(url: str) -> dict[str, dict[str, Any]]:
    with psycopg.connect(libpq_url(url)) as conn:
        relations = conn.execute(_RELATIONS).fetchone()[0]  # type: ignore[index]
        return {
            kind: dict(conn.execute(query, {"relations": relations}).fetchall()) for kind, query in _OBJECTS.items()
        }


@pytest.fixture
def two_databases(admin_url: str) -> Iterator[tuple[str, ...]]:
    urls = tuple(pg.create_database(admin_url, prefix=prefix) for prefix in ("tickler_schema", "tickler_steps"))
    yield urls
    for url in urls:
        pg.drop_database(admin_url, url)


def test_a_new_database_equals_one_brought_there_by_every_migration(two_databases: tuple[str, ...]) -> None:
    from_schema, from_steps = two_databases
    migrate(from_schema)
    newest = available_migrations()[-1].version
    migrate(from_steps, through=newest)  # every numbered step, one by one, as an upgrade runs them
    migrate(from_steps)  # then the code files
    new, upgraded = snapshot(from_schema), snapshot(from_steps)
    for kind in _OBJECTS:
        assert new[kind], f"no {kind} found"
        only_new = {k: v for k, v in new[kind].items() if upgraded[kind].get(k) != v}
        only_upgraded = {k: v for k, v in upgraded[kind].items() if new[kind].get(k) != v}
        assert only_new == only_upgraded == {}, f"{kind}s differ"


_DEFINITION = re.compile(
    r"^CREATE (?:OR REPLACE )?(FUNCTION|TRIGGER|VIEW) (\w+)\s*(\([^)]*\))?", re.MULTILINE | re.IGNORECASE
)


def _definitions(path: Path) -> list[tuple[str, str, int]]:
    """(kind, name, number of arguments) of each function, trigger and view a file defines."""
    found = []
    for kind, name, arguments in _DEFINITION.findall(path.read_text()):
        count = 0 if not arguments or arguments == "()" else arguments.count(",") + 1
        found.append((kind.upper(), name, count if kind.upper() == "FUNCTION" else 0))
    return found


def test_every_function_trigger_and_view_is_defined_once_in_the_code_files() -> None:
    everywhere = [d for name in CODE_FILES for d in _definitions(DATABASE / name)]
    assert len(everywhere) == len(set(everywhere)), sorted(d for d in everywhere if everywhere.count(d) > 1)
    assert _definitions(DATABASE / "schema.sql") == []
    sql_files = {p.name for p in DATABASE.glob("*.sql")}
    assert sql_files == {*CODE_FILES, "schema.sql"}, "a code file that migrate does not apply"


def test_numbered_migrations_from_now_on_move_tables_and_data_only() -> None:
    for migration in available_migrations():
        if migration.version >= FIRST_STEP_WITHOUT_CODE:
            assert not re.search(r"CREATE (OR REPLACE )?(FUNCTION|TRIGGER|VIEW)", migration.sql, re.IGNORECASE), (
                f"{migration.label} defines code: it belongs in scheduler/database/, edited in place"
            )


# The newest numbered step of the release before this one: its workers keep running while
# `tickler migrate` brings the database to this release (docs/deploy.md, "Upgrading").
PREVIOUS_RELEASE = 74


def test_the_previous_release_keeps_every_function_and_view_it_calls_through_an_upgrade(admin_url: str) -> None:
    """An upgrade runs while the previous release still serves: the code files may change a
    function's body, never take away a function, a signature, a table column or a view column
    that release reads."""
    url = pg.create_database(admin_url, prefix="tickler_previous")
    try:
        migrate(url, through=PREVIOUS_RELEASE)
        before, before_views = snapshot(url), view_columns(url)
        migrate(url)
        after, after_views = snapshot(url), view_columns(url)
    finally:
        pg.drop_database(admin_url, url)
    assert set(before["function"]) - set(after["function"]) == set()
    assert set(before["column"]) - set(after["column"]) == set()
    assert before_views - after_views == set()


def view_columns(url: str) -> set[str]:
    with psycopg.connect(libpq_url(url)) as conn:
        rows = conn.execute(
            "SELECT c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)"
            " FROM pg_attribute AS a JOIN pg_class AS c ON c.oid = a.attrelid"
            " WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'v' AND a.attnum > 0"
        ).fetchall()
    return {row[0] for row in rows}
