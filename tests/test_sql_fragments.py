"""Named queries may share text through `-- fragment:` blocks (scheduler/sql.py)."""

from __future__ import annotations

import re

import pytest

from tickler.scheduler.migrate import available_migrations
from tickler.scheduler.sql import parse_queries, sources

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


def test_the_two_claims_share_their_end_word_for_word() -> None:
    """claim_events_round_robin and tickler_claim_events() (migration 0067, which holds
    claim_events' statement; its latest definition) end expired leases, claim and log in one text: the fragment's, with
    the function's parameters for the query's."""
    found = sources()
    assert "claim_ended_leases" not in found
    shared = parse_queries("-- fragment: f\n" + _fragment_text() + "\n-- name: q\n-- include: f\n")["q"]
    assert shared in found["claim_events_round_robin"]
    assert "-- include:" not in found["claim_events_round_robin"]
    as_function = shared.replace("CAST(:now AS timestamptz)", "p_now").replace("CAST(:flow AS boolean)", "p_flow")
    for name in ("queue", "worker", "limit", "lease_seconds"):
        as_function = re.sub(rf"(?<!:):{name}\b", f"p_{name}", as_function)
    claim = [m for m in available_migrations() if "FUNCTION tickler_claim_events(" in m.sql][-1]  # the latest
    assert claim.version >= 67
    assert _code(as_function) in _code(claim.sql)


def _code(sql: str) -> str:
    """The SQL without its comments, its white space folded."""
    return " ".join(re.sub(r"--[^\n]*", "", sql).split())


def _fragment_text() -> str:
    from importlib import resources

    text = resources.files("tickler.scheduler").joinpath("queries.sql").read_text(encoding="utf-8")
    start = text.index("-- fragment: claim_ended_leases\n") + len("-- fragment: claim_ended_leases\n")
    return text[start : text.index("-- name: ", start)]
