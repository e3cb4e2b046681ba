"""Bulk import: schedule events from CSV or Parquet, checked with the API's rules, loaded set-based.

Spark reads the file and numbers its rows; rows are spread over partitions by (queue, item_key),
so the later rows of a key already seen are found without a second pass. Each partition then,
in one transaction of its own, validates its rows (pipeline.validate), COPYs the good ones into a
temporary staging table and inserts them with one INSERT ... ON CONFLICT on the open-key index,
writing their timeline entries in the same statement (pipeline/queries.sql: import_insert,
import_upsert). Bad rows, later duplicates and refused conflicts go to the rejects file.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipeline import db
from pipeline.spark import PipelineError
from pipeline.validate import FIELDS, Invalid, check_row
from scheduler import rules
from scheduler.db import libpq_url

OUTCOMES = ("created", "replaced", "ignored", "rejected", "invalid", "duplicate")
REJECT_COLUMNS = ("row", "reason", *FIELDS)
CONFLICT_REASONS = {
    "reject": "conflict: An open event already has this key.",
    "replace": "conflict: The open event with this key is in flight; it cannot be replaced.",
}
# Bits of monotonically_increasing_id() below the partition index.
_PARTITION_SHIFT = 33

# A record out of a partition: (kind "count" | "reject", outcome, n, row, reason, *FIELDS as text).
Record = tuple[Any, ...]


@dataclass(frozen=True)
class ImportResult:
    counts: dict[str, int]
    rejects_path: Path
    rejects: int


def read_input(spark: SparkSession, path: str, fmt: str | None = None) -> DataFrame:
    """The file's rows with every column as text (Parquet timestamps in RFC 3339, UTC)."""
    fmt = fmt or ("csv" if path.lower().endswith((".csv", ".csv.gz")) else "parquet")
    if not Path(path).exists() and "://" not in path:
        raise PipelineError(f"no such file: {path}")
    if fmt == "csv":
        # RFC 4180: quotes doubled, newlines allowed inside quoted cells (JSON data may have them)
        frame = (
            spark.read.option("header", "true")
            .option("multiLine", "true")
            .option("escape", '"')
            .option("inferSchema", "false")
            .csv(path)
        )
    elif fmt == "parquet":
        frame = spark.read.parquet(path)
    else:
        raise PipelineError(f"unknown input format {fmt!r}: csv or parquet")
    return frame.select(*[_as_text(frame, field.name, field.dataType) for field in frame.schema.fields])


def _as_text(frame: DataFrame, name: str, kind: T.DataType) -> Column:
    column = frame[name]
    if isinstance(kind, T.TimestampType):
        text = F.date_format(column, "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX")
    elif isinstance(kind, T.StructType | T.MapType | T.ArrayType):
        text = F.to_json(column)
    else:
        # a TIMESTAMP_NTZ has no offset: its text is refused by the rules, as the API refuses it
        text = column.cast("string")
    return text.alias(name)


def _check_columns(frame: DataFrame, default_queue: str | None) -> None:
    unknown = [c for c in frame.columns if c not in FIELDS]
    if unknown:
        raise PipelineError(f"unknown column(s) {', '.join(unknown)}; an import file may have: {', '.join(FIELDS)}")
    missing = [c for c in ("item_key", "data") if c not in frame.columns]
    if "queue" not in frame.columns and not default_queue:
        missing.insert(0, "queue (or --queue)")
    if missing:
        raise PipelineError(f"missing column(s): {', '.join(missing)}")


def _numbered(spark: SparkSession, frame: DataFrame) -> DataFrame:
    """The rows with `row`: their 1-based position in the input (cached: numbered once)."""
    frame = frame.withColumn("_part", F.spark_partition_id()).withColumn("_mono", F.monotonically_increasing_id())
    frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
    sizes = sorted((r["_part"], r["count"]) for r in frame.groupBy("_part").count().collect())
    offsets, total = [], 0
    for part, size in sizes:
        offsets.append((part, total))
        total += size
    starts = spark.createDataFrame(offsets or [(0, 0)], "_part int, _offset long")
    position = F.col("_mono") - F.shiftleft(F.col("_part").cast("long"), _PARTITION_SHIFT)
    return frame.join(F.broadcast(starts), "_part").withColumn("row", F.col("_offset") + position + 1)


