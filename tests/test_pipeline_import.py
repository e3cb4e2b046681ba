"""The import job: rules, rejects, conflicts under each on_conflict mode, reruns, CSV and Parquet."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.test_pipeline_support import (
    add_queue,
)
from tickler.pipeline.cli import main as pipeline_main
from tickler.pipeline.importer import run_import
from tickler.pipeline.spark import PipelineError
from tickler.pipeline.validate import FIELDS

# The first test also pays for starting Spark, which takes a minute on a busy 2-core machine.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("pipeline_db"), pytest.mark.timeout(300)]

FUTURE = (datetime.now(UTC) + timedelta(days=7)).replace(microsecond=0)
WHEN = FUTURE.isoformat().replace("+00:00", "Z")

# (row, values, expected reason or None): rows 1-10 are good, 11- are not.
ROWS: list[dict[str, str]] = [
    {"item_key": "welcome:ana@example.com", "schedule_on": WHEN, "data": '{"name": "Ana"}', "group_key": "ana"},
    {"item_key": "welcome:bo@example.com", "schedule_on": "2030-01-01T09:00:00+02:00", "data": "{}",
     "max_attempts": "3"},
    {"item_key": "later", "delay_seconds": "3600", "data": '{"multi":\n"line"}'},
    {"item_key": "now", "data": "{}"},
    {"item_key": "ünïcødé:+@", "data": '{"emoji": "🙂"}', "queue": "sms"},
    *[{"item_key": f"bulk-{n}", "schedule_on": WHEN, "data": f'{{"n": {n}}}'} for n in range(5)],
    {"item_key": "bad/key", "data": "{}"},
    {"item_key": "", "data": "{}"},
    {"item_key": "space key", "data": "{}"},
    {"item_key": "no-offset", "schedule_on": "2030-01-01T09:00:00", "data": "{}"},
    {"item_key": "both", "schedule_on": WHEN, "delay_seconds": "5", "data": "{}"},
    {"item_key": "negative", "delay_seconds": "-1", "data": "{}"},
    {"item_key": "list", "data": "[1, 2]"},
    {"item_key": "no-data"},
    {"item_key": "nan", "data": '{"x": NaN}'},
    {"item_key": "big", "data": json.dumps({"x": "y" * 2000})},
    {"item_key": "attempts", "data": "{}", "max_attempts": "0"},
    {"item_key": "nowhere", "data": "{}", "queue": "missing"},
    {"item_key": "huge", "data": '{"x": 1e400}'},
    {"item_key": "twice", "data": '{"a": 1, "a": 2}'},
    {"item_key": "welcome:ana@example.com", "data": '{"again": true}'},
]  # fmt: skip
GOOD = 10
REASONS = {
    11: "item_key: Must not contain '/'",
    12: "item_key: Missing data",
    13: "item_key: Must not contain '/', whitespace",
    14: "schedule_on: Must be an RFC 3339 date-time with an offset",
    15: "schedule_on: Give schedule_on or delay_seconds, not both.",
    16: "delay_seconds: Must be greater than or equal to 0",
    17: "data: Must be a JSON object.",
    18: "data: Missing data",
    19: "data: Not valid JSON.",
    20: "data: Event data is",
    21: "max_attempts: Must be greater than or equal to 1",
    22: "queue: No queue named 'missing'.",
    23: "data: Not valid JSON.",  # 1e400: beyond a float, as the API refuses it
    24: "data: Not valid JSON.",  # a key twice, as the API refuses it
    25: "duplicate: Row 1 has the same queue and item_key.",
}


def write_csv(path: Path, rows: list[dict[str, str]]) -> str:
    with path.open("w", newline="", encoding="utf-8") as out:
        writer = csv.DictWriter(out, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    return str(path)


def rejects(path: Path) -> dict[int, dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return {int(row["row"]): row for row in csv.DictReader(f)}


def one(raw: psycopg.Connection[Any], query: str, *params: Any) -> Any:
    row = raw.execute(query, params).fetchone()
    assert row is not None
    return row[0]


@pytest.fixture
def queues(raw: psycopg.Connection[Any]) -> None:
    add_queue(raw, "emails", max_attempts=7)
    add_queue(raw, "sms")


def do_import(spark: Any, url: str, source: str, tmp_path: Path, on_conflict: str = "reject", **kw: Any) -> Any:
    return run_import(
        spark, url, source, principal="campaign-bot", on_conflict=on_conflict, queue="emails",
        rejects_path=str(tmp_path / f"rejects-{on_conflict}.csv"), partitions=3, max_data_bytes=1024, **kw,
    )  # fmt: skip


@pytest.mark.usefixtures("queues")
def test_import_validates_each_row_and_loads_the_good_ones(
    spark: Any, database_url: str, raw: psycopg.Connection[Any], tmp_path: Path
) -> None:
    source = write_csv(tmp_path / "campaign.csv", ROWS)
    result = do_import(spark, database_url, source, tmp_path)
    assert result.counts == {"created": GOOD, "replaced": 0, "debounced": 0, "ignored": 0, "rejected": 0, "invalid": 14,
                             "duplicate": 1}  # fmt: skip
    found = rejects(result.rejects_path)
    assert sorted(found) == sorted(REASONS)
    for row, reason in REASONS.items():
        assert found[row]["reason"].startswith(reason), (row, found[row])
    assert found[25]["data"] == '{"again": true}'  # the row as it came, to fix and import again

    events = {r[0]: r[1:] for r in raw.execute(
        "SELECT item_key, queue, group_key, schedule_on, data, enqueued_by, max_attempts, enqueued_on"
        " FROM tickler_event_all"
    )}  # fmt: skip
    assert len(events) == GOOD
    ana = events["welcome:ana@example.com"]
    assert ana[:6] == ("emails", "ana", FUTURE, {"name": "Ana"}, "campaign-bot", 7)  # the queue's max_attempts
    bo = events["welcome:bo@example.com"]
    assert (bo[2], bo[5]) == (datetime(2030, 1, 1, 7, tzinfo=UTC), 3)
    later = events["later"]
    assert later[2] - later[6] == timedelta(hours=1)  # delay_seconds counts from the database clock
    assert later[3] == {"multi": "line"}
    assert events["ünïcødé:+@"][0] == "sms"
    # the timeline has what the API would have written
    entries = raw.execute(
        "SELECT t.action, t.actor, t.schedule_on = e.schedule_on, t.at = e.enqueued_on, t.details"
        " FROM tickler_timeline t JOIN tickler_event_all e ON e.id = t.event_id"
        " WHERE e.item_key = 'welcome:ana@example.com'"
    ).fetchall()  # fmt: skip
    assert entries == [("enqueued", "campaign-bot", True, True, {"group_key": "ana", "max_attempts": 7})]
    assert one(raw, "SELECT count(*) FROM tickler_timeline") == GOOD
    assert one(raw, "SELECT sum(n) FROM tickler_queue_count WHERE state = 'open'") == GOOD

    # the same import again changes nothing: every good row now conflicts
    again = do_import(spark, database_url, source, tmp_path)
    assert (again.counts["created"], again.counts["rejected"], again.counts["invalid"]) == (0, GOOD, 14)
    assert rejects(again.rejects_path)[1]["reason"] == "conflict: An open event already has this key."
    assert one(raw, "SELECT count(*) FROM tickler_timeline") == GOOD


@pytest.mark.usefixtures("queues")
def test_ignore_and_replace(spark: Any, database_url: str, raw: psycopg.Connection[Any], tmp_path: Path) -> None:
    rows = [{"item_key": f"k{n}", "schedule_on": WHEN, "data": '{"v": 1}'} for n in range(6)]
    source = write_csv(tmp_path / "first.csv", rows)
    assert do_import(spark, database_url, source, tmp_path).counts["created"] == 6
    # k0 is in flight, k1 finished (its key is free again)
    raw.execute(
        "UPDATE tickler_event SET claimed_on = now(), claimed_by = 'w', lease_id = gen_random_uuid(),"
        " lease_expires_on = now() + interval '1 minute' WHERE item_key = 'k0'"
    )
    raw.execute(
        "UPDATE tickler_event SET dequeued_on = now(), dequeued_by = 'w', outcome = 'delivered' WHERE item_key = 'k1'"
    )
    changed = write_csv(tmp_path / "second.csv", [{**row, "data": '{"v": 2}'} for row in rows])

    ignored = do_import(spark, database_url, changed, tmp_path, on_conflict="ignore")
    assert (ignored.counts["created"], ignored.counts["ignored"], ignored.rejects) == (1, 5, 0)
    assert one(raw, "SELECT count(*) FROM tickler_event_all WHERE data = '{\"v\": 2}'") == 1  # the new k1

    replaced = do_import(spark, database_url, changed, tmp_path, on_conflict="replace")
    assert (replaced.counts["replaced"], replaced.counts["rejected"]) == (5, 1)
    assert rejects(replaced.rejects_path)[1]["reason"].startswith("conflict: The open event with this key is in flight")
    versions = dict(raw.execute("SELECT item_key, version FROM tickler_event_all WHERE dequeued_on IS NULL").fetchall())
    assert versions == {"k0": 1, "k1": 2, "k2": 2, "k3": 2, "k4": 2, "k5": 2}
    assert one(raw, "SELECT data FROM tickler_event_all WHERE item_key = 'k0'") == {"v": 1}  # under a lease: untouched
    actions = raw.execute(
        "SELECT action, count(*) FROM tickler_timeline WHERE actor = 'campaign-bot' GROUP BY action ORDER BY action"
    ).fetchall()
    assert actions == [("enqueued", 7), ("replaced", 5)]
    assert one(raw, "SELECT count(*) FROM tickler_event_all") == 7


@pytest.mark.usefixtures("queues")
def test_debounce_as_the_api_does(spark: Any, database_url: str, raw: psycopg.Connection[Any], tmp_path: Path) -> None:
    rows = [{"item_key": f"d{n}", "delay_seconds": "30", "data": '{"v": 1}', "group_key": "g1"} for n in range(3)]
    assert do_import(spark, database_url, write_csv(tmp_path / "first.csv", rows), tmp_path).counts["created"] == 3
    raw.execute(
        "UPDATE tickler_event SET claimed_on = now(), claimed_by = 'w', lease_id = gen_random_uuid(),"
        " lease_expires_on = now() + interval '1 minute' WHERE item_key = 'd0'"
    )
    before = dict(raw.execute("SELECT item_key, schedule_on FROM tickler_event_all").fetchall())
    # d1 asks for a time within the cap, d2 for one past it; d3 is new
    later = [{**rows[0], "data": '{"v": 2}'},
             {**rows[1], "delay_seconds": "50", "data": '{"v": 2}', "group_key": "g2"},
             {**rows[2], "delay_seconds": "7200", "data": '{"v": 2}', "group_key": ""},
             {"item_key": "d3", "delay_seconds": "7200", "data": '{"v": 2}'}]  # fmt: skip
    second = write_csv(tmp_path / "second.csv", later)
    result = do_import(spark, database_url, second, tmp_path, on_conflict="debounce", debounce_max_seconds=3600)
    assert (result.counts["debounced"], result.counts["created"], result.counts["rejected"]) == (2, 1, 1)
    assert (
        rejects(result.rejects_path)[1]["reason"]
        == "conflict: The open event with this key is in flight; it cannot be debounced."
    )
    events = {r[0]: r[1:] for r in raw.execute(
        "SELECT item_key, data, group_key, schedule_on - enqueued_on, version FROM tickler_event_all"
    )}  # fmt: skip
    assert events["d0"] == ({"v": 1}, "g1", timedelta(seconds=30), 1)  # under a lease: untouched
    assert events["d1"][:2] == ({"v": 2}, "g2") and events["d1"][3] == 2  # latest wins
    assert timedelta(seconds=50) <= events["d1"][2] < timedelta(hours=1)
    assert events["d2"] == ({"v": 2}, None, timedelta(hours=1), 2)  # capped: first enqueued + 3600 s
    assert events["d3"][2] == timedelta(hours=2)  # a new key: created as asked, no cap
    entries = raw.execute(
        "SELECT item_key, actor, details ->> 'previous_schedule_on' FROM tickler_timeline"
        " WHERE action = 'debounced' ORDER BY item_key"
    ).fetchall()
    assert [(k, a) for k, a, _ in entries] == [("d1", "campaign-bot"), ("d2", "campaign-bot")]
    assert [datetime.fromisoformat(p) for _, _, p in entries] == [before["d1"], before["d2"]]


@pytest.mark.usefixtures("queues")
def test_a_nul_byte_in_a_quoted_cell_reaches_the_rules(
    spark: Any, database_url: str, raw: psycopg.Connection[Any], tmp_path: Path
) -> None:
    # the API refuses these bodies with 400: the import must not load them with the NUL removed
    source = tmp_path / "nul.csv"
    source.write_bytes(b'item_key,data\nnul:1,"{""t"": ""a\x00b""}"\n"nul\x00:2","{}"\nok,"{""t"": ""a\\\\b""}"\n')
    result = do_import(spark, database_url, str(source), tmp_path)
    assert (result.counts["created"], result.counts["invalid"]) == (1, 2)
    found = rejects(result.rejects_path)
    assert found[1]["reason"] == "data: Not valid JSON." and found[1]["data"] == '{"t": "a\x00b"}'
    assert found[2]["reason"].startswith("item_key: ") and found[2]["item_key"] == "nul\x00:2"
    assert one(raw, "SELECT data FROM tickler_event_all WHERE item_key = 'ok'") == {"t": "a\\b"}
    assert one(raw, "SELECT count(*) FROM tickler_event_all") == 1


@pytest.mark.usefixtures("queues")
def test_an_import_that_died_resumes_and_counts_each_row_once(
    spark: Any, database_url: str, raw: psycopg.Connection[Any], tmp_path: Path
) -> None:
    rows = [{"item_key": f"r{n}", "delay_seconds": "3600", "data": f'{{"n": {n}}}'} for n in range(40)]
    rows += [{"item_key": "bad/1", "data": "{}"}, {"item_key": "r0", "data": "{}"}]
    source = write_csv(tmp_path / "many.csv", rows)
    # partition 0 dies after committing two batches of 4 rows: those stay, and are visible
    with pytest.raises(Exception, match="simulated crash"):
        do_import(spark, database_url, source, tmp_path, batch_rows=4, crash_after_batches=2)
    loaded = one(raw, "SELECT count(*) FROM tickler_event_all")
    assert 8 <= loaded < 40
    # the same command again resumes: committed batches are skipped, not reported as conflicts
    result = do_import(spark, database_url, source, tmp_path, batch_rows=4)
    assert result.counts == {"created": 40, "replaced": 0, "debounced": 0, "ignored": 0, "rejected": 0, "invalid": 1,
                             "duplicate": 1}  # fmt: skip
    assert sorted(rejects(result.rejects_path)) == [41, 42]
    assert one(raw, "SELECT count(*) FROM tickler_event_all") == 40
    assert one(raw, "SELECT count(*) FROM tickler_timeline") == 40
    assert one(raw, "SELECT count(*) FROM tickler_import WHERE finished_on IS NOT NULL") == 1
    assert one(raw, "SELECT count(*) FROM tickler_import_batch") == 0  # the finished import's batches are gone
    # finished: running it once more is a new import, whose rows are now conflicts
    again = do_import(spark, database_url, source, tmp_path, batch_rows=4)
    assert (again.counts["created"], again.counts["rejected"]) == (0, 40)


@pytest.mark.usefixtures("queues")
def test_import_from_parquet(spark: Any, database_url: str, raw: psycopg.Connection[Any], tmp_path: Path) -> None:
    frame = spark.createDataFrame(
        [("p1", FUTURE, '{"a": 1}', 2), ("p2", datetime(2030, 1, 1, tzinfo=UTC), "{}", None), ("p/3", FUTURE, "{}", 1)],
        "item_key string, schedule_on timestamp, data string, max_attempts int",
    )
    frame.write.parquet(str(tmp_path / "campaign.parquet"))
    result = do_import(spark, database_url, str(tmp_path / "campaign.parquet"), tmp_path)
    assert (result.counts["created"], result.counts["invalid"]) == (2, 1)
    found = dict(raw.execute("SELECT item_key, schedule_on FROM tickler_event_all").fetchall())
    assert found == {"p1": FUTURE, "p2": datetime(2030, 1, 1, tzinfo=UTC)}


def test_unknown_columns_are_refused(spark: Any, database_url: str, tmp_path: Path) -> None:
    source = tmp_path / "odd.csv"
    source.write_text("item_key,data,colour\nk,{},red\n")
    with pytest.raises(PipelineError, match="unknown column"):
        do_import(spark, database_url, str(source), tmp_path)


@pytest.fixture
def small_csv(database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Three good rows and a bad one, for the command line (which finds the database in the environment)."""
    monkeypatch.setenv("TICKLER_DATABASE_URL", database_url)
    return write_csv(tmp_path / "small.csv", ROWS[:3] + ROWS[10:11])


