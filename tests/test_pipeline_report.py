"""The report job on a small history with known answers, read via each available source."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.test_pipeline_support import (
    PERIOD,
    Event,
    add_queue,
    at,
    check_known_answers,
    known_history,
    save,
    sources,
)
from tickler.pipeline.archive import run_archive
from tickler.pipeline.period import Period
from tickler.pipeline.report import load_history, run_report
from tickler.pipeline.source import Source
from tickler.pipeline.spark import PipelineError

# The first test also pays for starting Spark, which takes a minute on a busy 2-core machine.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("pipeline_db"), pytest.mark.timeout(300)]


def report(spark: Any, url: str, out: Path, kind: str = "snapshot") -> dict[str, list[dict[str, Any]]]:
    since, until = (date.fromisoformat(d) for d in PERIOD)
    with Source(spark, url, mode=kind) as source:
        assert source.kind == kind
        return run_report(spark, source, out, Period(since, until), top=5).tables


def history(raw: psycopg.Connection[Any], shape: Callable[[Event], Event] = lambda event: event) -> None:
    add_queue(raw, "emails")
    add_queue(raw, "sms")
    save(raw, [shape(event) for event in known_history()])


def test_report_counts_lateness_and_failures(spark: Any, database_url: str, raw: Any, tmp_path: Path) -> None:
    history(raw)
    for kind in sources(database_url):
        check_known_answers(report(spark, database_url, tmp_path / kind, kind))
    # the outputs: Parquet tables and one page that needs nothing from the network
    out = tmp_path / "snapshot"
    for table in ("daily", "summary", "lateness_histogram", "top_failures"):
        assert spark.read.parquet(str(out / table)).count() > 0
    page = (out / "report.html").read_text()
    assert page.count("<svg") == 6
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in page and "<script" not in page and "<link" not in page
    assert "Daily volumes by outcome" in page and "ana" in page and "billing" in page


def one_row_per_attempt(event: Event) -> Event:
    """The event as migration 0016 stores it: each `claimed` entry in the row that ended its lease."""
    entries, claim = [], None
    for when, action, actor, schedule_on, details in event.entries:
        if action == "claimed":
            claim = (when, actor, schedule_on)
            continue
        if claim is not None:
            carried = {"ago": (when - claim[0]).total_seconds(), "lease_seconds": 30}
            carried |= {"by": claim[1]} if claim[1] != actor else {}
            carried |= {"schedule_on": claim[2].isoformat()} if claim[2] != schedule_on else {}
            details, claim = details | {"claim": carried}, None
        entries.append((when, action, actor, schedule_on, details))
    event.entries = entries
    return event


def test_claims_in_the_rows_ending_them_count_alike(spark: Any, database_url: str, raw: Any, tmp_path: Path) -> None:
    history(raw, one_row_per_attempt)
    check_known_answers(report(spark, database_url, tmp_path))


def test_report_of_an_empty_database(spark: Any, database_url: str, tmp_path: Path) -> None:
    tables = report(spark, database_url, tmp_path)
    assert all(rows == [] for rows in tables.values())
    assert "nothing in this period" in (tmp_path / "report.html").read_text()


def test_jdbc_needs_tcp_or_says_so(spark: Any, database_url: str) -> None:
    if "jdbc" in sources(database_url):
        pytest.skip("this database is on TCP and the driver is here")
    with pytest.raises(PipelineError, match="jdbc"):
        Source(spark, database_url, mode="jdbc")


# Deliveries whose lateness has a long tail and no two values alike: percentile_approx (accuracy
# 10,000) was already off on the 8,000 of one queue here.
_MANY_DELIVERIES = """
WITH d AS (
    SELECT i,
           CASE WHEN i %% 3 = 0 THEN 'sms' ELSE 'emails' END AS queue,
           timestamptz '2026-11-02 00:00:00+00' + (i %% 2) * interval '1 day' + (i %% 86000) * interval '1 second'
               AS asked,
           -- a long tail: most within a second, a few an hour late; microseconds keep values distinct
           make_interval(secs => power(((i * 7919) %% 30011) / 30011.0, 12) * 3600 + i / 1000000.0) AS late
    FROM generate_series(1, %(n)s) AS i
), e AS (
    INSERT INTO tickler_event (queue, item_key, schedule_on, data, enqueued_on, enqueued_by, dequeued_on,
                               dequeued_by, outcome, redeliver_count, max_attempts)
    SELECT queue, 'k' || i, asked, '{}', asked - (i %% 7) * interval '1 minute', 'p', asked + late, 'w',
           'delivered', i %% 3, 5
    FROM d
    RETURNING id, queue, item_key, schedule_on, enqueued_on, dequeued_on
)
INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on)
SELECT queue, item_key, id, enqueued_on, 'enqueued', 'p', schedule_on FROM e
UNION ALL
SELECT queue, item_key, id, dequeued_on, 'delivered', 'w', schedule_on FROM e
"""

_EXACT = """
SELECT e.queue, (t.at AT TIME ZONE 'UTC')::date AS day, {p} AS p,
       percentile_disc({p}) WITHIN GROUP (ORDER BY extract(epoch FROM t.at - e.schedule_on)) AS lateness,
       percentile_disc({p}) WITHIN GROUP (ORDER BY extract(epoch FROM t.at - e.enqueued_on)) AS enqueue_to_delivery