def run_import(
    spark: SparkSession,
    url: str,
    path: str,
    *,
    principal: str,
    on_conflict: str = "reject",
    queue: str | None = None,
    fmt: str | None = None,
    rejects_path: str | None = None,
    partitions: int | None = None,
    max_data_bytes: int = 256 * 1024,
) -> ImportResult:
    """Import the file; return counts by outcome and where the rejected rows went."""
    if on_conflict not in rules.ON_CONFLICT_CHOICES:
        raise PipelineError(f"--on-conflict must be one of {', '.join(rules.ON_CONFLICT_CHOICES)}")
    if not 1 <= len(principal) <= 200:
        raise PipelineError("--principal must be 1-200 characters")
    frame = read_input(spark, path, fmt)
    _check_columns(frame, queue)
    with db.connect(url) as conn:
        queues = {str(row[0]) for row in conn.execute(db.q("import_queues")).fetchall()}
    given = {c: F.col(c) for c in frame.columns}
    queue_column = F.col("queue") if "queue" in given else F.lit(None).cast("string")
    if queue:
        queue_column = F.coalesce(F.when(queue_column != "", queue_column), F.lit(queue))
    frame = frame.select(*[(given.get(f, F.lit(None).cast("string"))).alias(f) for f in FIELDS if f != "queue"],
                         queue_column.alias("queue"))  # fmt: skip

    partitions = partitions or 2 * spark.sparkContext.defaultParallelism
    numbered = _numbered(spark, frame)
    by_key = Window.partitionBy("queue", "item_key")
    keyed = (
        numbered.repartition(partitions, "queue", "item_key")  # the window reuses this partitioning
        .withColumn("first_row", F.min("row").over(by_key))
        .select("row", "first_row", *FIELDS)
    )
    load = partial(
        _load_partition,
        url=libpq_url(url),
        actor=principal,
        on_conflict=on_conflict,
        queues=frozenset(queues),
        max_data_bytes=max_data_bytes,
    )
    records = keyed.rdd.mapPartitions(load).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        found = records.filter(lambda r: r[0] == "count").map(lambda r: (r[1], r[2])).reduceByKey(int.__add__)
        counts = dict.fromkeys(OUTCOMES, 0) | dict(found.collect())
        rejected = records.filter(lambda r: r[0] == "reject").sortBy(lambda r: r[3])
        target = Path(rejects_path or f"{path.rstrip('/')}.rejects.csv")
        written = _write_rejects(target, rejected.toLocalIterator())
    finally:
        records.unpersist()
        numbered.unpersist()
    return ImportResult(counts=counts, rejects_path=target, rejects=written)


def _write_rejects(target: Path, records: Iterable[Record]) -> int:
    target.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with target.open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(REJECT_COLUMNS)
        for record in records:
            writer.writerow(["" if v is None else v for v in record[3:]])
            count += 1
    return count


def _reject(outcome: str, row: int, reason: str, values: Iterable[Any]) -> Record:
    return ("reject", outcome, 1, row, reason, *values)


def _load_partition(
    rows: Iterable[Any], *, url: str, actor: str, on_conflict: str, queues: frozenset[str], max_data_bytes: int
) -> Iterator[Record]:
    """Validate a partition's rows and load the good ones in one transaction; yield counts and rejects."""
    now = datetime.now(UTC)
    rejects: list[Record] = []
    staged = 0
    with psycopg.connect(url, options="-c TimeZone=UTC", application_name="tickler-import") as conn:
        conn.execute(db.q("import_staging"))
        with conn.cursor().copy(db.q("import_copy")) as copy:
            for row in rows:
                raw = [row[f] for f in FIELDS]
                try:
                    values = check_row(row.asDict(), queues=queues, now=now, max_data_bytes=max_data_bytes)
                except Invalid as error:
                    rejects.append(_reject("invalid", row["row"], str(error), raw))
                    continue
                if row["row"] != row["first_row"]:
                    reason = f"duplicate: Row {row['first_row']} has the same queue and item_key."
                    rejects.append(_reject("duplicate", row["row"], reason, raw))
                    continue
                copy.write_row((row["row"], *values))
                staged += 1
        results: list[tuple[Any, ...]] = []
        if staged:
            conn.execute(db.q("import_analyze"))
            statement = db.q("import_upsert" if on_conflict == "replace" else "import_insert")
            results = conn.execute(statement, {"actor": actor}).fetchall()
        conn.commit()
    counts = dict.fromkeys(OUTCOMES, 0)
    for record in rejects:
        counts[record[1]] += 1
        yield record
    for outcome, n, row_number, *staged_values in results:
        if outcome in ("created", "replaced"):
            counts[outcome] += n
        if outcome != "conflict" or row_number is None:
            continue  # a conflict's summary line: its rows follow one by one
        if on_conflict == "ignore":
            counts["ignored"] += 1
            continue
        counts["rejected"] += 1
        queue_, item_key, group_key, schedule_on, delay, data, max_attempts = staged_values
        yield _reject(
            "rejected",
            row_number,
            CONFLICT_REASONS[on_conflict],
            (queue_, item_key, group_key, rules.format_timestamp(schedule_on), delay, _json(data), max_attempts),
        )
    for outcome, n in counts.items():
        if n:
            yield ("count", outcome, n, None, None, *([None] * len(FIELDS)))


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"), ensure_ascii=False)
