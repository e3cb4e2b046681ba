"""The archive job: a round trip through Parquet with crashes injected between its steps."""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from pipeline.archive import ArchiveMismatch, SourceOptions, run_archive
from pipeline.report import Period, run_report
from pipeline.source import Source
from scheduler.store.archive import archived_history
from tests.test_pipeline_support import (
    PERIOD,
    add_queue,
    at,
    check_known_answers,
    known_history,
    pipeline_db,  # noqa: F401 (fixture)
    save,
    spark,  # noqa: F401 (fixture)
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("pipeline_db")]

CUTOFF = at("2026-11-03 00:00:00")  # e1..e10, s1, s2 finished before it; c1, c2, d1, x1 after


class Crash(Exception):
    """Stands for the process dying at that point."""


def crash_at(stage: str) -> Any:
    def hook(reached: str, run_id: int) -> None:
        if reached == stage:
            raise Crash(f"crashed after {stage} of run {run_id}")

    return hook


def one(raw: psycopg.Connection[Any], query: str, *params: Any) -> Any:
    row = raw.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def finished_ids(raw: psycopg.Connection[Any]) -> list[int]:
    return [r[0] for r in raw.execute("SELECT id FROM tickler_event WHERE dequeued_on < %s ORDER BY id", [CUTOFF])]


def archived(spark: Any, location: Path, table: str) -> Any:  # noqa: F811
    return spark.read.parquet(str(location / table))


def report_tables(spark: Any, url: str, out: Path) -> dict[str, Any]:  # noqa: F811
    since, until = (date.fromisoformat(d) for d in PERIOD)
    with Source(spark, url) as source:
        return run_report(spark, source, out, Period(since, until)).tables


def test_archive_survives_a_crash_between_write_and_delete(
    spark: Any,  # noqa: F811
    database_url: str,
    engine: sa.Engine,
    raw: psycopg.Connection[Any],
    tmp_path: Path,
) -> None:
    add_queue(raw, "emails")
    add_queue(raw, "sms")
    save(raw, known_history())
    moving = finished_ids(raw)
    assert len(moving) == 12
    entries = one(raw, "SELECT count(*) FROM tickler_timeline WHERE event_id = ANY(%s)", moving)
    location = tmp_path / "archive"

    with pytest.raises(Crash):
        run_archive(spark, database_url, location=str(location), cutoff=CUTOFF, hook=crash_at("verified"))
    # written and verified, not deleted: everything is still in PostgreSQL
    assert one(raw, "SELECT state FROM tickler_archive_run") == "written"
    assert finished_ids(raw) == moving
    assert archived(spark, location, "events").count() == 12

    # the rerun finishes that run (from the ledger's state: no second write)
    [result] = run_archive(spark, database_url, location=str(location), cutoff=CUTOFF)
    assert (result.run_id, result.resumed, result.events, result.timeline) == (1, True, 12, entries)
    assert finished_ids(raw) == []
    assert one(raw, "SELECT count(*) FROM tickler_timeline WHERE event_id = ANY(%s)", moving) == 0
    assert one(raw, "SELECT count(*) FROM tickler_archive_item") == 0
    assert one(raw, "SELECT state FROM tickler_archive_run") == "deleted"
    # counters follow the delete (tickler_queue_count is kept by triggers)
    assert one(raw, "SELECT sum(n) FROM tickler_queue_count WHERE state = 'delivered'") == 1  # x1

    events = archived(spark, location, "events")
    assert sorted(r["id"] for r in events.select("id").collect()) == moving  # no duplicates, no gaps
    assert archived(spark, location, "timeline").count() == entries
    layout = {(r["queue"], r["date"]) for r in events.select("queue", "date").distinct().collect()}
    assert layout == {("emails", "2026-11-02"), ("sms", "2026-11-02")}
    assert (location / "events" / "run=1" / "queue=emails" / "date=2026-11-02").is_dir()

    # the report reads the archive beside the live tables: the same answers as before
    check_known_answers(report_tables(spark, database_url, tmp_path / "report"))

    # the timeline can say where a key's history went
    e1 = archived_history(engine, "emails", "e1")
    assert e1 is not None
    assert e1["location"] == str(location)
    assert (e1["archived_through"], e1["archived_events"], e1["archive_id"]) == ("2026-11-02T10:00:01Z", 1, 1)
    assert archived_history(engine, "emails", "pending") is None
    assert one(raw, "SELECT count(*) FROM tickler_event WHERE item_key = 'e1'") == 1  # the live one stays

    # nothing left before the cut-off: no new run
    assert run_archive(spark, database_url, location=str(location), cutoff=CUTOFF) == []


