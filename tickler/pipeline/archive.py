"""The archive: move finished events and their timeline out of PostgreSQL into Parquet, losing nothing.

A run goes through the states of its ledger row (tickler_archive_run):
  selected  the run's event ids are recorded (tickler_archive_item) with counts and id sums;
  written   its files were written (its earlier files removed, then written whole under a staging
            directory and moved into the queue=/date= partitions) and read back matching;
  deleted   its rows were deleted from PostgreSQL in one transaction that checked the counts;
then it is committed to the archive's manifest (pipeline/manifest.py): readers see it, whole.
Each step is redone from the recorded state after a crash: a rerun finishes the unfinished run
(same ids, so the same rows in the same place) before it starts a new one, and commits a deleted
run the manifest lacks.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

import psycopg
from psycopg.rows import dict_row
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from tickler.pipeline import db, layout, manifest
from tickler.pipeline.source import ARCHIVE_EVENTS, ARCHIVE_TIMELINE, Source
from tickler.pipeline.spark import PipelineError

# Stages after which `hook` is called: tests raise there to simulate a crash.
STAGES = ("selected", "written", "verified", "deleted", "committed")
Hook = Callable[[str, int], None]
# Given the primary's connection, the URL to read a run's rows from.
ReadFrom = Callable[[psycopg.Connection[Any]], str]


class ArchiveMismatch(RuntimeError):
    """What was read back (or would be deleted) differs from the run's ledger: nothing is deleted."""


@dataclass(frozen=True)
class RunResult:
    run_id: int
    location: str
    cutoff: datetime
    events: int
    timeline: int
    resumed: bool


@dataclass(frozen=True)
class SourceOptions:
    mode: str = "auto"
    jar: str | None = None
    partitions: int | None = None
    staging_dir: str | None = None


def run_archive(
    spark: SparkSession,
    url: str,
    *,
    location: str,
    cutoff: datetime,
    limit: int | None = None,
    source: SourceOptions = SourceOptions(),  # frozen: one default for every call is safe
    hook: Hook | None = None,
    read_from: ReadFrom | None = None,
) -> list[RunResult]:
    """Finish an unfinished run if a crash left one, then archive what finished before `cutoff`.
    `read_from(conn)`: the URL to read a run's rows from (a replica that has replayed the run's
    selection, pipeline/replica.py), given the primary's connection; default `url`."""
    results = []
    with db.connect(url, autocommit=True, row_factory=dict_row) as conn, archive_lock(conn):
        reads = read_from or (lambda _conn: url)
        unfinished = db.rows(conn, "unfinished_run")
        if unfinished:
            results.append(_finish(spark, reads, conn, unfinished[0], source, hook, resumed=True))
        run = _select(conn, layout.normalize_location(location), cutoff, limit)
        if run is not None:
            if hook:
                hook("selected", run["id"])
            results.append(_finish(spark, reads, conn, run, source, hook, resumed=False))
    return results


