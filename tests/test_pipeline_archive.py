"""The archive job: a round trip through Parquet with crashes injected between its steps."""

from __future__ import annotations

import json
import shutil
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from tests.test_pipeline_support import (
    PERIOD,
    add_queue,
    at,
    check_known_answers,
    known_history,
    save,
)
from tickler.pipeline import manifest
from tickler.pipeline.archive import ArchiveMismatch, SourceOptions, run_archive
from tickler.pipeline.compact import run_compact
from tickler.pipeline.period import Period
from tickler.pipeline.report import run_report
from tickler.pipeline.source import Source
from tickler.scheduler.store.archive import archived_history

# A busy 2-core machine: starting Spark and a report over the archive can take two minutes, and a
# timeout in the middle of a Spark call leaves the shared session unusable for every later test.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("pipeline_db"), pytest.mark.timeout(300)]

CUTOFF = at("2026-11-03 00:00:00")  # e1..e10, s1, s2 finished before it; c1, c2, d1, x1 after


class Crash(Exception):
    """Stands for the process dying at that point."""


def crash_at(stage: str) -> Any:
    def hook(reached: str, which: Any) -> None:
        if reached == stage:
            raise Crash(f"crashed after {stage} of {which}")

    return hook


def one(raw: psycopg.Connection[Any], query: str, *params: Any) -> Any:
    row = raw.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def finished_ids(raw: psycopg.Connection[Any]) -> list[int]:
    return [r[0] for r in raw.execute("SELECT id FROM tickler_event_all WHERE dequeued_on < %s ORDER BY id", [CUTOFF])]


def archived(spark: Any, location: Path, table: str) -> Any:
    """What a reader of the manifest sees: the committed rows."""
    frame = manifest.read_committed(spark, str(location), table)
    return frame if frame is not None else spark.createDataFrame([], "id long, run long, queue string, date string")


def on_disk(spark: Any, location: Path, table: str) -> Any:
    """What a reader listing the directories sees (committed or not)."""
    return spark.read.parquet(str(location / table))


def committed_files(location: Path) -> list[Path]:
    """The files the newest manifest lists."""
    newest = sorted((location / "_manifest").glob("v-*.json"))[-1]
    listed = json.loads(newest.read_text())["files"]
    return sorted(location / table / name for table in ("events", "timeline") for name in listed[table])


@pytest.fixture
def history(raw: psycopg.Connection[Any]) -> dict[str, int]:
    """The known history in two queues, saved; its events' ids by key."""
    add_queue(raw, "emails")
    add_queue(raw, "sms")
    return save(raw, known_history())


def report_tables(spark: Any, url: str, out: Path) -> dict[str, Any]:
    since, until = (date.fromisoformat(d) for d in PERIOD)
    with Source(spark, url) as source:
        return run_report(spark, source, out, Period(since, until)).tables


