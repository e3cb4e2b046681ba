"""Compaction: merge the small files of each archive partition (queue=/date=) into one, losing no row.

Each archive run adds a file to every partition it touches, so a daily archive leaves many small
files. For a partition with more than one file, its rows are written into one file under a hidden
directory `_compact-<uuid>/` (Spark does not read it) and checked against the files it replaces
(same number of rows, same id sum); then a marker names each file it replaces, `ready` is
created last, and only then are the old files deleted and the new one moved in as
`compact-<uuid>.parquet`. A crash before `ready` leaves the partition as it was (the hidden
directory is removed by the next compaction); after `ready`, the next compaction finishes the swap.
At the end, every archived run is checked against its ledger row, as the archive checks its runs.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from psycopg.rows import dict_row
from pyspark.sql import SparkSession

from tickler.pipeline import db, layout
from tickler.pipeline.archive import ArchiveMismatch, archive_lock, ledger_figures
from tickler.pipeline.spark import PipelineError

_PENDING = "_compact-"


@dataclass(frozen=True)
class CompactResult:
    location: str
    partitions: int  # partitions merged
    files_before: int
    files_after: int
    runs_checked: int


def run_compact(spark: SparkSession, url: str, *, location: str, min_files: int = 2) -> CompactResult:
    """Merge every partition of the archive at `location` holding at least `min_files` files."""
    location = layout.normalize_location(location)
    files = layout.Files(spark)
    merged = before = after = 0
    with db.connect(url, autocommit=True, row_factory=dict_row) as conn, archive_lock(conn):
        if conn.execute(db.q("unfinished_run")).fetchone() is not None:
            raise PipelineError("an archive run is unfinished: run `tickler pipeline archive` first")
        for table in layout.TABLES:
            root = layout.table_root(location, table)
            _finish_pending(files, root)
            for partition, names in files.partition_files(root).items():
                before += len(names)
                if len(names) >= max(min_files, 2):
                    _merge(spark, files, f"{root}/{partition}", names)
                    merged += 1
                    after += 1
                else:
                    after += len(names)
        runs = conn.execute(db.q("archive_runs_at"), {"location": location}).fetchall()
    _check_runs(spark, location, runs)
    return CompactResult(location, merged, before, after, len(runs))


def _merge(spark: SparkSession, files: layout.Files, partition: str, names: list[str]) -> None:
    work = f"{partition}/{_PENDING}{uuid.uuid4().hex}"
    old = spark.read.parquet(*[f"{partition}/{name}" for name in names])
    old = old.drop(*[c for c in ("queue", "date") if c in old.columns])  # they are the directory's
    old.sortWithinPartitions("run", "id").coalesce(1).write.parquet(f"{work}/data")
    figures = [ledger_figures(frame).first() for frame in (old, spark.read.parquet(f"{work}/data"))]
    if figures[0] != figures[1]:
        files.delete(work)
        raise ArchiveMismatch(f"compaction of {partition}: the merged file differs from its files; nothing changed")
    for name in names:
        files.touch(f"{work}/replaces/{name}")
    files.touch(f"{work}/ready")
    _swap(files, partition, work)


def _swap(files: layout.Files, partition: str, work: str) -> None:
    """Delete the files the merged one replaces, move it in, remove the work directory (repeatable)."""
    for name, _ in files.listing(f"{work}/replaces"):
        files.delete(f"{partition}/{name}")
    data = [name for name, is_dir in files.listing(f"{work}/data") if not is_dir and name.endswith(".parquet")]
    for name in data:
        files.rename(f"{work}/data/{name}", f"{partition}/compact-{work.rsplit(_PENDING, 1)[1]}.parquet")
    files.delete(work)


def _finish_pending(files: layout.Files, root: str) -> None:
    """A compaction that died: undo it before `ready`, finish it after."""
    for queue, _ in files.listing(root):
        for day, _ in files.listing(f"{root}/{queue}"):
            partition = f"{root}/{queue}/{day}"
            for name, is_dir in files.listing(partition):
                if is_dir and name.startswith(_PENDING):
                    work = f"{partition}/{name}"
                    if files.exists(f"{work}/ready"):
                        _swap(files, partition, work)
                    else:
                        files.delete(work)


def _check_runs(spark: SparkSession, location: str, runs: list[dict[str, Any]]) -> None:
    """Every archived run's rows are there exactly once: counts and id sums as its ledger row says."""
    for table, count, id_sum in (("events", "event_count", "event_id_sum"),
                                 ("timeline", "timeline_count", "timeline_id_sum")):  # fmt: skip
        frame = layout.read_table(spark, location, table)
        found: dict[int, tuple[int, int, int]] = {}
        if frame is not None:
            figures = ledger_figures(frame, "run").collect()
            found = {int(r["run"]): (r["n"], r["distinct"], int(r["id_sum"])) for r in figures}
        for run in runs:
            expected = (run[count], run[count], int(run[id_sum]))
            got = found.get(run["id"], (0, 0, 0))
            if got != expected:
                raise ArchiveMismatch(f"archive run {run['id']}: {table} files hold {got[0]} rows "
                                      f"({got[1]} distinct ids), the ledger says {run[count]}")  # fmt: skip