@contextmanager
def archive_lock(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """One job at a time changes the archive (archive runs, compaction)."""
    locked = db.rows(conn, "archive_lock", tuples=True)
    if not locked or not locked[0][0]:
        raise PipelineError("another archive job holds the archive lock; try again when it has finished")
    try:
        yield
    finally:
        db.rows(conn, "archive_unlock")


def _select(conn: psycopg.Connection[Any], location: str, cutoff: datetime, limit: int | None) -> Any:
    """Record a new run with its fixed set of events; None when nothing is old enough."""
    with conn.transaction() as tx:
        [created] = db.rows(conn, "create_run", {"cutoff": cutoff, "location": location})
        run_id = created["id"]
        db.rows(conn, "select_run_events", {"run_id": run_id, "cutoff": cutoff, "limit": limit})
        [run] = db.rows(conn, "count_run", {"run_id": run_id})
        if run["event_count"] == 0:
            raise psycopg.Rollback(tx)  # nothing to archive: leave no empty run in the ledger
    if not run["event_count"]:
        return None
    db.rows(conn, "analyze_items")
    return run


def _finish(
    spark: SparkSession,
    reads: ReadFrom,
    conn: psycopg.Connection[Any],
    run: dict[str, Any],
    source: SourceOptions,
    hook: Hook | None,
    *,
    resumed: bool,
) -> RunResult:
    run_id = run["id"]
    reconcile(spark, conn, run["location"], unfinished=run_id)
    if run["state"] == "selected" or not _matches(spark, run):
        _write(spark, reads(conn), run, source)
        if hook:
            hook("written", run_id)
        if not _matches(spark, run):
            raise ArchiveMismatch(f"archive run {run_id}: the files read back differ from the ledger; nothing deleted")
        db.rows(conn, "mark_written", {"run_id": run_id})
    if hook:
        hook("verified", run_id)
    _delete(conn, run)
    if hook:
        hook("deleted", run_id)
    manifest.commit_runs(layout.Files(spark), run["location"], [run])
    if hook:
        hook("committed", run_id)
    return RunResult(
        run_id=run_id,
        location=run["location"],
        cutoff=run["cutoff"],
        events=run["event_count"],
        timeline=run["timeline_count"],
        resumed=resumed,
    )


def _write(spark: SparkSession, url: str, run: dict[str, Any], options: SourceOptions) -> None:
    """(Re)write the run's directories whole, from the rows its ledger names."""
    bounds = (run["min_event_id"], run["max_event_id"])
    only_run = {"run_id": run["id"]}
    with (
        Source(spark, url, mode=options.mode, jar=options.jar, partitions=options.partitions,
               staging_dir=options.staging_dir) as src,
        ThreadPoolExecutor(max_workers=2) as pool,
    ):  # fmt: skip
        writes = [
            pool.submit(_write_table, spark, src.read(relation, bounds, only_run), run, table)
            for relation, table in ((ARCHIVE_EVENTS, "events"), (ARCHIVE_TIMELINE, "timeline"))
        ]
        for write in writes:
            write.result()


def _write_table(spark: SparkSession, frame: DataFrame, run: dict[str, Any], table: str) -> None:
    """Remove what an earlier attempt of the run placed, write the run whole, move its files in."""
    files = layout.Files(spark)
    root = layout.table_root(run["location"], table)
    prefix = layout.run_prefix(run["id"])
    for partition, names in files.partition_files(root).items():
        for name in names:
            if name.startswith(prefix):
                files.delete(f"{root}/{partition}/{name}")
    staging = layout.staging_path(run["location"], table, run["id"])
    (
        frame.select(F.col("run_id").cast("long").alias("run"), *[c for c in frame.columns if c != "run_id"])
        .repartition("queue", "date")  # one file per queue and day
        .sortWithinPartitions("queue", "date", "id")
        .write.mode("overwrite")
        .partitionBy("queue", "date")
        .parquet(staging)
    )
    for partition, names in files.partition_files(staging).items():
        for name in names:
            files.rename(f"{staging}/{partition}/{name}", f"{root}/{partition}/{prefix}{name}")
    files.delete(staging)


def _matches(spark: SparkSession, run: dict[str, Any]) -> bool:
    """The run's files hold exactly its rows: same counts, no duplicate ids, same id sums."""
    expected = {
        "events": (run["event_count"], run["event_id_sum"]),
        "timeline": (run["timeline_count"], run["timeline_id_sum"]),
    }
    with ThreadPoolExecutor(max_workers=2) as pool:
        found = dict(zip(expected, pool.map(partial(_read_back, spark, run), expected), strict=True))
    return all(found[table] == (count, int(id_sum)) for table, (count, id_sum) in expected.items())


def reconcile(spark: SparkSession, conn: psycopg.Connection[Any], location: str, unfinished: int | None) -> None:
    """Bring the manifest at `location` up to the ledger (the caller holds the archive lock)."""
    runs = db.rows(conn, "archive_runs_at", {"location": location})
    manifest.reconcile(layout.Files(spark), location, runs, unfinished)


def _read_back(spark: SparkSession, run: dict[str, Any], table: str) -> tuple[int, int] | None:
    """(rows, sum of ids) of a table of the run's files; None when a file is missing or an id repeats."""
    names = manifest.run_files(layout.Files(spark), run["location"], run["id"])[table]
    frame = manifest.read_files(spark, run["location"], table, names)
    if frame is None:  # no files yet (a crash before the write)
        return None
    found = ledger_figures(frame.where(F.col("run") == run["id"])).first()
    if found is None or found["n"] != found["distinct"]:
        return None
    return int(found["n"]), int(found["id_sum"])


def ledger_figures(frame: DataFrame, *by: str) -> DataFrame:
    """What the ledger records of a run's rows: their number (n), distinct ids and id sum (by `by`)."""
    return frame.groupBy(*by).agg(
        F.count("*").alias("n"),
        F.countDistinct("id").alias("distinct"),
        F.coalesce(F.sum(F.col("id").cast("decimal(38,0)")), F.lit(0)).alias("id_sum"),
    )


def write_checked(
    spark: SparkSession,
    files: layout.Files,
    root: str,
    partition: str,
    old: DataFrame,
    new: DataFrame,
    *,
    work_prefix: str,
    name: str,
    mismatch: str,
) -> str:
    """Write `new` as one file of `partition` (under `root`), beside the files it stands for and
    unlisted until the manifest says so, once it holds the rows `old` holds (else ArchiveMismatch
    `mismatch`, and nothing is left); its name under `root`, `{partition}/{name}-{key}.parquet`.
    It is written in a work directory named `work_prefix` + key, which a pass that dies leaves for
    the next to remove."""
    key = uuid.uuid4().hex
    work = f"{root}/{partition}/{work_prefix}{key}"
    new.coalesce(1).write.parquet(f"{work}/data")
    figures = [ledger_figures(frame).first() for frame in (old, spark.read.parquet(f"{work}/data"))]
    if figures[0] != figures[1]:
        files.delete(work)
        raise ArchiveMismatch(mismatch)
    [data] = [n for n, is_dir in files.listing(f"{work}/data") if not is_dir and n.endswith(".parquet")]
    target = f"{partition}/{name}-{key}.parquet"
    files.rename(f"{work}/data/{data}", f"{root}/{target}")
    files.delete(work)
    return target


def _delete(conn: psycopg.Connection[Any], run: dict[str, Any]) -> None:
    """Delete exactly the run's rows in one transaction, or nothing if the counts do not match."""
    run_id = run["id"]
    with conn.transaction():
        conn.execute("SELECT set_config('tickler.archiving', 'on', true)")
        if not db.rows(conn, "lock_run", {"run_id": run_id}):
            raise ArchiveMismatch(f"archive run {run_id} is not in state 'written'; nothing deleted")
        # the rows deleted from tickler_timeline and the deliveries whose entry is their history row
        found = db.rows(conn, "delete_run_timeline", {"run_id": run_id})
        timeline = int(found[0]["entries"]) if found else 0
        db.rows(conn, "record_archived_keys", {"run_id": run_id})
        events = db.rowcount(conn, "delete_run_events", {"run_id": run_id})
        if (events, timeline) != (run["event_count"], run["timeline_count"]):
            raise ArchiveMismatch(
                f"archive run {run_id}: would delete {events} events and {timeline} timeline entries, "
                f"the ledger says {run['event_count']} and {run['timeline_count']}; nothing deleted"
            )
        db.rows(conn, "delete_run_items", {"run_id": run_id})
        db.rows(conn, "mark_deleted", {"run_id": run_id})
    db.rows(conn, "analyze_after_delete")