@pytest.mark.usefixtures("history")
def test_archive_survives_a_crash_between_write_and_delete(
    spark: Any, database_url: str, engine: sa.Engine, raw: psycopg.Connection[Any], tmp_path: Path
) -> None:
    moving = finished_ids(raw)
    assert len(moving) == 12
    entries = one(raw, "SELECT count(*) FROM tickler_timeline WHERE event_id = ANY(%s)", moving)
    location = tmp_path / "archive"

    with pytest.raises(Crash):
        run_archive(spark, database_url, location=str(location), cutoff=CUTOFF, hook=crash_at("verified"))
    # written and verified, not deleted: everything is still in PostgreSQL, and readers of the
    # archive do not see the run yet
    assert one(raw, "SELECT state FROM tickler_archive_run") == "written"
    assert finished_ids(raw) == moving
    assert on_disk(spark, location, "events").count() == 12
    assert archived(spark, location, "events").count() == 0

    analysed = one(raw, "SELECT analyze_count FROM pg_stat_user_tables WHERE relname = 'tickler_event_history'")
    # the rerun finishes that run (from the ledger's state: no second write)
    [result] = run_archive(spark, database_url, location=str(location), cutoff=CUTOFF)
    assert (result.run_id, result.resumed, result.events, result.timeline) == (1, True, 12, entries)
    assert finished_ids(raw) == []
    assert one(raw, "SELECT count(*) FROM tickler_timeline WHERE event_id = ANY(%s)", moving) == 0
    assert one(raw, "SELECT count(*) FROM tickler_archive_item") == 0
    assert one(raw, "SELECT state FROM tickler_archive_run") == "deleted"
    # the planner's statistics are taken again once the history is gone (not left to autovacuum)
    assert one(raw, "SELECT analyze_count FROM pg_stat_user_tables WHERE relname = 'tickler_event_history'") > analysed
    # counters follow the delete (tickler_queue_count is kept by triggers)
    assert one(raw, "SELECT sum(n) FROM tickler_queue_count WHERE state = 'delivered'") == 1  # x1

    events = archived(spark, location, "events")
    assert sorted(r["id"] for r in events.select("id").collect()) == moving  # no duplicates, no gaps
    assert archived(spark, location, "timeline").count() == entries
    layout = {(r["queue"], r["date"]) for r in events.select("queue", "date").distinct().collect()}
    assert layout == {("emails", "2026-11-02"), ("sms", "2026-11-02")}
    # queue and day are directories, the run a column: a read of one day lists no other day's files
    assert (location / "events" / "queue=emails" / "date=2026-11-02").is_dir()
    assert {r["run"] for r in events.select("run").distinct().collect()} == {1}

    # the report reads the archive beside the live tables: the same answers as before
    check_known_answers(report_tables(spark, database_url, tmp_path / "report"))

    # the timeline can say where a key's history went
    e1 = archived_history(engine, "emails", "e1")
    assert e1 is not None
    assert e1["location"] == str(location)
    assert (e1["archived_through"], e1["archived_events"], e1["archive_id"]) == ("2026-11-02T10:00:01Z", 1, 1)
    assert archived_history(engine, "emails", "pending") is None
    assert one(raw, "SELECT count(*) FROM tickler_event_all WHERE item_key = 'e1'") == 1  # the live one stays

    # nothing left before the cut-off: no new run
    assert run_archive(spark, database_url, location=str(location), cutoff=CUTOFF) == []


@pytest.mark.usefixtures("history")
def test_a_crash_before_verifying_rewrites_the_run_whole(
    spark: Any, database_url: str, raw: psycopg.Connection[Any], tmp_path: Path
) -> None:
    location = tmp_path / "archive"
    options = SourceOptions(mode="snapshot", partitions=3)
    with pytest.raises(Crash):
        run_archive(spark, database_url, location=str(location), cutoff=CUTOFF, source=options,
                    hook=crash_at("written"))  # fmt: skip
    assert one(raw, "SELECT state FROM tickler_archive_run") == "selected"
    # a half-written retry left a stray file behind in the run's directory
    stray = location / "events" / "queue=emails" / "date=2026-11-02"
    first = next(stray.glob("run-1-*.parquet"))
    (stray / "run-1-part-stray.parquet").write_bytes(first.read_bytes())
    assert on_disk(spark, location, "events").count() == 12 + 10

    # the rerun first finishes run 1 with its own cut-off, then moves what finished before the new one
    first_run, second = run_archive(spark, database_url, location=str(location), cutoff=at("2026-11-04 00:00:00"))
    assert (first_run.run_id, first_run.resumed, first_run.events) == (1, True, 12)
    assert (second.run_id, second.events, second.resumed) == (2, 4, False)
    assert archived(spark, location, "events").where("run = '1'").count() == 12
    assert archived(spark, location, "events").count() == 16
    ids = [r["id"] for r in archived(spark, location, "events").select("id").collect()]
    assert len(set(ids)) == 16
    assert one(raw, "SELECT count(*) FROM tickler_event_all WHERE dequeued_on IS NOT NULL") == 0


