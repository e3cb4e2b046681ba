"""Bulk import: schedule events from CSV or Parquet, checked with the API's rules, loaded set-based.

Spark reads the file and numbers its rows; rows are spread over partitions by (queue, item_key),
so the later rows of a key already seen are found without a second pass. The row checks run as
Spark SQL expressions in the executors' JVM (pipeline.plain_rows): a row they vouch for arrives in
Python as its line of COPY text, any other row as JSON for pipeline.validate.check_row, which
decides it and spells the reason. Each partition then, batch by batch (one transaction each),
COPYs the good rows into a temporary staging table and writes them with one statement through
tickler_schedule(), the SQL function the API schedules through too (pipeline/queries.sql:
import_write), which writes their timeline entries and wakes dispatchers. Each batch records
itself, its counts and its rejects in the import ledger (migration 0013) in the same transaction:
a batch already recorded is skipped, so a retried task or a rerun resumes, and the counts and the
rejects file are read from the ledger.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from pyspark import RDD, StorageLevel
from pyspark.serializers import UTF8Deserializer
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from tickler.pipeline import db, plain_rows
from tickler.pipeline.limits import InputRefused, MaxInvalid
from tickler.pipeline.progress import track
from tickler.pipeline.spark import PipelineError
from tickler.pipeline.validate import FIELDS, Invalid, check_row
from tickler.scheduler import rules
from tickler.scheduler.db import libpq_url

OUTCOMES = ("created", "replaced", "debounced", "ignored", "rejected", "invalid", "duplicate")
REJECT_COLUMNS = ("row", "reason", *FIELDS)
CONFLICT_REASONS = {
    "reject": "conflict: An open event already has this key.",
    "replace": "conflict: The open event with this key is in flight; it cannot be replaced.",
    "debounce": "conflict: The open event with this key is in flight; it cannot be debounced.",
}
# Bits of monotonically_increasing_id() below the partition index.
_PARTITION_SHIFT = 33
# Rows per transaction: what a crash can lose, and how soon loaded rows become visible.
DEFAULT_BATCH_ROWS = 10_000


@dataclass(frozen=True)
class ImportResult:
    counts: dict[str, int]
    rejects_path: Path
    rejects: int
    rows: int = 0  # rows in the file

    @property
    def valid(self) -> int:
        """Rows that passed the row checks (whatever became of them: created, a conflict...)."""
        return sum(n for outcome, n in self.counts.items() if outcome not in ("invalid", "duplicate"))


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
            # With escape = quote, univocity takes NUL as the escape of that escape and drops every
            # NUL inside a quoted cell: the rules must see the bytes of the file, NUL included.
            .option("charToEscapeQuoteEscaping", '"')
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


def _fields(frame: DataFrame, queue: str | None) -> DataFrame:
    """The file's columns as FIELDS (a missing one null), the queue defaulted to --queue."""
    given = {c: F.col(c) for c in frame.columns}
    queue_column = F.col("queue") if "queue" in given else F.lit(None).cast("string")
    if queue:
        queue_column = F.coalesce(F.when(queue_column != "", queue_column), F.lit(queue))
    return frame.select(*[(given.get(f, F.lit(None).cast("string"))).alias(f) for f in FIELDS if f != "queue"],
                        queue_column.alias("queue"))  # fmt: skip


def check_only(
    spark: SparkSession, path: str, *, queues: frozenset[str], max_data_bytes: int, partitions: int
) -> tuple[int, int]:
    """The import's Spark side alone, nothing written (for bench/pipeline_bench.py's profile): the
    file read, numbered, spread by key and turned into the loader's lines. Returns (rows, rows the
    JVM vouched for)."""
    frame = read_input(spark, path)
    _check_columns(frame, None)
    numbered, _total = _numbered(spark, _fields(frame, None))
    try:
        lines = _as_lines(spark, _keyed(numbered, partitions), {"queues": queues, "max_data_bytes": max_data_bytes})
        tallies = lines.mapPartitions(_tally).collect()
    finally:
        numbered.unpersist()
    return sum(n for n, _ in tallies), sum(v for _, v in tallies)


def _tally(lines: Iterable[str]) -> Iterator[tuple[int, int]]:
    """A partition's (rows, rows the JVM vouched for)."""
    rows = vouched = 0
    for line in lines:
        rows += 1
        vouched += line[0] == plain_rows.PLAIN
    yield rows, vouched