@pytest.mark.usefixtures("queues", "spark")
def test_cli_import_prints_counts(small_csv: str, capsys: pytest.CaptureFixture[str]) -> None:
    source = small_csv
    status = pipeline_main(["import", source, "--principal", "ops", "--queue", "emails", "--master", "local[2]"])
    out = capsys.readouterr().out
    assert status == 0
    assert "created               3" in out and "invalid               1" in out
    assert f"rejects: {source}.rejects.csv (1 rows)" in out


@pytest.mark.usefixtures("queues", "spark")
def test_cli_json_summary_and_exit_codes(small_csv: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = small_csv
    common = ["--principal", "ops", "--queue", "emails", "--master", "local[2]", "--json"]
    assert pipeline_main(["import", source, *common]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out)  # stdout holds the summary and nothing else
    assert (summary["status"], summary["exit_code"], summary["job"]) == ("ok", 0, "import")
    assert summary["counts"]["created"] == 3 and summary["counts"]["invalid"] == 1
    assert summary["rejects"] == 1 and summary["rejects_file"] == f"{source}.rejects.csv"
    # a problem to fix: status 2, and still one JSON object on stdout
    assert pipeline_main(["import", str(tmp_path / "missing.csv"), *common]) == 2
    failed = json.loads(capsys.readouterr().out)
    assert (failed["status"], failed["exit_code"]) == ("failed", 2) and "no such file" in failed["error"]


def test_cli_says_in_one_line_what_is_missing(database_url: str, tmp_path: Path) -> None:
    env = {**os.environ, "TICKLER_DATABASE_URL": database_url, "JAVA_HOME": str(tmp_path / "no-java"),
           "PATH": str(tmp_path)}  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-m", "tickler.cli", "pipeline", "report", "--source", "snapshot"],
        capture_output=True, text=True, env=env, cwd=Path(__file__).parent.parent, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0
    assert "Java 17+ is needed" in run.stderr
    env["TICKLER_JDBC_JAR"] = str(tmp_path / "missing.jar")
    run = subprocess.run(
        [sys.executable, "-m", "tickler.cli", "pipeline", "report", "--source", "jdbc"],
        capture_output=True, text=True, env=env, cwd=Path(__file__).parent.parent, timeout=60, check=False,
    )  # fmt: skip
    assert (run.returncode, run.stderr.strip()) == (
        2,
        f"tickler pipeline: the JDBC driver jar {tmp_path}/missing.jar does not exist",
    )


@pytest.mark.usefixtures("queues", "spark")
def test_an_import_where_no_row_is_valid_exits_3(
    tmp_path: Path, raw: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch, database_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setenv("TICKLER_DATABASE_URL", database_url)
    source = write_csv(tmp_path / "bad.csv", ROWS[10:14])
    common = ["--principal", "ops", "--queue", "emails", "--master", "local[2]", "--json"]
    assert pipeline_main(["import", source, *common]) == 3
    summary = json.loads(capsys.readouterr().out)
    assert (summary["status"], summary["exit_code"], summary["rows"]) == ("failed", 3, 4)
    assert summary["counts"]["invalid"] == 4 and summary["rejects"] == 4
    assert "none of the 4 rows" in summary["error"]
    assert one(raw, "SELECT count(*) FROM tickler_event") == 0


@pytest.mark.usefixtures("queues", "spark")
def test_max_invalid_refuses_the_whole_file_before_writing(
    small_csv: str, raw: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["--principal", "ops", "--queue", "emails", "--master", "local[2]", "--json"]
    # one invalid row of four: more than 0, more than 20% (0 rows)
    for limit in ("0", "20%"):
        assert pipeline_main(["import", small_csv, *common, "--max-invalid", limit]) == 3
        summary = json.loads(capsys.readouterr().out)
        assert summary["error"] == (
            f"1 of the 4 rows of {small_csv} fail the row checks, more than --max-invalid {limit} allows; "
            "nothing was imported"
        )
        assert one(raw, "SELECT count(*) FROM tickler_event") == 0
    # within the limit (25% of 4 is 1): imported as without it
    assert pipeline_main(["import", small_csv, *common, "--max-invalid", "25%"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["counts"]["created"] == 3 and summary["counts"]["invalid"] == 1
    assert one(raw, "SELECT count(*) FROM tickler_event") == 3


# One change at a time to a row check_row accepts: the JVM's expressions (pipeline.plain_rows)
# may pass a row to check_row whatever it is, but must never vouch for one check_row refuses.
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
PLAIN_BASE = {"queue": "emails", "item_key": "k", "schedule_on": WHEN, "data": '{"a": 1}'}
AWKWARD: dict[str, list[str]] = {
    "data": [
        '{"a": 1.10}', '{"a": 1e5}', '{"a": 1E400}', '{"a": NaN}', '{"a": -Infinity}', '{"a": 01}', '{"a": -01}',
        '{"a": +1}', '{"a": .5}', '{"a": -}', "{'a': 1}", "{\"a\": 'x'}", '{"a": 1, "a": 2}', '{"a": "x\\u0000"}',
        '{"a": "\\ud800"}', '{"a": "tab\there"}', '{"a": "nul\x00"}', '{"a": tru}', '{"a": 1,}', '{"a" 1}',
        '{"a": 1} x', '{"a": 1}}', "[1]", '"x"', "{", '{"a": {"b": 1}}', '{"a": [1 2]}', '{"a": [1,]}',
        '{"a": "' + "y" * 2000 + '"}', '{"a": ' + "9" * 5000 + "}", '{/*c*/"a": 1}', '{"a": 1}{', "{a: 1}",
        '{"a": True}', '{"a": undefined}', "\t{}", "{}\n", '{"a": "\\/"}', '{"é": "ü"}', "{}", '{"a": -5}',
        '  {"a": true, "b": null, "c": [1, "x", false], "d": "it\'s"}  ',
    ],
    "item_key": ["a/b", "a b", ".", "..", "batch", "x" * 256, "é", "tab\t", "back\\slash", "x" * 255],
    "group_key": ["a/b", " ", "x" * 256, "g"],
    "queue": ["missing", "Emails", "sms"],
    "schedule_on": [
        "2030-02-30T00:00:00Z", "2030-01-01T24:00:00Z", "1969-12-31T23:59:59Z", "1970-01-01T00:30:00+01:00",
        "9999-01-01T00:00:00Z", "2030-01-01t09:00:00z", "2030-01-01T09:00:00.1234567Z", "2030-01-01T09:00:00+24:00",
        "2030-01-01 09:00:00Z", "2030-01-01T09:00:00", "2030-01-01T09:00:00.5-03:30",
    ],
    "delay_seconds": ["1e3", "1.5", "-1", "9999999999", "00", "3600", " 5"],
    "max_attempts": ["0", "1001", "1000", "3.0", "007", "1", "x"],
    "traceparent": [
        TRACEPARENT,
        TRACEPARENT.upper(),
        f" {TRACEPARENT}",
        "ff" + TRACEPARENT[2:],
        TRACEPARENT[:3] + "0" * 32 + TRACEPARENT[35:],
        TRACEPARENT[:36] + "0" * 16 + TRACEPARENT[52:],
        f"{TRACEPARENT}-x",
        "not a context",
    ],
}  # fmt: skip


def test_the_jvm_vouches_only_for_rows_the_rules_accept(spark: Any) -> None:
    from tickler.pipeline.plain_rows import plain
    from tickler.pipeline.validate import Invalid, check_row

    cases = [dict(PLAIN_BASE)]
    for field, values in AWKWARD.items():
        for value in values:
            row = dict(PLAIN_BASE, **{field: value})
            if field == "delay_seconds":
                row.pop("schedule_on")
            cases.append(row)
    cases.append(dict(PLAIN_BASE, delay_seconds="5"))  # both: refused
    records = [(n + 1, n + 1, *[case.get(f) for f in FIELDS]) for n, case in enumerate(cases)]
    records.append((len(cases) + 1, 1, *[PLAIN_BASE.get(f) for f in FIELDS]))  # a later row of a key: a duplicate
    frame = spark.createDataFrame(records, ", ".join(["row long", "first_row long", *[f"{f} string" for f in FIELDS]]))
    now = datetime.now(UTC)
    checks = {"queues": {"emails", "sms"}, "max_data_bytes": 1024}
    vouched = {r["row"] for r in frame.select("row", plain(**checks, now=now).alias("ok")).collect() if r["ok"]}

    for number, case in enumerate(cases, start=1):
        if number in vouched:
            try:
                check_row(case, now=now, **checks)
            except Invalid as error:
                pytest.fail(f"vouched for a row check_row refuses: {case!r} ({error})")
    assert len(cases) + 1 not in vouched
    # and the plain rows do take the JVM's way (else the import is as slow as before)
    assert 1 in vouched
    expected_plain = ['{"a": -5}', "{}", '{"é": "ü"}', '  {"a": true, "b": null, "c": [1, "x", false], "d": "it\'s"}  ']
    for value in expected_plain:
        assert cases.index(dict(PLAIN_BASE, data=value)) + 1 in vouched, value
    assert cases.index(dict(PLAIN_BASE, item_key="back\\slash")) + 1 in vouched
    assert cases.index(dict(PLAIN_BASE, schedule_on="2030-01-01T09:00:00.5-03:30")) + 1 in vouched
    by_delay = {**{k: v for k, v in PLAIN_BASE.items() if k != "schedule_on"}, "delay_seconds": "3600"}
    assert cases.index(by_delay) + 1 in vouched
    # a trace context is vouched for only as check_row keeps it (any other spelling is normalised or
    # dropped there, so the JVM's COPY text would store something else)
    contexts = {case["traceparent"]: n for n, case in enumerate(cases, start=1) if "traceparent" in case}
    assert {value for value, n in contexts.items() if n in vouched} == {TRACEPARENT}


@pytest.mark.usefixtures("queues")
def test_rows_vouched_for_on_the_jvm_are_stored_as_the_rules_would_store_them(
    spark: Any, database_url: str, raw: psycopg.Connection[Any], tmp_path: Path
) -> None:
    # each pair: a plain row (its COPY text built on the JVM) and one the JVM leaves to Python
    rows = [
        {"item_key": "back\\slash", "group_key": "g\\1", "schedule_on": "2030-01-01T09:00:00.5-03:30",
         "data": ' {"d": "it\'s", "n": -5, "l": [1, true, null]} ', "max_attempts": "12"},
        {"item_key": "back\\slash-py", "group_key": "g\\1", "schedule_on": "2030-01-01T09:00:00.5-03:30",
         "data": ' {"d": "it\\u0027s", "n": -5, "l": [1, true, null]} ', "max_attempts": "12"},
        {"item_key": "delayed", "delay_seconds": "0060", "data": "{}"},
        {"item_key": "delayed-py", "delay_seconds": "60.0", "data": "{}"},
    ]  # fmt: skip
    result = do_import(spark, database_url, write_csv(tmp_path / "pairs.csv", rows), tmp_path)
    assert result.counts["created"] == 4, result.counts
    stored = {r[0]: r[1:] for r in raw.execute(
        "SELECT item_key, group_key, schedule_on, data, max_attempts, schedule_on - enqueued_on FROM tickler_event_all"
    )}  # fmt: skip
    assert stored["back\\slash"][:4] == stored["back\\slash-py"][:4]  # the last: from each batch's clock
    assert stored["back\\slash"][:4] == (
        "g\\1",
        datetime(2030, 1, 1, 12, 30, 0, 500000, tzinfo=UTC),
        {"d": "it's", "n": -5, "l": [1, True, None]},
        12,
    )
    without_clock = [(v[0], v[2], v[3], v[4]) for v in (stored["delayed"], stored["delayed-py"])]
    assert without_clock[0] == without_clock[1]  # schedule_on: from each batch's clock
    assert stored["delayed"][4] == timedelta(seconds=60)