def test_nothing_is_deleted_when_the_rows_changed_since_they_were_counted(
    spark: Any, database_url: str, raw: psycopg.Connection[Any], tmp_path: Path, history: dict[str, int]
) -> None:
    location = str(tmp_path / "archive")
    with pytest.raises(Crash):
        run_archive(spark, database_url, location=location, cutoff=CUTOFF, hook=crash_at("verified"))
    raw.execute(
        "INSERT INTO tickler_timeline (queue, item_key, event_id, action, actor)"
        " VALUES ('sms', 's1', %s, 'updated', 'x')",
        [history["s1"]],
    )
    entries = one(raw, "SELECT count(*) FROM tickler_timeline")
    with pytest.raises(ArchiveMismatch, match="nothing deleted"):
        run_archive(spark, database_url, location=location, cutoff=CUTOFF)
    assert one(raw, "SELECT count(*) FROM tickler_timeline") == entries
    assert len(finished_ids(raw)) == 12
    assert one(raw, "SELECT state FROM tickler_archive_run") == "written"


@pytest.mark.usefixtures("history")
def test_compaction_merges_each_partition_and_keeps_every_row_once(
    spark: Any, database_url: str, raw: psycopg.Connection[Any], tmp_path: Path
) -> None:
    location = tmp_path / "archive"
    # three runs of at most 4 events: several files in each partition
    for _ in range(3):
        run_archive(spark, database_url, location=str(location), cutoff=CUTOFF, limit=4)
    moved = {r["id"] for r in archived(spark, location, "events").select("id").collect()}
    assert len(moved) == 12 and one(raw, "SELECT count(*) FROM tickler_archive_run") == 3
    entries = archived(spark, location, "timeline").count()
    before = committed_files(location)
    assert len(before) > 4  # 2 tables x 2 partitions, more than one file in some

    # a compaction that dies once its merged files are in place, before the manifest lists them
    with pytest.raises(Crash):
        run_compact(spark, database_url, location=str(location), hook=crash_at("merged"))
    assert committed_files(location) == before  # nothing a reader sees changed
    assert list(location.rglob("compact-*.parquet"))  # the unlisted merged files of the crash
    result = run_compact(spark, database_url, location=str(location))
    assert (result.files_after, result.runs_checked) == (4, 3)
    after = committed_files(location)
    assert len(after) == 4 and any(p.name.startswith("compact-") for p in after)  # one file a partition
    # the crash's merged files are gone; the replaced files stay a while for readers of the old version
    assert sorted(location.rglob("compact-*.parquet")) == [p for p in after if p.name.startswith("compact-")]
    assert all(p.exists() for p in before)
    assert not list(location.rglob("_compact-*"))
    events = archived(spark, location, "events")
    assert sorted(r["id"] for r in events.select("id").collect()) == sorted(moved)
    assert archived(spark, location, "timeline").count() == entries
    assert {r["run"] for r in events.select("run").distinct().collect()} == {1, 2, 3}
    check_known_answers(report_tables(spark, database_url, tmp_path / "report"))

    # once their grace is over, a later job deletes the replaced files
    run_compact(spark, database_url, location=str(location), keep_replaced=timedelta(0))
    assert not any(p.exists() for p in set(before) - set(after)) and committed_files(location) == after

    # the ledger checks see a lost file
    after[0].unlink()
    with pytest.raises(ArchiveMismatch, match="missing"):
        run_compact(spark, database_url, location=str(location))


def test_the_timeline_stays_append_only_outside_the_archive(raw: psycopg.Connection[Any]) -> None:
    add_queue(raw, "emails")
    save(raw, known_history()[:1])
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        raw.execute("DELETE FROM tickler_timeline")