FROM tickler_timeline t JOIN tickler_event_all e ON e.id = t.event_id
WHERE t.action = 'delivered'
GROUP BY ROLLUP (e.queue, (t.at AT TIME ZONE 'UTC')::date)
HAVING e.queue IS NOT NULL
"""


def test_percentiles_are_exact_and_the_same_on_every_run(
    spark: Any,
    database_url: str,
    raw: Any,
    tmp_path: Path,
) -> None:
    add_queue(raw, "emails")
    add_queue(raw, "sms")
    raw.execute(_MANY_DELIVERIES, {"n": 12_000})
    expected = {}
    for p in (0.5, 0.95, 0.99):
        for queue, day, _, lateness, to_delivery in raw.execute(_EXACT.format(p=p)):
            expected[(queue, day, round(p * 100))] = (float(lateness), float(to_delivery))
    # a shuffle unlike the other tests': exact figures do not depend on how rows meet
    spark.conf.set("spark.sql.shuffle.partitions", "3")
    try:
        tables = report(spark, database_url, tmp_path)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", "4")
    found = {}
    for row in [*tables["daily"], *({**r, "day": None} for r in tables["summary"])]:
        for p in (50, 95, 99):
            found[(row["queue"], row["day"], p)] = (row[f"lateness_p{p}_s"], row[f"enqueue_to_delivery_p{p}_s"])
    # every group with deliveries, and no figures for a group without (a day of enqueues only)
    assert {key for key, values in found.items() if values != (None, None)} == set(expected)
    for key, (lateness, to_delivery) in expected.items():
        assert found[key] == (pytest.approx(lateness, abs=1e-6), pytest.approx(to_delivery, abs=1e-6)), key


def test_a_rerun_of_one_day_replaces_only_that_day(spark: Any, database_url: str, raw: Any, tmp_path: Path) -> None:
    history(raw)
    for period in (Period(date(2026, 11, 1), date(2026, 11, 8)), Period(date(2026, 11, 3), date(2026, 11, 4))):
        with Source(spark, database_url, mode="snapshot") as source:
            run_report(spark, source, tmp_path, period, top=5)
    daily = spark.read.parquet(str(tmp_path / "daily"))
    days = sorted({(r["queue"], r["day"]) for r in daily.collect()})
    assert days == [("emails", "2026-11-01"), ("emails", "2026-11-02"), ("emails", "2026-11-03"),
                    ("emails", "2026-11-04"), ("sms", "2026-11-02")]  # fmt: skip
    assert daily.count() == len(days)  # the rerun's day replaced, not added
    periods = {r["period"] for r in spark.read.parquet(str(tmp_path / "summary")).collect()}
    assert periods == {"2026-11-01_2026-11-08", "2026-11-03_2026-11-04"}


def test_a_report_of_some_days_reads_only_what_they_need(
    spark: Any, database_url: str, raw: Any, tmp_path: Path
) -> None:
    """A 2-day report read all of history (89 s for 2 days, 78 s for 31). The days before the period
    are not read from the archive, and the filters reach PostgreSQL; the figures are those of the
    same days in a report of the whole period."""
    history(raw)
    run_archive(spark, database_url, location=str(tmp_path / "archive"), cutoff=at("2026-11-03 00:00:00"))
    whole = report(spark, database_url, tmp_path / "whole")
    days = Period(date(2026, 11, 3), date(2026, 11, 5))
    for kind in sources(database_url):
        with Source(spark, database_url, mode=kind) as source:
            events, timeline = load_history(spark, source, days)
            plan = events._jdf.queryExecution().executedPlan().toString()
            if kind == "jdbc":  # the range is in the query PostgreSQL runs
                assert "PushedFilters: [" in plan and "dequeued_on" in plan.split("PushedFilters: [", 1)[1]
            # every archived event finished on 2026-11-02: none of its files is opened
            assert not [f for f in events.inputFiles() + timeline.inputFiles() if "date=2026-11-02" in f]
            tables = run_report(spark, source, tmp_path / f"days-{kind}", days, top=5).tables
        expected = [r for r in whole["daily"] if days.since <= r["day"] < days.until]
        assert tables["daily"] == expected, kind
