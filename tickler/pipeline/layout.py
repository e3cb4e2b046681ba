"""Where the archive's files are: <location>/{events,timeline}/queue=<q>/date=<yyyy-mm-dd>/*.parquet.

Each row carries its archive run in the column `run`; a file written by a run is named
`run-<id>-...parquet`, so that a rerun of an unfinished run can remove what it placed before. A run
is written under `<table>/_staging/run=<id>/` first (Spark skips directories starting with `_`),
then its files are moved into the partitions. Compaction merges a partition's files into one
(`compact-*.parquet`), rows of several runs together. Which files hold committed data is the
manifest's to say (pipeline/manifest.py): a directory holds files of runs not yet committed, and
files a compaction replaced, for a while.

Files are handled through Hadoop's FileSystem (the one Spark writes with), so a URI such as
`s3a://...` works as a local path does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

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


class Files:
    """The few file operations the archive needs, on Hadoop's FileSystem of each path."""

    def __init__(self, spark: SparkSession) -> None:
        jvm: Any = spark.sparkContext._jvm
        self._jvm = jvm
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

    def read_text(self, path: str) -> str:
        fs, p = self._fs(path)
        stream = fs.open(p)
        try:
            jvm: Any = self._jvm
            return str(jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def write_text(self, path: str, text: str) -> None:
        """A whole new file (an existing one is an error)."""
        fs, p = self._fs(path)
        fs.mkdirs(p.getParent())
        stream = fs.create(p, False)
        try:
            stream.write(bytearray(text.encode()))
        finally:
            stream.close()

    def touch(self, path: str) -> None:
        """An empty file (a marker)."""
        fs, p = self._fs(path)
        fs.create(p, True).close()


def _visible(name: str) -> bool:
    """A data file Spark reads (it skips names starting with `_` or `.`, and Hadoop's .crc files)."""
    return name.endswith(".parquet") and not name.startswith(("_", "."))
