"""The archive's queries keep a safe plan whatever the statistics say, and the pipeline's database
sessions end with the job: a statement timeout, TCP keepalives, and a check for a client gone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from tests.helpers_wait import wait_until
from tests.test_pipeline_support import add_queue
from tickler.pipeline import db as pdb
from tickler.pipeline.archive import run_archive

pytestmark = pytest.mark.usefixtures("pipeline_db")

# The queries that join the run's items to the timeline (the JDBC read, the counts, the delete).
TIMELINE_JOINS = ("source_archive_timeline", "count_run", "delete_run_timeline")


def fill(raw: psycopg.Connection[Any], events: int = 300) -> None:
    """Finished events with three timeline entries each, as the store writes them."""
    add_queue(raw, "emails")
    finished = datetime(2026, 1, 1, tzinfo=UTC)
    raw.execute(
        "INSERT INTO tickler_event (queue, item_key, schedule_on, data, enqueued_on, enqueued_by, dequeued_on,"
        " dequeued_by, outcome, redeliver_count, max_attempts)"
        " SELECT 'emails', 'k' || n, %(at)s, '{}', %(at)s, 'ops', %(at)s, 'w', 'delivered', 0, 5"
        " FROM generate_series(1, %(n)s) AS n",
        {"at": finished, "n": events},
    )
    raw.execute(
        "INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)"
        " SELECT e.queue, e.item_key, e.id, e.dequeued_on, a.action, 'w', e.schedule_on, '{}'"
        " FROM tickler_event_all AS e CROSS JOIN (VALUES ('enqueued'), ('claimed'), ('delivered')) AS a (action)"
    )


def repeated_scans(raw: psycopg.Connection[Any], name: str) -> list[dict[str, Any]]:
    """The plan's scans of the timeline that run once per row of something else (the inner side of
    a nested loop), read as the job runs the query (the run id 1; a source_* relation as a subquery
    filtered on its run, as Spark sends it)."""
    text = pdb.q(name)
    if name.startswith("source_"):
        text = f"SELECT * FROM ({text}) AS src WHERE run_id = %(run_id)s"  # type: ignore[assignment]
    [[plan]] = raw.execute(f"EXPLAIN (FORMAT JSON) {text}", {"run_id": 1}).fetchall()
    found, todo = [], [(plan[0]["Plan"], False)]
    while todo:
        node, repeated = todo.pop()
        if node.get("Relation Name") == "tickler_timeline" and repeated and node["Node Type"] == "Seq Scan":
            found.append(node)
        for child in node.get("Plans", []):
            inner = node["Node Type"] == "Nested Loop" and child.get("Parent Relationship") == "Inner"
            todo.append((child, repeated or inner))
    return found


@pytest.mark.parametrize("name", TIMELINE_JOINS)
def test_the_timeline_is_never_scanned_once_per_item(name: str, raw: psycopg.Connection[Any]) -> None:
    """In one run the JDBC read took ten minutes: the items had no statistics (the planner saw one
    row) and a nested loop over them that scans the timeline for each is then the cheapest plan on
    paper. The joins reach the timeline through its key, so even that plan is an index probe."""
    fill(raw)
    raw.execute(
        "INSERT INTO tickler_archive_run (cutoff, location, event_count, timeline_count, event_id_sum,"
        " timeline_id_sum) VALUES (now(), '/tmp/a', 0, 0, 0, 0)"
    )
    raw.execute("INSERT INTO tickler_archive_item (run_id, event_id) SELECT 1, id FROM tickler_event_all")
    raw.execute("ANALYZE tickler_event_history, tickler_timeline")
    with raw.transaction():
        # the worst statistics shift: only nested loops are left to the planner
        raw.execute("SET LOCAL enable_hashjoin = off")
        raw.execute("SET LOCAL enable_mergejoin = off")
        raw.execute("SET LOCAL tickler.archiving = 'on'")
        scans = repeated_scans(raw, name)
    assert scans == [], json.dumps(scans, indent=1)


def test_a_run_analyses_the_items_it_recorded(database_url: str, raw: psycopg.Connection[Any], tmp_path: Any) -> None:
    fill(raw)

    class Stop(Exception):
        pass

    def stop(stage: str, run_id: int) -> None:
        raise Stop(stage)

    with pytest.raises(Stop):  # the selection needs no Spark
        run_archive(None, database_url, location=str(tmp_path), cutoff=datetime.now(UTC), hook=stop)  # type: ignore[arg-type]
    [(tuples, analysed)] = raw.execute(
        "SELECT c.reltuples, s.last_analyze FROM pg_class AS c JOIN pg_stat_user_tables AS s ON s.relid = c.oid"
        " WHERE c.relname = 'tickler_archive_item'"
    ).fetchall()
    assert analysed is not None and tuples == 300


def test_job_sessions_carry_a_timeout_keepalives_and_a_client_check(database_url: str) -> None:
    with pdb.connect(database_url) as conn:
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings"
                " WHERE name IN ('statement_timeout', 'client_connection_check_interval', 'TimeZone')"
            ).fetchall()
        )
        options = {o.keyword.decode(): o.val for o in conn.pgconn.info}
    assert settings["TimeZone"] == "UTC"
    assert int(settings["statement_timeout"]) > 0
    assert int(settings["client_connection_check_interval"]) > 0
    assert options["keepalives"] == b"1" and options["keepalives_idle"] is not None
    jdbc = pdb.endpoint(database_url).jdbc_url()
    assert "tcpKeepAlive=true" in jdbc and "statement_timeout" in jdbc and "client_connection_check_interval" in jdbc


def test_a_query_dies_with_the_job_that_ran_it(database_url: str, raw: psycopg.Connection[Any]) -> None:
    """After the driver was killed with -9, its queries kept running until terminated by hand."""
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from tickler.pipeline import db; "
         "conn = db.connect(sys.argv[1]); conn.execute(\"SELECT pg_sleep(600) AS tickler_test_sleep\")",
         database_url],
        env={**os.environ},
    )  # fmt: skip
    running = (
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%%tickler_test_sleep%%' AND pid <> pg_backend_pid()"
    )

    def count() -> int:
        [(n,)] = raw.execute(running).fetchall()
        return int(n)

    try:
        wait_until(lambda: count() == 1, timeout=60, what="the child's query to start")
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        wait_until(lambda: count() == 0, timeout=60, what="the query of a killed job to end")
    finally:
        if child.poll() is None:
            child.kill()
        raw.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE query LIKE '%%tickler_test_sleep%%' AND pid <> pg_backend_pid()"
        )


def test_the_statement_timeout_can_be_set(database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TICKLER_PIPELINE_STATEMENT_TIMEOUT", "250ms")
    with pdb.connect(database_url) as conn, pytest.raises(psycopg.errors.QueryCanceled):
        conn.execute("SELECT pg_sleep(5)")