def _numbered(spark: SparkSession, frame: DataFrame) -> tuple[DataFrame, int]:
    """The rows with `row`: their 1-based position in the input (cached: numbered once); the row count."""
    frame = frame.withColumn("_part", F.spark_partition_id()).withColumn("_mono", F.monotonically_increasing_id())
    frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
    sizes = sorted((r["_part"], r["count"]) for r in frame.groupBy("_part").count().collect())
    offsets, total = [], 0
    for part, size in sizes:
        offsets.append((part, total))
        total += size
    starts = spark.createDataFrame(offsets or [(0, 0)], "_part int, _offset long")
    position = F.col("_mono") - F.shiftleft(F.col("_part").cast("long"), _PARTITION_SHIFT)
    return frame.join(F.broadcast(starts), "_part").withColumn("row", F.col("_offset") + position + 1), total


def _keyed(numbered: DataFrame, partitions: int) -> DataFrame:
    """The rows spread by (queue, item_key), each with the first row of its key, in row order."""
    by_key = Window.partitionBy("queue", "item_key")
    return (
        numbered.repartition(partitions, "queue", "item_key")  # the window reuses this partitioning
        .withColumn("first_row", F.min("row").over(by_key))
        .select("row", "first_row", *FIELDS)
        .sortWithinPartitions("row")  # the same batches on every attempt
    )


def _count_invalid(lines: Iterable[str], **rules_: Any) -> Iterator[int]:
    """How many of a partition's rows fail the row checks or repeat a key (the loader's own tests)."""
    now = datetime.now(UTC)
    bad = 0
    for line in lines:
        if line[0] == plain_rows.PLAIN:
            continue  # vouched for on the JVM
        row = json.loads(line[1:])
        try:
            check_row(row, now=now, **rules_)
        except Invalid:
            bad += 1
            continue
        bad += int(row["row"] != row["first_row"])
    yield bad