def test_a_crash_before_verifying_rewrites_the_run_whole(
    spark: Any,  # noqa: F811
    database_url: str,
    raw: psycopg.Connection[Any],
    tmp_path: Path,
) -> None:
    add_queue(raw, "emails")
    add_queue(raw, "sms")
    save(raw, known_history())
    location = tmp_path / "archive"
    options = SourceOptions(mode="snapshot", partitions=3)
    with pytest.raises(Crash):
        run_archive(spark, database_url, location=str(location), cutoff=CUTOFF, source=options,
                    hook=crash_at("written"))  # fmt: skip
    assert one(raw, "SELECT state FROM tickler_archive_run") == "selected"
    # a half-written retry left a stray file behind in the run's directory
    stray = location / "events" / "run=1" / "queue=emails" / "date=2026-11-02"
    first = next(stray.glob("*.parquet"))
    (stray / "part-stray.parquet").write_bytes(first.read_bytes())
    assert archived(spark, location, "events").count() == 12 + 10

    # the rerun first finishes run 1 with its own cut-off, then moves what finished before the new one
    first_run, second = run_archive(spark, database_url, location=str(location), cutoff=at("2026-11-04 00:00:00"))
    assert (first_run.run_id, first_run.resumed, first_run.events) == (1, True, 12)
    assert (second.run_id, second.events, second.resumed) == (2, 4, False)
    assert archived(spark, location, "events").where("run = '1'").count() == 12
    assert archived(spark, location, "events").count() == 16
    ids = [r["id"] for r in archived(spark, location, "events").select("id").collect()]
    assert len(set(ids)) == 16
    assert one(raw, "SELECT count(*) FROM tickler_event WHERE dequeued_on IS NOT NULL") == 0


def test_nothing_is_deleted_when_the_rows_changed_since_they_were_counted(
    spark: Any,  # noqa: F811
    database_url: str,
    raw: psycopg.Connection[Any],
    tmp_path: Path,
) -> None:
    add_queue(raw, "emails")
    add_queue(raw, "sms")
    ids = save(raw, known_history())
    location = str(tmp_path / "archive")
    with pytest.raises(Crash):
        run_archive(spark, database_url, location=location, cutoff=CUTOFF, hook=crash_at("verified"))
    raw.execute(
        "INSERT INTO tickler_timeline (queue, item_key, event_id, action, actor)"
        " VALUES ('sms', 's1', %s, 'updated', 'x')",
        [ids["s1"]],
    )
    entries = one(raw, "SELECT count(*) FROM tickler_timeline")
    with pytest.raises(ArchiveMismatch, match="nothing deleted"):
        run_archive(spark, database_url, location=location, cutoff=CUTOFF)
    assert one(raw, "SELECT count(*) FROM tickler_timeline") == entries
    assert len(finished_ids(raw)) == 12
    assert one(raw, "SELECT state FROM tickler_archive_run") == "written"


def test_the_timeline_stays_append_only_outside_the_archive(raw: psycopg.Connection[Any]) -> None:
    add_queue(raw, "emails")
    save(raw, known_history()[:1])
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        raw.execute("DELETE FROM tickler_timeline")
