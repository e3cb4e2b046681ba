"""Where the archive's files are: <location>/{events,timeline}/run=<id>/queue=<q>/date=<yyyy-mm-dd>/."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

TABLES = ("events", "timeline")


def normalize_location(location: str) -> str:
    """A URI (s3a://, hdfs://, file://) as given; a plain path made absolute, so the ledger stays valid."""
    if "://" in location:
        return location.rstrip("/")
    return str(Path(location).expanduser().resolve())


def table_root(location: str, table: str) -> str:
    return f"{location}/{table}"


def run_path(location: str, table: str, run_id: int) -> str:
    """The directory holding everything run `run_id` wrote for `table` (rewritten whole on a rerun)."""
    return f"{table_root(location, table)}/run={run_id}"


def read_runs(spark: SparkSession, runs: list[tuple[int, str]], table: str) -> DataFrame | None:
    """The archived rows of `table` from these (run id, location) pairs, with columns run, queue, date."""
    frames = []
    by_location: dict[str, list[int]] = {}
    for run_id, location in runs:
        by_location.setdefault(location, []).append(run_id)
    for location, ids in by_location.items():
        paths = [run_path(location, table, run_id) for run_id in ids]
        reader = spark.read.option("basePath", table_root(location, table))
        frames.append(reader.parquet(*paths))
    if not frames:
        return None
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return result
