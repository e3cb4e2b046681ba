"""Progress lines from Spark's status tracker, and the JVM's output kept off the console."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers_wait import wait_until
from tickler.pipeline.progress import jvm_output_to, reporting, track

# No database at all: the same on any server.
pytestmark = [pytest.mark.own_server, pytest.mark.slow, pytest.mark.timeout(300)]


def _busy(rows: Any) -> Any:
    yield sum(i * i for i in range(2_000_000)) + sum(1 for _ in rows)


def test_progress_lines_name_tasks_done_elapsed_and_rate(spark: Any) -> None:
    out = io.StringIO()  # not a terminal: plain lines
    with reporting(spark.sparkContext, out=out, every=0.05):
        spark.sparkContext.parallelize(range(16), 8).mapPartitions(_busy).count()
    lines = [line for line in out.getvalue().splitlines() if "no Spark stage" not in line]
    assert lines, "no progress line during a job of several seconds"
    assert all(" tasks (" in line and "tasks/s" in line and "\r" not in line for line in lines)
    assert any("/8 tasks" in line for line in lines)
    # the share of the job's tasks done, and when it should end once some are
    assert all(re.search(r"\d+/8 tasks \(\d+%\)", line) for line in lines if "/8 tasks" in line)
    assert any("ETA" in line for line in lines if not line.startswith(("1 stage: 0/",)))


def test_a_heartbeat_line_while_nothing_changes(spark: Any) -> None:
    """Without a terminal a line comes at least every `heartbeat` seconds, even when no Spark stage
    runs (the job is on the driver, or waits): a cron log tells hung from slow."""
    out = io.StringIO()
    with reporting(spark.sparkContext, out=out, every=0.05, heartbeat=0.1):
        wait_until(lambda: out.getvalue().count("\n") >= 2, timeout=30, what=out.getvalue)
    lines = out.getvalue().splitlines()
    assert all("no Spark stage running" in line and "elapsed" in line for line in lines), lines


def test_a_job_reports_its_own_units_overall_with_an_eta(spark: Any) -> None:
    out = io.StringIO()
    done = {"n": 0}
    with reporting(spark.sparkContext, out=out, every=0.05, heartbeat=0.1), \
            track("rows checked", 200, lambda: (done["n"], f"{done['n'] // 2} written")):  # fmt: skip
        wait_until(lambda: "0/200 rows checked (0%)" in out.getvalue(), timeout=30, what=out.getvalue)
        done["n"] = 50
        wait_until(lambda: "50/200 rows checked (25%)" in out.getvalue(), timeout=30, what=out.getvalue)
    line = next(line for line in out.getvalue().splitlines() if "50/200" in line)
    assert "25 written" in line and "ETA " in line and "elapsed" in line


def test_jvm_output_goes_to_the_log(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "spark.log"
    with jvm_output_to(log):
        os.write(2, b"WARNING: Using incubator modules: jdk.incubator.vector\n")  # as a child JVM would
    os.write(2, b"after\n")
    assert "incubator" in log.read_text()
    assert capfd.readouterr().err == "after\n"


def test_spark_shuts_down_quietly_when_logging_points_at_a_closed_stream(tmp_path: Path) -> None:
    """`make test` ended with py4j's "Logging error": at exit, py4j logged its shutdown to a handler
    whose stream a test had closed. The job's session keeps py4j's chatter out of the root logger."""
    script = tmp_path / "session.py"
    script.write_text(
        "import io, logging\n"
        "from tickler.pipeline.spark import create_session, stop_session\n"
        "session = create_session('local[1]')\n"
        "assert session.range(3).count() == 3\n"
        "stream = io.StringIO()\n"
        "logging.basicConfig(level=logging.DEBUG, stream=stream)\n"
        "stream.close()\n"
        "stop_session(session)\n"
    )
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, check=False)
    assert run.returncode == 0, run.stderr
    assert "Logging error" not in run.stderr and "Traceback" not in run.stderr