def read_like_an_outsider(spark: Any, location: Path) -> tuple[dict[str, Any], dict[str, list[tuple[int, int]]]]:
    """docs/pipeline.md's recipe, with nothing of tickler: the newest manifest, then exactly its files
    with a plain Parquet reader. Returns the manifest and (run, id) of every row of each table."""
    versions = sorted((location / "_manifest").glob("v-*.json"))
    if not versions:
        return {"runs": []}, {"events": [], "timeline": []}
    listed = json.loads(versions[-1].read_text())
    rows = {}
    for table in ("events", "timeline"):
        paths = [str(location / table / name) for name in listed["files"][table]]
        frame = spark.read.parquet(*paths).select("run", "id") if paths else None
        rows[table] = [(r["run"], r["id"]) for r in frame.collect()] if frame is not None else []
    return listed, rows


@pytest.mark.usefixtures("history")
def test_a_reader_sees_whole_runs_only_during_archive_runs_and_a_compaction(
    spark: Any, database_url: str, raw: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """At every step of three archive runs and of a compaction, a reader of the archive sees whole
    runs whose rows have left PostgreSQL, each row once: never a run half-moved, rows still live,
    or a compacted partition twice or not at all."""
    location = tmp_path / "archive"
    seen: list[tuple[str, list[int]]] = []

    def check(stage: str, which: Any) -> None:
        listed, rows = read_like_an_outsider(spark, location)
        runs = sorted(int(r["run"]) for r in listed["runs"])
        for table, figure in (("events", "event_count"), ("timeline", "timeline_count")):
            assert len(rows[table]) == len(set(rows[table])), f"{stage}: a {table} row twice"
            assert sorted({run for run, _ in rows[table]}) == runs, f"{stage}: rows of runs not listed"
            for run in runs:
                ledger = one(raw, f"SELECT {figure} FROM tickler_archive_run WHERE id = %s", run)
                assert sum(1 for r, _ in rows[table] if r == run) == ledger, f"{stage}: run {run} partial"
        if runs:  # every run a reader sees has left PostgreSQL
            assert one(raw, "SELECT count(*) FROM tickler_archive_run WHERE id = ANY(%s) AND state = 'deleted'",
                       runs) == len(runs)  # fmt: skip
            ids = [i for _, i in rows["events"]]
            assert one(raw, "SELECT count(*) FROM tickler_event WHERE id = ANY(%s)", ids) == 0
        seen.append((stage, runs))

    for _ in range(3):
        run_archive(spark, database_url, location=str(location), cutoff=CUTOFF, limit=4, hook=check)
    run_compact(spark, database_url, location=str(location), hook=check)
    assert [runs for stage, runs in seen if stage == "committed"] == [[1], [1, 2], [1, 2, 3]]
    assert [runs for stage, runs in seen if stage in ("merged", "published")] == [[1, 2, 3]] * 4
    assert {stage for stage, _ in seen} == {"selected", "written", "verified", "deleted", "committed", "merged",
                                            "published"}  # fmt: skip


@pytest.mark.usefixtures("history")
def test_an_archive_from_before_manifests_gets_one_and_a_half_done_compaction_is_finished(
    spark: Any, database_url: str, tmp_path: Path
) -> None:
    location = tmp_path / "archive"
    for _ in range(2):
        run_archive(spark, database_url, location=str(location), cutoff=CUTOFF, limit=4)
    moved = sorted(r["id"] for r in archived(spark, location, "events").select("id").collect())
    shutil.rmtree(location / "_manifest")  # as the release before manifests left it
    # ... with a compaction of that release that died after its `ready` marker, mid-swap
    partition = location / "events" / "queue=emails" / "date=2026-11-02"
    olds = sorted(partition.glob("run-*.parquet"))
    assert len(olds) == 2
    work = partition / "_compact-0123abcd"
    merged = spark.read.parquet(*[str(p) for p in olds])
    merged.coalesce(1).write.parquet(str(work / "data"))
    for old in olds:
        (work / "replaces").mkdir(exist_ok=True)
        (work / "replaces" / old.name).touch()
    (work / "ready").touch()
    olds[0].unlink()

    result = run_compact(spark, database_url, location=str(location))
    assert result.runs_checked == 2  # every run whole, as its ledger row says
    assert sorted(r["id"] for r in archived(spark, location, "events").select("id").collect()) == moved
    assert not work.exists() and not olds[1].exists()
