"""Named queries may share text through `-- fragment:` blocks (scheduler/sql.py)."""

from __future__ import annotations

import pytest

from tickler.scheduler.sql import parse_queries

SOURCE = """
-- fragment: tail
-- shared
b AS (SELECT 2 AS y)

-- name: one
WITH a AS (SELECT 1 AS x),
-- include: tail
SELECT * FROM a, b;

-- name: two
WITH a AS (SELECT 3 AS x),
    -- include: tail
SELECT x FROM a;
"""


def test_an_include_becomes_the_fragment_and_a_fragment_is_no_query() -> None:
    queries = parse_queries(SOURCE)
    assert sorted(queries) == ["one", "two"]
    assert queries["one"] == "WITH a AS (SELECT 1 AS x),\n-- shared\nb AS (SELECT 2 AS y)\nSELECT * FROM a, b"
    assert "b AS (SELECT 2 AS y)\nSELECT x FROM a" in queries["two"]


def test_an_unknown_or_twice_defined_fragment_is_refused() -> None:
    with pytest.raises(ValueError, match="not defined"):
        parse_queries("-- name: one\n-- include: nowhere\nSELECT 1")
    with pytest.raises(ValueError, match="defined twice"):
        parse_queries("-- fragment: a\nx\n-- fragment: a\ny\n")
