"""The delivery report: per queue and day, what happened to events, how late and how often they failed.

Definitions (also in docs/pipeline.md):
- counts per day are timeline entries by the day (UTC) of their `at`;
- lateness of a delivered event = its `delivered` time minus the schedule the client last asked
  for (the `schedule_on` of its latest `enqueued`/`replaced`/`rescheduled` entry; retries move the
  event's own schedule, not what the client asked);
- failed attempts = `failed` + `lease_expired` + `dead` given by a worker (a `dead` written by
  tickler follows a `lease_expired` and is not another attempt); failure rate = failed attempts /
  (failed attempts + deliveries);
- attempts of a delivered event = redeliver_count + 1;
- percentiles are exact and nearest-rank: the smallest value whose cumulative share reaches p,
  as PostgreSQL's percentile_disc (Spark's percentile_disc, which counts every distinct value:
  the same data gives the same figures on every run, whatever the partitioning).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Row, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from tickler.pipeline import manifest
from tickler.pipeline.period import LATENESS_BUCKETS, Period
from tickler.pipeline.report_html import render
from tickler.pipeline.source import EVENTS, TIMELINE, Source
from tickler.scheduler.states import Action

# The entries that set the time the client asked for (a debounce sets it too, capped).
CLIENT_SCHEDULE_ACTIONS = (Action.ENQUEUED, Action.REPLACED, Action.DEBOUNCED, Action.RESCHEDULED)
COUNTED_ACTIONS = (
    Action.ENQUEUED, Action.REPLACED, Action.RESCHEDULED, Action.UPDATED, Action.CANCELLED,
    Action.CLAIMED, Action.DELIVERED, Action.FAILED, Action.LEASE_EXPIRED, Action.RELEASED, Action.DEAD,
)  # fmt: skip
PERCENTILES = (0.5, 0.95, 0.99)
TABLES = ("daily", "summary", "lateness_histogram", "top_failures", "hourly", "attempts_histogram", "dead_reasons")

_EVENT_COLUMNS = ["id", "queue", "group_key", "enqueued_on", "enqueued_by", "dequeued_on", "redeliver_count"]
_TIMELINE_COLUMNS = ["id", "queue", "event_id", "at", "action", "actor", "schedule_on", "details"]


@dataclass(frozen=True)
class ReportResult:
    out_dir: Path
    html: Path
    tables: dict[str, list[dict[str, Any]]]


def load_history(spark: SparkSession, source: Source, period: Period | None = None) -> tuple[DataFrame, DataFrame]:
    """Events and timeline entries: the live tables plus every archived run, as of one snapshot.

    With a period, only what the report of that period needs (the filters reach PostgreSQL through
    JDBC, and the archive's days before it are not opened): events enqueued before its end that
    had not finished before it began (an event's entries all come before it finishes), and of
    the timeline the entries in it plus the entries that set a schedule (a delivery's lateness
    goes by the schedule asked for, however long before)."""
    [event_bounds] = source.rows("id_bounds_events")
    [timeline_bounds] = source.rows("id_bounds_timeline")
    events = source.read(EVENTS, event_bounds).select(*_EVENT_COLUMNS)
    timeline = source.read(TIMELINE, timeline_bounds).select(*_TIMELINE_COLUMNS)
    runs = [(int(run_id), str(location)) for run_id, location, _ in source.rows("archive_runs_readable")]
    since = period.since if period else None
    archived_events = manifest.read_runs(spark, runs, "events", since=since)
    archived_timeline = manifest.read_runs(spark, runs, "timeline", since=since)
    if archived_events is not None:
        events = events.unionByName(archived_events.select(*_EVENT_COLUMNS))
    if archived_timeline is not None:
        timeline = timeline.unionByName(archived_timeline.select(*_TIMELINE_COLUMNS))
    if period is not None:
        start, end = F.lit(period.start), F.lit(period.end)
        finished_in_time = F.col("dequeued_on").isNull() | (F.col("dequeued_on") >= start)
        events = events.where((F.col("enqueued_on") < end) & finished_in_time)
        sets_schedule = F.col("action").isin(*[str(a) for a in CLIENT_SCHEDULE_ACTIONS])
        timeline = timeline.where((F.col("at") < end) & ((F.col("at") >= start) | sets_schedule))
    return events, with_claims(timeline)


def with_claims(timeline: DataFrame) -> DataFrame:
    """The timeline with the `claimed` entries that rows ending a lease carry in details.claim
    (migration 0016: one row per attempt) as entries of their own, as tickler_timeline_entry
    shows them; rows written before, with their own `claimed` row, pass through as they are."""
    claim = F.get_json_object("details", "$.claim")
    claims = timeline.where(claim.isNotNull()).select(
        "id",
        "queue",
        "event_id",
        F.expr(
            "at - make_interval(0, 0, 0, 0, 0, 0, CAST(get_json_object(details, '$.claim.ago') AS decimal(18, 6)))"
        ).alias("at"),
        F.lit(str(Action.CLAIMED)).alias("action"),
        F.coalesce(F.get_json_object("details", "$.claim.by"), F.col("actor")).alias("actor"),
        F.coalesce(F.to_timestamp(F.get_json_object("details", "$.claim.schedule_on")), F.col("schedule_on")).alias(
            "schedule_on"
        ),
        claim.alias("details"),
    )
    return timeline.unionByName(claims)


def _percentiles(column: str, prefix: str) -> list[Column]:
    # exact, not percentile_approx: its sketch depends on how rows meet across partitions, so
    # two runs over the same data disagreed, and its p99 was off by a second on a long tail
    return [
        F.expr(f"percentile_disc({p}) WITHIN GROUP (ORDER BY {column})").alias(f"{prefix}_p{round(p * 100)}_s")
        for p in PERCENTILES
    ]


def _seconds_between(later: Column, earlier: Column) -> Column:
    return (F.unix_micros(later) - F.unix_micros(earlier)) / F.lit(1_000_000.0)


def _failed_attempt(timeline: DataFrame) -> Column:
    return timeline.action.isin(Action.FAILED, Action.LEASE_EXPIRED) | (
        (timeline.action == Action.DEAD) & (timeline.actor != "tickler")
    )


def deliveries(events: DataFrame, timeline: DataFrame, period: Period) -> DataFrame:
    """One row per delivery in the period: queue, day, lateness, attempts, time from enqueue."""
    asked = (
        timeline.where(timeline.action.isin(*CLIENT_SCHEDULE_ACTIONS))
        .groupBy("event_id")
        .agg(F.max_by("schedule_on", "id").alias("asked_on"))
    )
    delivered = timeline.where(
        (timeline.action == Action.DELIVERED) & (timeline.at >= F.lit(period.start)) & (timeline.at < F.lit(period.end))
    ).select("event_id", "queue", F.col("at").alias("delivered_at"))
    joined = delivered.join(asked, "event_id", "left").join(
        events.select(F.col("id").alias("event_id"), "enqueued_on", "redeliver_count"), "event_id", "left"
    )
    return joined.select(
        "queue",
        F.to_date("delivered_at").alias("day"),
        _seconds_between(F.col("delivered_at"), F.col("asked_on")).alias("lateness_s"),
        _seconds_between(F.col("delivered_at"), F.col("enqueued_on")).alias("enqueue_to_delivery_s"),
        (F.col("redeliver_count") + 1).alias("attempts"),
    )


def _delivery_stats(frame: DataFrame) -> DataFrame:
    return frame.rollup("queue", "day").agg(
        *_percentiles("lateness_s", "lateness"),
        F.avg("lateness_s").alias("lateness_avg_s"),
        F.avg("attempts").alias("attempts_avg"),
        F.max("attempts").alias("attempts_max"),
        F.avg(F.when(F.col("attempts") > 1, 1.0).otherwise(0.0)).alias("redelivered_share"),
        *_percentiles("enqueue_to_delivery_s", "enqueue_to_delivery"),
    )


def _action_counts(entries: DataFrame) -> DataFrame:
    counts = [F.count_if(entries.action == action).alias(str(action)) for action in COUNTED_ACTIONS]
    failed = F.count_if(_failed_attempt(entries)).alias("failed_attempts")
    return entries.rollup("queue", "day").agg(*counts, failed)


def _day_key(frame: DataFrame) -> DataFrame:
    """A rollup's rows per queue and day, and per queue (day NULL), under one join key; no grand total."""
    return frame.where(F.col("queue").isNotNull()).withColumn(
        "_key", F.coalesce(F.col("day").cast("string"), F.lit("period"))
    )


def _with_failure_rate(frame: DataFrame) -> DataFrame:
    tried = F.col("failed_attempts") + F.col("delivered")
    return frame.withColumn("failure_rate", F.when(tried > 0, F.col("failed_attempts") / tried))


def _histogram(delivered: DataFrame) -> DataFrame:
    bucket: Any = F
    for index, (label, bound) in enumerate(LATENESS_BUCKETS):
        value = F.struct(F.lit(index).alias("bucket"), F.lit(label).alias("label"))
        condition = F.col("lateness_s") < bound if bound is not None else F.lit(True)
        bucket = bucket.when(condition, value)
    return (
        delivered.where(F.col("lateness_s").isNotNull())
        .withColumn("b", bucket)
        .groupBy("queue", F.col("b.bucket").alias("bucket"), F.col("b.label").alias("label"))
        .agg(F.count("*").alias("deliveries"))
    )


def _top_failures(events: DataFrame, in_period: DataFrame, top: int) -> DataFrame:
    """The groups (per queue) and the principals with the most failed attempts, `top` of each."""
    failures = (
        in_period.where(_failed_attempt(in_period))
        .select("event_id")
        .join(events.select(F.col("id").alias("event_id"), "queue", "group_key", "enqueued_by"), "event_id")
    )
    grouped = failures.groupingSets([["queue", "group_key"], ["enqueued_by"]], "queue", "group_key", "enqueued_by").agg(
        F.count("*").alias("failures"),
        F.countDistinct("event_id").alias("events"),
        F.grouping("enqueued_by").alias("_by_group"),
    )
    kind = F.when(F.col("_by_group") == 1, "group").otherwise("principal")
    ranked = (
        grouped.where((F.col("_by_group") == 0) | F.col("group_key").isNotNull())
        .select(
            kind.alias("kind"),
            "queue",
            F.coalesce("group_key", "enqueued_by").alias("name"),
            "failures",
            "events",
        )
        .withColumn(
            "_rank",
            F.row_number().over(Window.partitionBy("kind").orderBy(F.desc("failures"), "queue", "name")),
        )
    )
    return ranked.where(F.col("_rank") <= top).drop("_rank")


def _hourly(in_period: DataFrame) -> DataFrame:
    """Per queue and hour of the day (UTC), over the whole period: deliveries and enqueues."""
    return (
        in_period.where(in_period.action.isin(Action.DELIVERED, Action.ENQUEUED))
        .groupBy("queue", F.hour("at").alias("hour"))
        .agg(F.count_if(F.col("action") == Action.DELIVERED).alias("delivered"),
             F.count_if(F.col("action") == Action.ENQUEUED).alias("enqueued"))
    )  # fmt: skip


def _attempts_histogram(delivered: DataFrame) -> DataFrame:
    """Per queue: how many delivered events needed 1, 2, 3... attempts."""
    return delivered.groupBy("queue", "attempts").agg(F.count("*").alias("deliveries"))


def _dead_reasons(in_period: DataFrame) -> DataFrame:
    """Per queue: dead events by the reason their `dead` entry gives."""
    reason = F.coalesce(F.get_json_object("details", "$.reason"), F.lit("unknown"))
    return (
        in_period.where(in_period.action == Action.DEAD)
        .groupBy("queue", reason.alias("reason"))
        .agg(F.count("*").alias("dead"))
    )


def compute(events: DataFrame, timeline: DataFrame, period: Period, top: int = 10) -> dict[str, DataFrame]:
    """The report's tables (DataFrames, not yet computed; unordered).

    `queues` holds the daily rows and, with day NULL, each queue's whole period (one rollup, one
    job): run_report splits them into the `daily` and `summary` tables.
    """
    timeline = timeline.where(timeline.at < F.lit(period.end))
    in_period = timeline.where(timeline.at >= F.lit(period.start)).withColumn("day", F.to_date("at"))
    delivered = deliveries(events, timeline, period)
    counts = _day_key(_action_counts(in_period))
    stats = _day_key(_delivery_stats(delivered)).drop("day")
    queues = counts.join(stats, ["queue", "_key"], "left").drop("_key").transform(_with_failure_rate)
    return {
        "queues": queues,
        "lateness_histogram": _histogram(delivered),
        "top_failures": _top_failures(events, in_period, top),
        "hourly": _hourly(in_period),
        "attempts_histogram": _attempts_histogram(delivered),
        "dead_reasons": _dead_reasons(in_period),
    }


# How the collected rows of each table are ordered (Spark leaves them unordered: sorting there
# would cost a job per table for a few hundred rows).
_ORDER = {
    "daily": lambda r: (r["queue"], r["day"]),
    "summary": lambda r: r["queue"],
    "lateness_histogram": lambda r: (r["queue"], r["bucket"]),
    "top_failures": lambda r: (r["kind"] != "group", -r["failures"], r["queue"] or "", r["name"] or ""),
    "hourly": lambda r: (r["queue"], r["hour"]),
    "attempts_histogram": lambda r: (r["queue"], r["attempts"] or 0),
    "dead_reasons": lambda r: (r["queue"], -r["dead"], r["reason"]),
}


def _write(spark: SparkSession, rows: list[Row], schema: StructType, path: Path, period: Period) -> None:
    """Write a table partitioned by `day` (daily) or by `period` (the others), overwriting only the
    partitions this run has rows for: history builds up run after run, a rerun replaces its own."""
    frame = spark.createDataFrame(rows, schema)
    if "day" not in schema.fieldNames():
        frame = frame.withColumn("period", F.lit(f"{period.since.isoformat()}_{period.until.isoformat()}"))
    (
        frame.coalesce(1)
        .write.mode("overwrite")
        .option("partitionOverwriteMode", "dynamic")
        .partitionBy("day" if "day" in schema.fieldNames() else "period")
        .parquet(str(path))
    )


def run_report(spark: SparkSession, source: Source, out_dir: Path, period: Period, *, top: int = 10) -> ReportResult:
    """Compute the report, write each table as Parquet under `out_dir` and the HTML beside them."""
    events, timeline = load_history(spark, source, period)
    # every table reads the same history: read it once (claims carried in details come out of
    # rows before the period's end, and may lie before its start: kept, as compute() filters)
    events = events.persist(StorageLevel.MEMORY_AND_DISK)
    timeline = timeline.where(timeline.at < F.lit(period.end)).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        found = {
            name: (frame.collect(), frame.schema) for name, frame in compute(events, timeline, period, top).items()
        }
    finally:
        events.unpersist()
        timeline.unpersist()
    queue_rows, queue_schema = found.pop("queues")
    summary_schema = StructType([f for f in queue_schema.fields if f.name != "day"])
    found["daily"] = ([r for r in queue_rows if r["day"] is not None], queue_schema)
    found["summary"] = ([Row(**{k: v for k, v in r.asDict().items() if k != "day"}) for r in queue_rows
                         if r["day"] is None], summary_schema)  # fmt: skip
    tables: dict[str, list[dict[str, Any]]] = {}
    with ThreadPoolExecutor(max_workers=4) as pool:
        # written from the driver's copy of the rows rather than computed again
        writes = [pool.submit(_write, spark, *found[name], out_dir / name, period) for name in TABLES]
        for name in TABLES:
            tables[name] = sorted((row.asDict() for row in found[name][0]), key=_ORDER[name])
        for write in writes:
            write.result()
    html = out_dir / "report.html"
    html.write_text(render(tables, period, generated=datetime.now(UTC), source=source.kind), encoding="utf-8")
    return ReportResult(out_dir=out_dir, html=html, tables=tables)