def fingerprint(
    path: str,
    *,
    principal: str,
    on_conflict: str,
    queue: str | None,
    fmt: str | None,
    debounce_max_seconds: float | None = None,
) -> str:
    """What makes a rerun the same import: the file (path, sizes, modification times) and the options."""
    options = [
        principal,
        on_conflict,
        queue or "",
        fmt or "",
        "" if debounce_max_seconds is None else repr(debounce_max_seconds),
    ]
    parts = [path if "://" in path else str(Path(path).resolve()), *options]
    local = Path(path)
    if "://" not in path and local.exists():
        files = [local] if local.is_file() else sorted(f for f in local.rglob("*") if f.is_file())
        parts += [f"{f}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def run_import(
    spark: SparkSession,
    url: str,
    path: str,
    *,
    principal: str,
    on_conflict: str = "reject",
    debounce_max_seconds: float | None = None,
    queue: str | None = None,
    fmt: str | None = None,
    rejects_path: str | None = None,
    partitions: int | None = None,
    max_data_bytes: int = 256 * 1024,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    crash_after_batches: int | None = None,
    max_invalid: MaxInvalid | None = None,
) -> ImportResult:
    """Import the file; return counts by outcome and where the rejected rows went.

    A rerun of an import that died part-way (same file, same options) resumes it: the batches it
    committed are skipped. `crash_after_batches` is for tests: partition 0 fails after that many.
    With `max_invalid`, the rows are checked first and the file refused (InputRefused, nothing
    written) when more of them fail than it allows.
    """
    if on_conflict not in rules.SCHEDULE_ON_CONFLICT:
        raise PipelineError(f"--on-conflict must be one of {', '.join(rules.SCHEDULE_ON_CONFLICT)}")
    if debounce_max_seconds is not None:
        try:
            debounce_max_seconds = rules.debounce_max_seconds(debounce_max_seconds)
        except rules.RuleError as error:
            raise PipelineError(f"--debounce-max-seconds: {error}") from None
    if not 1 <= len(principal) <= 200:
        raise PipelineError("--principal must be 1-200 characters")
    frame = read_input(spark, path, fmt)
    _check_columns(frame, queue)
    ledger = {
        "fingerprint": fingerprint(
            path,
            principal=principal,
            on_conflict=on_conflict,
            queue=queue,
            fmt=fmt,
            debounce_max_seconds=debounce_max_seconds,
        ),
        "source": path,
        "principal": principal,
        "on_conflict": on_conflict,
        "debounce_max_seconds": debounce_max_seconds,
        "partitions": partitions or 2 * spark.sparkContext.defaultParallelism,
        "batch_rows": batch_rows,
    }
    numbered, total = _numbered(spark, _fields(frame, queue))
    with db.connect(url) as conn:
        queues = {str(row[0]) for row in db.rows(conn, "import_queues", tuples=True)}
    checks: dict[str, Any] = {"queues": frozenset(queues), "max_data_bytes": max_data_bytes}
    try:
        if max_invalid is not None:
            keyed = _keyed(numbered, partitions or 2 * spark.sparkContext.defaultParallelism)
            lines = _as_lines(spark, keyed, checks)
            invalid = sum(lines.mapPartitions(partial(_count_invalid, **checks)).collect())
            if invalid > max_invalid.allowed(total):
                raise InputRefused(
                    f"{invalid:,} of the {total:,} rows of {path} fail the row checks, more than --max-invalid "
                    f"{max_invalid} allows; nothing was imported"
                )
        with db.connect(url) as conn:
            # a resumed import keeps the cut of the first attempt, so its batches are the same rows
            started = db.rows(conn, "import_resume", ledger, tuples=True)
            [(import_id, partitions, batch_rows)] = started or db.rows(conn, "import_start", ledger, tuples=True)
        keyed = _keyed(numbered, partitions)
        load = partial(
            _load_partition,
            url=libpq_url(url),
            actor=principal,
            on_conflict=on_conflict,
            debounce_max_seconds=debounce_max_seconds,
            **checks,
            import_id=import_id,
            batch_rows=batch_rows,
            crash_after=crash_after_batches,
        )
        with db.connect(url, autocommit=True) as watch, track("rows checked", total, partial(_done, watch, import_id)):
            _as_lines(spark, keyed, checks).mapPartitionsWithIndex(load).count()
    finally:
        numbered.unpersist()
    # counts and rejects from the ledger: one per row, whatever tasks Spark ran twice
    target = Path(rejects_path or f"{path.rstrip('/')}.rejects.csv")
    with db.connect(url) as conn:
        [totals] = db.rows(conn, "import_totals", {"import_id": import_id}, tuples=True)
        counts = {outcome: int(n) for outcome, n in zip(OUTCOMES, totals, strict=True)}
        # written as the cursor hands them out, not collected first (sql.run): there may be millions
        written = _write_rejects(target, conn.execute(db.q("import_rejects"), {"import_id": import_id}))
        db.rows(conn, "import_finish", {"import_id": import_id, "counts": Jsonb(counts)})
    return ImportResult(counts=counts, rejects_path=target, rejects=written, rows=total)


def _done(conn: psycopg.Connection[Any], import_id: int) -> tuple[int, str]:
    """Progress from the ledger: rows checked and decided, and how many of them were written."""
    rows = db.rows(conn, "import_progress", {"import_id": import_id}, tuples=True)
    checked, written = (int(rows[0][0]), int(rows[0][1])) if rows else (0, 0)
    return checked, f"{written:,} written"


def _as_lines(spark: SparkSession, frame: DataFrame, checks: dict[str, Any]) -> RDD[str]:
    """The rows as plain_rows.line() spells them: a text line per row is the cheapest way from the
    JVM to Python (`.rdd` builds a Row object per row, more than the rules cost)."""
    now = datetime.now(UTC)
    texts = frame.select(plain_rows.line(checks["queues"], checks["max_data_bytes"], now).alias("line"))
    # Dataset[String] -> JavaRDD, as DataFrame.toJSON() does it (a JVM string per row, no Row objects)
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    strings = getattr(texts._jdf, "as")(jvm.org.apache.spark.sql.Encoders.STRING())
    return RDD(strings.toJavaRDD(), spark.sparkContext, UTF8Deserializer(True))  # type: ignore[no-untyped-call]


def _write_rejects(target: Path, records: Iterable[tuple[Any, ...]]) -> int:
    target.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with target.open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(REJECT_COLUMNS)
        for row_number, reason, cells in records:
            writer.writerow([row_number, reason, *("" if v is None else bytes(v).decode() for v in cells)])
            count += 1
    return count


