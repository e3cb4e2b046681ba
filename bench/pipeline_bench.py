"""The pipeline's figures: the import of 1,000,000 CSV rows beside a plain COPY of the same file (into
a bare table and into a copy of tickler_event with its indexes), the report over 10,000,000 events,
the archive of 1,000,000 events. Needs pyspark and Java, so it is not part of `python -m bench`.

    python -m bench.pipeline_bench [--events N] [--import-rows N] [--archive-events N] [--no-write]

Runs against the PostgreSQL at --admin-url (default postgresql://postgres@127.0.0.1:5432/postgres) in a
database of its own, dropped at the end; stores its rows as the `pipeline` entry of
docs/benchmarks.json and rewrites docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from bench import report
from bench.harness import DEFAULT_URL, Row, database, say

DAYS = 30

_QUEUES = """
INSERT INTO tickler_queue (name, delivery_mode, lease_seconds, max_attempts, backoff_initial_seconds,
                           backoff_max_seconds, backoff_multiplier)
SELECT name, 'pull', 30, 5, 1, 3600, 2 FROM unnest(CAST(%(names)s AS text[])) AS name
"""

# One slice of the generated history: 90% delivered at once, 5% after one failure, 3% cancelled,
# 2% dead; lateness 0-10 s (plus the backoff for the retried ones), over DAYS days, 4 queues.
_EVENTS = """
INSERT INTO tickler_event (queue, item_key, group_key, schedule_on, data, enqueued_on, enqueued_by,
                           dequeued_on, dequeued_by, outcome, redeliver_count, max_attempts)
SELECT 'q' || (mod(g, 4)), 'k' || g, CASE WHEN mod(g, 10) = 0 THEN 'group-' || (mod(g, 5000)) END,
       at, '{}', at - interval '1 hour', 'service-' || (mod(g, 7)),
       CASE WHEN mod(g, 100) < 95 THEN at + (mod(g, 1000)) * interval '10 ms' + CASE WHEN mod(g, 100) >= 90
                                   THEN interval '60 s' ELSE interval '0' END
            WHEN mod(g, 100) < 98 THEN at - interval '30 min'
            ELSE at + interval '5 s' END,
       CASE WHEN mod(g, 100) < 95 THEN 'worker-' || (mod(g, 8)) WHEN mod(g, 100) < 98 THEN 'service-' || (mod(g, 7))
            ELSE 'worker-' || (mod(g, 8)) END,
       CASE WHEN mod(g, 100) < 95 THEN 'delivered' WHEN mod(g, 100) < 98 THEN 'cancelled' ELSE 'dead' END,
       CASE WHEN mod(g, 100) BETWEEN 90 AND 94 THEN 1 ELSE 0 END, 5
