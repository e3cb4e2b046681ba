"""Erasing a subject in the archive (SPEC §12): the Parquet files that hold an erased subject's
rows are rewritten, their values replaced as the database's were, and published through the
manifest in place of the old ones, which are deleted once a reader of the previous version has had
time to read them (manifest.ERASED_GRACE).

An erasure is done in the database first (scheduler/database/erasing.sql); when the archive has
files, it waits there (`database_done_at`, its selector kept) for this job. Per archive location,
per table: the committed files with matching rows are found, each is rewritten whole beside
itself (under a hidden `_erase-<uuid>/`, checked to hold the same rows: count, distinct ids and
id sum as before, so the ledger's figures still hold) and moved into its partition; then one new
manifest version lists the new files in place of the old — a reader sees a table before or after
the erasure, never half of it — and the old files are retired for manifest.ERASED_GRACE (10
minutes, not the hour of compaction's: they hold the values), so that a reader that took the
previous version can still read them; the next erase or compaction job after that deletes them
(each erase job starts with it, whether erasures wait or not). A crash before the manifest
changed leaves unlisted files, which the next compaction deletes; the erasure is still waiting
and the next run does it all again.

Events match as in the database (group, keys, prefix, queues); timeline entries match by the keys
of those events and by the keys and prefix named.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from tickler.pipeline import db, layout, manifest
from tickler.pipeline.archive import archive_lock, reconcile, write_checked
from tickler.pipeline.spark import PipelineError
from tickler.scheduler.erasing import erased_value, erasure_key

_PENDING = "_erase-"
# What a timeline entry's details keep (as tickler_erased_details in the database).
_KEPT_STRINGS = frozenset(
    {"lease_id", "lease_expires_at", "schedule_on", "previous_schedule_on", "dead_since", "expired_at", "by",
     "claimed_by", "changed"}
)  # fmt: skip


@dataclass(frozen=True)
class ErasedInArchive:
    erasure_id: int
    rows: int  # archive rows rewritten (events and timeline entries)
    files: int  # files replaced


def erased_details(text: str | None) -> str | None:
    """A timeline entry's details (JSON text) as an erasure leaves them: numbers, booleans, lease
    ids, times and worker names; the claim it carries cleaned the same way."""
    if text is None:
        return None
    try:
        details = json.loads(text)
    except ValueError:
        return "{}"
    return json.dumps(_kept(details), separators=(", ", ": "))


def _kept(details: Any) -> dict[str, Any]:
    if not isinstance(details, dict):
        return {}
    kept: dict[str, Any] = {}
    for key, value in details.items():
        if key == "claim" and isinstance(value, dict):
            kept[key] = _kept(value)
        elif value is None or isinstance(value, bool | int | float) or key in _KEPT_STRINGS:
            kept[key] = value
    return kept


def run_erase(spark: SparkSession, url: str, *, secret: str, now: datetime | None = None) -> list[ErasedInArchive]:
    """Delete the files earlier erasures replaced once past their grace (`now`: the clock, for
    tests), then rewrite the archive for every erasure waiting for it; each is done once its files are."""
    done = []
    with db.connect(url, autocommit=True, row_factory=dict_row) as conn, archive_lock(conn):
        if db.rows(conn, "unfinished_run"):
            raise PipelineError("an archive run is unfinished: run `tickler pipeline archive` first")
        for row in db.rows(conn, "archive_locations"):
            manifest.remove_retired(layout.Files(spark), row["location"], now=now)
        waiting = db.rows(conn, "erasures_waiting_for_archive")
        if not waiting:
            return []
        if not secret:
            found = db.rows(conn, "ui_secret")
            if not found:
                raise PipelineError("no secret to hash with: set TICKLER_SECRET_KEY as the other processes do")
            secret = found[0]["secret"]
        key = erasure_key(secret)
        locations = [row["location"] for row in db.rows(conn, "archive_locations")]
        for erasure in waiting:
            rows = files = 0
            for location in locations:
                reconcile(spark, conn, location, None)
                n, replaced = _erase_location(spark, location, erasure, lambda value: erased_value(key, value))
                rows, files = rows + n, files + replaced
            db.rows(conn, "erasure_archive_done", {"id": erasure["id"], "rows": rows})
            done.append(ErasedInArchive(erasure["id"], rows, files))
    return done


def _event_match(erasure: dict[str, Any]) -> Column:
    named = F.lit(False)
    if erasure["group_key"] is not None:
        named = named | (F.col("group_key") == erasure["group_key"])
    return _in_queues(erasure) & (named | _key_named(erasure))


def _key_named(erasure: dict[str, Any]) -> Column:
    named = F.lit(False)
    if erasure["item_keys"]:
        named = named | F.col("item_key").isin(list(erasure["item_keys"]))
    if erasure["item_key_prefix"] is not None:
        named = named | F.col("item_key").startswith(erasure["item_key_prefix"])
    return named


def _in_queues(erasure: dict[str, Any]) -> Column:
    return F.lit(True) if erasure["queues"] is None else F.col("queue").isin(list(erasure["queues"]))


def _erase_location(
    spark: SparkSession, location: str, erasure: dict[str, Any], hashed: Callable[[str], str]
) -> tuple[int, int]:
    files = layout.Files(spark)
    current = manifest.read(files, location)
    if current is None:
        return 0, 0
    events = manifest.read_files(spark, location, "events", current.files["events"])
    timeline = manifest.read_files(spark, location, "timeline", current.files["timeline"])
    matched: list[Any] = []
    if events is not None:
        matched = events.where(_event_match(erasure)).select("queue", "item_key", "group_key").distinct().collect()
    keys = {(row["queue"], row["item_key"]) for row in matched}
    if timeline is not None:
        direct = timeline.where(_in_queues(erasure) & _key_named(erasure)).select("queue", "item_key")
        keys |= {(row["queue"], row["item_key"]) for row in direct.distinct().collect()}
    if not keys:
        return 0, 0
    values = {item_key for _, item_key in keys} | {row["group_key"] for row in matched if row["group_key"]}
    mapping = F.create_map(*[F.lit(x) for value in sorted(values) for x in (value, hashed(value))])
    key_match = F.concat_ws("\u0000", "queue", "item_key").isin(sorted(f"{q}\u0000{k}" for q, k in keys))
    rows = replaced = 0
    for table, frame, match in (("events", events, _event_match(erasure)), ("timeline", timeline, key_match)):
        if frame is None:
            continue
        paths = {row[0] for row in frame.where(match).select(F.input_file_name()).distinct().collect()}
        names = [name for name in current.files[table] if any(path.endswith("/" + name) for path in paths)]
        swaps: dict[str, list[str]] = {}
        for name in names:
            merged, n = _rewrite(spark, files, layout.table_root(location, table), name, table, match, mapping)
            swaps[merged] = [name]
            rows += n
        if swaps:
            manifest.replace(files, location, table, swaps, erased=True)
            replaced += len(swaps)
    return rows, replaced


def _erased(table: str, frame: DataFrame, match: Column, mapping: Column) -> DataFrame:
    """`frame` with the values of its matching rows replaced (columns in the file's order)."""
    details = F.udf(erased_details, StringType(), useArrow=False)  # no pandas or pyarrow needed
    changes: dict[str, Column] = {"item_key": F.element_at(mapping, F.col("item_key"))}
    if table == "events":
        changes |= {
            "group_key": F.when(F.col("group_key").isNotNull(), F.element_at(mapping, F.col("group_key"))),
            "data": F.lit("{}"),
            "last_error": F.when(F.col("last_error").isNotNull(), F.lit("erased")),
            "enqueued_by": _erased_actor(F.col("enqueued_by")),
        }
    else:
        changes |= {"details": details(F.col("details")), "actor": _erased_actor(F.col("actor"))}
    columns = [c for c in frame.columns if c not in ("queue", "date")]  # they are the directory's
    return frame.select(
        *[F.when(match, changes[c]).otherwise(F.col(c)).alias(c) if c in changes else F.col(c) for c in columns]
    )


def _erased_actor(actor: Column) -> Column:
    """As tickler_erased_actor in the database: a schedule's principal `schedule:{key}` holds the
    key its occurrences' keys start with; it becomes `schedule:erased`."""
    return F.when(actor.startswith("schedule:"), F.lit("schedule:erased")).otherwise(actor)


def _rewrite(
    spark: SparkSession, files: layout.Files, root: str, name: str, table: str, match: Column, mapping: Column
) -> tuple[str, int]:
    """Write the file `name` (under `root`) again with its matching rows erased, checked, beside it
    (unlisted until the manifest says so); its new name, and how many rows changed."""
    old = spark.read.option("basePath", root).parquet(f"{root}/{name}")
    changed = old.where(match).count()
    target = write_checked(
        spark,
        files,
        root,
        name.rpartition("/")[0],
        old,
        _erased(table, old, match, mapping),
        work_prefix=_PENDING,
        name="erased",
        mismatch=f"erasure of {table}/{name}: the rewritten file differs from it; nothing changed",
    )
    return target, changed