def _batches(rows: Iterable[Any], size: int) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for row in rows:
        batch.append(row)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _load_partition(
    part: int,
    rows: Iterable[str],
    *,
    url: str,
    import_id: int,
    batch_rows: int,
    crash_after: int | None,
    **rules_: Any,
) -> Iterator[int]:
    """Load a partition's rows batch by batch, each batch in its own transaction; yield the batch numbers."""
    now = datetime.now(UTC)
    with db.connect(url, application_name="tickler-import") as conn:
        for number, batch in enumerate(_batches(rows, batch_rows)):
            with conn.transaction():
                _load_batch(conn, {"import_id": import_id, "part": part, "batch": number}, batch, now=now, **rules_)
            if crash_after is not None and part == 0 and number + 1 >= crash_after:
                raise RuntimeError(f"import: simulated crash after batch {number} of partition {part}")
            yield number


def _load_batch(
    conn: psycopg.Connection[Any],
    key: dict[str, int],
    lines: list[str],
    *,
    now: datetime,
    actor: str,
    on_conflict: str,
    debounce_max_seconds: float | None,
    queues: frozenset[str],
    max_data_bytes: int,
) -> None:
    """Validate and insert one batch, and record it with its counts and rejects, in the caller's transaction."""
    if not db.rows(conn, "import_claim_batch", key, tuples=True):
        return  # an earlier attempt committed this batch
    rejects: list[tuple[int, str, str, list[Any]]] = []  # (row, outcome, reason, cells)
    db.rows(conn, "import_staging")
    # the rows the JVM vouched for, as COPY text: one write for them all
    vouched = [line[1:] for line in lines if line[0] == plain_rows.PLAIN]
    staged = len(vouched)
    with conn.cursor().copy(db.q("import_copy")) as copy:
        if vouched:
            copy.write("\n".join(vouched) + "\n")
        for row in (json.loads(line[1:]) for line in lines if line[0] == plain_rows.CHECK):
            raw = [row.get(f) for f in FIELDS]
            try:
                values = check_row(row, queues=queues, now=now, max_data_bytes=max_data_bytes)
            except Invalid as error:
                rejects.append((row["row"], "invalid", str(error), raw))
                continue
            if row["row"] != row["first_row"]:
                reason = f"duplicate: Row {row['first_row']} has the same queue and item_key."
                rejects.append((row["row"], "duplicate", reason, raw))
                continue
            copy.write_row((row["row"], *values))
            staged += 1
    counts = dict.fromkeys(OUTCOMES, 0)
    if staged:
        db.rows(conn, "import_analyze")
        params = {"actor": actor, "on_conflict": on_conflict, "debounce_max_seconds": debounce_max_seconds}
        written = db.rows(conn, "import_write", params, tuples=True)
        conflicts = [row[2] for row in written if row[0] == "conflict" and row[2] is not None]
        db.rows(conn, "import_trace", {"conflicts": conflicts})
        for outcome, n, row_number, *staged_values in written:
            if outcome in ("created", "replaced", "debounced"):
                counts[outcome] += n
            if outcome != "conflict" or row_number is None:
                continue  # a conflict's summary line: its rows follow one by one
            if on_conflict == "ignore":
                counts["ignored"] += 1
                continue
            queue_, item_key, group_key, schedule_on, delay, data, max_attempts, *rest = staged_values
            cells = [queue_, item_key, group_key, rules.format_timestamp(schedule_on), delay, _json(data), max_attempts]
            cells += rest  # priority, fairness_key, traceparent
            rejects.append((row_number, "rejected", CONFLICT_REASONS[on_conflict], cells))
    if rejects:
        with conn.cursor().copy(db.q("import_copy_rejects")) as copy:
            copy.set_types(["int8", "int8", "text", "text", "bytea[]"])
            for row_number, outcome, reason, cells in rejects:
                counts[outcome] += 1
                copy.write_row((key["import_id"], row_number, outcome, reason, [_cell(c) for c in cells]))
    db.rows(conn, "import_batch_counts", {**key, **counts})


def _cell(value: Any) -> bytes | None:
    return None if value is None else str(value).encode()


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"), ensure_ascii=False)