FROM generate_series(CAST(%(first)s AS bigint), %(last)s) AS g
CROSS JOIN LATERAL (SELECT CAST(%(start)s AS timestamptz) + (g * %(span)s / %(n)s) * interval '1 second' AS at) AS t
"""

_TIMELINE = """
INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
SELECT e.queue, e.item_key, e.id, x.at, x.action, x.actor, e.schedule_on, x.details
FROM tickler_event_all AS e
CROSS JOIN LATERAL (VALUES
    (e.enqueued_on, 'enqueued', e.enqueued_by, jsonb_build_object('max_attempts', 5), true),
    (e.schedule_on, 'claimed', e.dequeued_by, jsonb_build_object('attempt', 1), e.outcome <> 'cancelled'),
    (e.schedule_on + interval '5 s', 'failed', e.dequeued_by, jsonb_build_object('attempt', 1, 'error', 'HTTP 500'),
     e.redeliver_count = 1),
    (e.schedule_on + interval '60 s', 'claimed', e.dequeued_by, jsonb_build_object('attempt', 2),
     e.redeliver_count = 1),
    (e.dequeued_on, e.outcome, e.dequeued_by, '{}', true)
) AS x (at, action, actor, details, wanted)
WHERE x.wanted AND e.id BETWEEN %(first)s AND %(last)s
"""


# The baseline: a plain table with no index, constraint or trigger. The import's yardstick: a copy
# of tickler_event with all its indexes and constraints (no triggers, so no counters and no timeline).
BARE = "CREATE TABLE bench_copy (queue text, item_key text, group_key text, schedule_on timestamptz, data jsonb)"
INDEXED = (
    "CREATE TABLE bench_copy (LIKE tickler_event INCLUDING ALL);"
    " ALTER TABLE bench_copy ALTER enqueued_by SET DEFAULT 'bench', ALTER max_attempts SET DEFAULT 5"
)


@contextmanager
def _timer() -> Iterator[list[float]]:
    box: list[float] = []
    start = time.perf_counter()
    yield box
    box.append(time.perf_counter() - start)


def generate_history(url: str, events: int) -> dict[str, float]:
    """`events` finished events over the last DAYS days, with their timelines, written server-side."""
    start = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=DAYS)
    with psycopg.connect(url, autocommit=True) as conn, _timer() as took:
        conn.execute("SET synchronous_commit = off")
        conn.execute(_QUEUES, {"names": ["q0", "q1", "q2", "q3", "imports"]})
        step = 1_000_000
        for first in range(1, events + 1, step):
            last = min(events, first + step - 1)
            params = {"first": first, "last": last, "start": start, "span": DAYS * 86400, "n": events}
            conn.execute(_EVENTS, params)
            conn.execute(_TIMELINE, params)
            say(f"  history: {last:,} events")
        conn.execute("VACUUM ANALYZE tickler_event")
        conn.execute("VACUUM ANALYZE tickler_timeline")
        entries = conn.execute("SELECT count(*) FROM tickler_timeline").fetchone()
    assert entries is not None
    return {"seconds": took[0], "timeline_entries": float(entries[0])}


def write_campaign(path: Path, rows: int) -> None:
    when = (datetime.now(UTC) + timedelta(days=7)).replace(microsecond=0)
    with path.open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(["queue", "item_key", "group_key", "schedule_on", "data"])
        for n in range(rows):
            at = (when + timedelta(seconds=n % 86400)).isoformat().replace("+00:00", "Z")
            writer.writerow(["imports", f"campaign:{n}", None, at, f'{{"n":{n},"email":"user{n}@example.com"}}'])


def timed_copy(url: str, path: Path, create: str, columns: str = "") -> float:
    """Seconds to COPY the file into the table bench_copy that `create` makes (dropped afterwards)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(create)
        with (
            path.open("rb") as f,
            _timer() as took,
            conn.cursor().copy(f"COPY bench_copy {columns} FROM STDIN (FORMAT csv, HEADER)") as copy,
        ):
            while block := f.read(1 << 20):
                copy.write(block)
        conn.execute("DROP TABLE bench_copy")
    return took[0]


def write_only(url: str, path: Path, batch_rows: int = 10_000) -> float:
    """The import's write statement alone (pipeline/queries.sql: import_write, through
    tickler_schedule()), batch by batch as the import runs it, on the same rows under another queue
    (`imports-w`): the seconds of the statements only, not of filling the staging table."""
    from tickler.pipeline import db

    with path.open(newline="", encoding="utf-8") as f:
        rows = [(n, "imports-w", *cells) for n, (_q, *cells) in enumerate(csv.reader(f)) if n > 0]
    params = {"actor": "bench", "on_conflict": "reject", "debounce_max_seconds": None}
    spent = 0.0
    with psycopg.connect(url) as conn:
        conn.execute(_QUEUES, {"names": ["imports-w"]})
        conn.commit()
        for start in range(0, len(rows), batch_rows):
            with conn.transaction():
                conn.execute(db.q("import_staging"))
                with conn.cursor().copy(
                    "COPY tickler_import_staging (ord, queue, item_key, group_key, schedule_on, data) FROM STDIN"
                ) as copy:
                    for row in rows[start : start + batch_rows]:
                        copy.write_row([cell or None for cell in row])
                began = time.perf_counter()
                conn.execute(db.q("import_analyze"))
                conn.execute(db.q("import_write"), params).fetchall()
                spent += time.perf_counter() - began
    return spent


def measure_import(spark: Any, url: str, work: Path, rows: int) -> dict[str, float]:
    """Seconds for the import of a generated campaign file, and for the two COPYs of the same file."""
    from tickler.pipeline.importer import check_only, run_import

    campaign = work / "campaign.csv"
    write_campaign(campaign, rows)
    plain = timed_copy(url, campaign, BARE)
    indexed = timed_copy(url, campaign, INDEXED, "(queue, item_key, group_key, schedule_on, data)")
    say(f"COPY of {rows:,} rows: {plain:.1f} s into a bare table, {indexed:.1f} s into an indexed one")
    load = os.getloadavg()[0]
    with _timer() as imported:
        loaded = run_import(spark, url, str(campaign), principal="bench", rejects_path=str(work / "rejects.csv"))
    say(f"import in {imported[0]:.1f} s: {loaded.counts}")
    assert loaded.counts["created"] == rows, loaded.counts
    # The profile of the floor: the import's Spark side alone (read, number, spread by key, the row
    # checks, the lines to Python), nothing written; the rest of the import's time is the writes.
    with _timer() as checked:
        _, vouched = check_only(
            spark, str(campaign), queues=frozenset({"imports"}), max_data_bytes=256 * 1024,
            partitions=2 * spark.sparkContext.defaultParallelism,
        )  # fmt: skip
    say(f"the Spark side alone in {checked[0]:.1f} s; {vouched:,} rows vouched for on the JVM")
    writes = write_only(url, campaign)
    say(f"the write statements alone in {writes:.1f} s")
    return {"import": imported[0], "plain": plain, "indexed": indexed, "load": load, "checks": checked[0],
            "vouched": float(vouched), "writes": writes}  # fmt: skip


