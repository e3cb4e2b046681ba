"""Where the archive's files are: <location>/{events,timeline}/queue=<q>/date=<yyyy-mm-dd>/*.parquet.

Each row carries its archive run in the column `run`; a file written by a run is named
`run-<id>-...parquet`, so that a rerun of an unfinished run can remove what it placed before. A run
is written under `<table>/_staging/run=<id>/` first (Spark skips directories starting with `_`),
then its files are moved into the partitions. Compaction merges a partition's files into one
(`compact-*.parquet`), rows of several runs together.

Files are handled through Hadoop's FileSystem (the one Spark writes with), so a URI such as
`s3a://...` works as a local path does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

TABLES = ("events", "timeline")
STAGING = "_staging"


def normalize_location(location: str) -> str:
    """A URI (s3a://, hdfs://, file://) as given; a plain path made absolute, so the ledger stays valid."""
    if "://" in location:
        return location.rstrip("/")
    return str(Path(location).expanduser().resolve())


def table_root(location: str, table: str) -> str:
    return f"{location}/{table}"


def staging_path(location: str, table: str, run_id: int) -> str:
    """Where run `run_id` writes `table` before its files move into the partitions (rewritten whole)."""
    return f"{table_root(location, table)}/{STAGING}/run={run_id}"


def run_prefix(run_id: int) -> str:
    """How the files a run placed are named (a rerun of the run removes them first)."""
    return f"run-{run_id}-"


def read_table(spark: SparkSession, location: str, table: str) -> DataFrame | None:
    """Every archived row of `table` at `location` (columns run, queue, date among them); None if empty."""
    files = Files(spark)
    root = table_root(location, table)
    if not files.exists(root) or not files.partition_files(root):
        return None
    return spark.read.parquet(root)


def read_runs(spark: SparkSession, runs: list[tuple[int, str]], table: str) -> DataFrame | None:
    """The archived rows of `table` of these (run id, location) pairs, with columns run, queue, date."""
    by_location: dict[str, list[int]] = {}
    for run_id, location in runs:
        by_location.setdefault(location, []).append(run_id)
    frames = []
    for location, ids in by_location.items():
        frame = read_table(spark, location, table)
        if frame is not None:
            frames.append(frame.where(F.col("run").isin(ids)))
    if not frames:
        return None
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return result


class Files:
    """The few file operations the archive needs, on Hadoop's FileSystem of each path."""

    def __init__(self, spark: SparkSession) -> None:
        jvm: Any = spark.sparkContext._jvm
        self._path = jvm.org.apache.hadoop.fs.Path
        self._conf = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]

    def _fs(self, path: str) -> tuple[Any, Any]:
        hadoop_path = self._path(path)
        return hadoop_path.getFileSystem(self._conf), hadoop_path

    def exists(self, path: str) -> bool:
        fs, p = self._fs(path)
        return bool(fs.exists(p))

    def listing(self, path: str) -> list[tuple[str, bool]]:
        """(name, is a directory) of what `path` holds; empty when it does not exist."""
        fs, p = self._fs(path)
        if not fs.exists(p):
            return []
        return [(str(s.getPath().getName()), bool(s.isDirectory())) for s in fs.listStatus(p)]

    def partition_files(self, root: str) -> dict[str, list[str]]:
        """{"queue=q/date=d": [file names]} of the visible Parquet files under a table's root."""
        found: dict[str, list[str]] = {}
        for queue, is_dir in self.listing(root):
            if not is_dir or not queue.startswith("queue="):
                continue
            for day, day_is_dir in self.listing(f"{root}/{queue}"):
                if day_is_dir and day.startswith("date="):
                    names = [n for n, d in self.listing(f"{root}/{queue}/{day}") if not d and _visible(n)]
                    if names:
                        found[f"{queue}/{day}"] = sorted(names)
        return found

    def rename(self, source: str, target: str) -> None:
        fs, src = self._fs(source)
        dst = self._path(target)
        fs.mkdirs(dst.getParent())
        if not fs.rename(src, dst):
            raise OSError(f"could not move {source} to {target}")

    def delete(self, path: str) -> None:
        fs, p = self._fs(path)
        fs.delete(p, True)

    def touch(self, path: str) -> None:
        """An empty file (a marker)."""
        fs, p = self._fs(path)
        fs.create(p, True).close()


def _visible(name: str) -> bool:
    """A data file Spark reads (it skips names starting with `_` or `.`, and Hadoop's .crc files)."""
    return name.endswith(".parquet") and not name.startswith(("_", "."))
