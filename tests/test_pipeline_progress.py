"""Progress lines from Spark's status tracker, and the JVM's output kept off the console."""

from __future__ import annotations

import io
import os
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
