"""Progress lines from Spark's status tracker, and the JVM's output kept off the console."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tickler.pipeline.progress import jvm_output_to, reporting

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _busy(rows: Any) -> Any:
    yield sum(i * i for i in range(2_000_000)) + sum(1 for _ in rows)


def test_progress_lines_name_tasks_done_elapsed_and_rate(spark: Any) -> None:
    out = io.StringIO()  # not a terminal: plain lines
    with reporting(spark.sparkContext, out=out, every=0.05):
        spark.sparkContext.parallelize(range(16), 8).mapPartitions(_busy).count()
    lines = out.getvalue().splitlines()
    assert lines, "no progress line during a job of several seconds"
    assert all(" tasks, " in line and "tasks/s" in line and "\r" not in line for line in lines)
    assert any("/8 tasks" in line for line in lines)


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
