"""Compaction: merge the small files of each archive partition (queue=/date=) into one, losing no row.

Each archive run adds a file to every partition it touches, so a daily archive leaves many small
files. For a partition with more than one committed file, its rows are written into one file
under a hidden directory `_compact-<uuid>/` (no reader looks there), checked against the files it
replaces (same number of rows, same id sum) and moved into the partition as
`compact-<uuid>.parquet`. Then one new version of the manifest lists the merged files in place of
those they replace, per table: a reader sees either the old files or the merged one, never both
nor neither. The replaced files stay on disk for a while (manifest.RETIRED_GRACE), for readers of
the previous version, and a later job deletes them. A crash before the manifest changed leaves
merged files nobody lists: the next compaction deletes them. At the end, every archived run is
checked against its ledger row, as the archive checks its runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from psycopg.rows import dict_row
from pyspark.sql import SparkSession

from tickler.pipeline import db, layout, manifest
from tickler.pipeline.archive import ArchiveMismatch, archive_lock, ledger_figures, write_checked
from tickler.pipeline.spark import PipelineError

_PENDING = "_compact-"
# Called after a table's partitions were merged ("merged") and once the manifest lists the merged
# files ("published"), with the table's name: tests raise there to simulate a crash, or read.
Hook = Callable[[str, str], None]


@dataclass(frozen=True)
class CompactResult:
    location: str
    partitions: int  # partitions merged
    files_before: int
    files_after: int
    runs_checked: int


def run_compact(
    spark: SparkSession,
    url: str,
    *,
    location: str,
    min_files: int = 2,
    keep_replaced: timedelta = manifest.RETIRED_GRACE,
    hook: Hook | None = None,
) -> CompactResult:
    """Merge every partition of the archive at `location` holding at least `min_files` files."""
    location = layout.normalize_location(location)
    files = layout.Files(spark)
    merged = before = after = 0
    with db.connect(url, autocommit=True, row_factory=dict_row) as conn, archive_lock(conn):
        if db.rows(conn, "unfinished_run"):
            raise PipelineError("an archive run is unfinished: run `tickler pipeline archive` first")
        runs = db.rows(conn, "archive_runs_at", {"location": location})
        current = manifest.reconcile(files, location, runs, None)
        _remove_strays(files, location, current)
        for table in layout.TABLES:
            root = layout.table_root(location, table)
            swaps: dict[str, list[str]] = {}
            for partition, names in _by_partition(current.files[table]).items():
                before += len(names)
                if len(names) >= max(min_files, 2):
                    swaps[_merge(spark, files, root, partition, names)] = [f"{partition}/{n}" for n in names]
                    merged += 1
                    after += 1
                else:
                    after += len(names)
            if swaps:
                if hook:
                    hook("merged", table)
                manifest.replace(files, location, table, swaps)
                if hook:
                    hook("published", table)
        manifest.remove_retired(files, location, keep_replaced)
    _check_runs(spark, location, runs)
    return CompactResult(location, merged, before, after, len(runs))


def _by_partition(names: list[str]) -> dict[str, list[str]]:
    """{"queue=q/date=d": [file names]} of a table's files as the manifest lists them."""
    found: dict[str, list[str]] = {}
    for name in names:
        partition, _, file = name.rpartition("/")
        found.setdefault(partition, []).append(file)
    return found


def _merge(spark: SparkSession, files: layout.Files, root: str, partition: str, names: list[str]) -> str:
    """Write the partition's files as one, checked, beside them (unlisted); its name under `root`."""
    old = spark.read.parquet(*[f"{root}/{partition}/{name}" for name in names])
    old = old.drop(*[c for c in ("queue", "date") if c in old.columns])  # they are the directory's
    return write_checked(
        spark,
        files,
        root,
        partition,
        old,
        old.sortWithinPartitions("run", "id"),
        work_prefix=_PENDING,
        name="compact",
        mismatch=f"compaction of {partition}: the merged file differs from its files; nothing changed",
    )


def _remove_strays(files: layout.Files, location: str, current: manifest.Manifest) -> None:
    """What a compaction that died left: its work directories, and merged files it never published
    (with no run unfinished, a data file neither listed nor retired is one of those)."""
    retired = {entry["path"] for entry in current.retired}
    for table in layout.TABLES:
        root = layout.table_root(location, table)
        listed = set(current.files[table])
        for queue, _ in files.listing(root):
            for day, _ in files.listing(f"{root}/{queue}"):
                partition = f"{queue}/{day}"
                for name, is_dir in files.listing(f"{root}/{partition}"):
                    stray_dir = is_dir and name.startswith(_PENDING)
                    unlisted = name.endswith(".parquet") and f"{partition}/{name}" not in listed
                    if stray_dir or (unlisted and f"{table}/{partition}/{name}" not in retired):
                        files.delete(f"{root}/{partition}/{name}")


def _check_runs(spark: SparkSession, location: str, runs: list[dict[str, Any]]) -> None:
    """Every archived run's rows are there exactly once: counts and id sums as its ledger row says."""
    for table, count, id_sum in (("events", "event_count", "event_id_sum"),
                                 ("timeline", "timeline_count", "timeline_id_sum")):  # fmt: skip
        missing = [path for path in current_paths(spark, location, table) if not layout.Files(spark).exists(path)]
        if missing:
            raise ArchiveMismatch(f"the manifest lists {len(missing)} missing file(s) of {table}, {missing[0]} first")
        frame = manifest.read_committed(spark, location, table)
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


def current_paths(spark: SparkSession, location: str, table: str) -> list[str]:
    current = manifest.read(layout.Files(spark), location)
    return current.paths(location, table) if current else []