def import_rows(figures: dict[str, float], rows: int) -> list[Row]:
    """The import and its two parts alone, each beside the COPY into the indexed copy of tickler_event."""
    copy, bare = rows / figures["indexed"], f"COPY into a bare table: {rows / figures['plain']:,.0f} rows/s"
    jvm = f"{figures['vouched']:,.0f} rows vouched for on the JVM"
    parts = (
        ("import (CSV, every row checked, on_conflict reject)", "import", bare),
        ("the import's Spark side alone (read, number, spread by key, row checks; nothing written)", "checks", jvm),
        ("the import's write statements alone (import_write per 10,000 rows)", "writes", ""),
    )
    return [
        Row(f"pipeline: {what}, {rows:,} rows", rows / figures[key], copy, "rows/s", "-", None, note=note)
        for what, key, note in parts
    ]


def java_version() -> str:
    try:
        run = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False)
    except OSError:
        return "Java ?"
    return (run.stderr.splitlines() or ["Java ?"])[0]


def run(args: argparse.Namespace) -> tuple[list[Row], str, str]:
    """The rows, the machine, and what to note of the run."""
    import pyspark

    from tickler.pipeline.archive import run_archive
    from tickler.pipeline.period import Period
    from tickler.pipeline.report import run_report
    from tickler.pipeline.source import Source
    from tickler.pipeline.spark import create_session, jdbc_jar

    with database(args.admin_url) as url, tempfile.TemporaryDirectory(prefix="tickler-bench-") as scratch:
        work = Path(scratch)
        with _timer() as started:
            spark = create_session("local[*]", jar=jdbc_jar(), driver_memory=args.driver_memory)
        spark_is = f"Spark {pyspark.__version__} local[*], driver memory {args.driver_memory}, {java_version()}"
        facts = report.machine(url, spark_is)
        say(f"spark up in {started[0]:.1f} s; generating {args.events:,} events")
        history = generate_history(url, args.events)
        say(f"history written in {history['seconds']:.0f} s")

        period = Period(date.today() - timedelta(days=DAYS + 1), date.today() + timedelta(days=1))
        with _timer() as reported, Source(spark, url) as source:
            result = run_report(spark, source, work / "report", period)
        delivered = sum(row["delivered"] for row in result.tables["summary"])
        say(f"report in {reported[0]:.0f} s ({delivered:,} deliveries)")

        with _timer() as archived:
            [archive] = run_archive(
                spark, url, location=str(work / "archive"), cutoff=datetime.now(UTC), limit=args.archive_events
            )
        say(f"archive of {archive.events:,} events in {archived[0]:.0f} s")

        figures = measure_import(spark, url, work, args.import_rows)
        spark.stop()

    n, entries = args.events, history["timeline_entries"]
    rows = [
        *import_rows(figures, args.import_rows),
        Row(f"pipeline: report (all tables + HTML), {n:,} events, {entries:,.0f} timeline entries", n / reported[0],
            None, "events/s", "-", None, note=f"{reported[0]:.0f} s"),
        Row(f"pipeline: archive (write, verify, delete), {archive.events:,} events, {archive.timeline:,} timeline "
            "entries", archive.events / archived[0], None, "events/s", "-", None, note=f"{archived[0]:.0f} s"),
    ]  # fmt: skip
    note = f"Spark session start {started[0]:.1f} s, not included; load average {figures['load']:.1f} at the import"
    return rows, facts, note


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--admin-url", default=DEFAULT_URL)
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--import-rows", type=int, default=1_000_000)
    parser.add_argument("--archive-events", type=int, default=1_000_000)
    parser.add_argument("--driver-memory", default="6g")
    parser.add_argument("--no-write", action="store_true", help="print the rows, leave docs/ alone")
    args = parser.parse_args()
    began = time.monotonic()
    rows, facts, note = run(args)
    print(report.table(rows))
    if not args.no_write:
        results = report.load()
        seconds = time.monotonic() - began
        results["pipeline"] = report.record(
            rows, seconds, machine=facts, server="", cluster="local", load=None, note=note
        )
        report.save(results)
        report.write(results)


if __name__ == "__main__":
    main()
