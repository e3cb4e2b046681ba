"""The report job on a small history with known answers, read via each available source."""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pipeline.report import Period, run_report
from pipeline.source import Source
from pipeline.spark import PipelineError
from tests.test_pipeline_support import (
    PERIOD,
    add_queue,
    check_known_answers,
    known_history,
    pipeline_db,  # noqa: F401 (fixture)
    save,
    sources,
    spark,  # noqa: F401 (fixture)
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("pipeline_db")]


def report(spark: Any, url: str, out: Path, kind: str = "snapshot") -> dict[str, list[dict[str, Any]]]:  # noqa: F811
    since, until = (date.fromisoformat(d) for d in PERIOD)
    with Source(spark, url, mode=kind) as source:
        assert source.kind == kind
        return run_report(spark, source, out, Period(since, until), top=5).tables


def history(raw: psycopg.Connection[Any]) -> None:
    add_queue(raw, "emails")
    add_queue(raw, "sms")
    save(raw, known_history())


def test_report_counts_lateness_and_failures(spark: Any, database_url: str, raw: Any, tmp_path: Path) -> None:  # noqa: F811
    history(raw)
    for kind in sources(database_url):
        check_known_answers(report(spark, database_url, tmp_path / kind, kind))
    # the outputs: Parquet tables and one page that needs nothing from the network
    out = tmp_path / "snapshot"
    for table in ("daily", "summary", "lateness_histogram", "top_failures"):
        assert spark.read.parquet(str(out / table)).count() > 0
    page = (out / "report.html").read_text()
    assert page.count("<svg") == 3
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in page and "<script" not in page and "<link" not in page
    assert "Daily volumes by outcome" in page and "ana" in page and "billing" in page


def test_report_of_an_empty_database(spark: Any, database_url: str, tmp_path: Path) -> None:  # noqa: F811
    tables = report(spark, database_url, tmp_path)
    assert all(rows == [] for rows in tables.values())
    assert "nothing in this period" in (tmp_path / "report.html").read_text()


def test_jdbc_needs_tcp_or_says_so(spark: Any, database_url: str) -> None:  # noqa: F811
    if "jdbc" in sources(database_url):
        pytest.skip("this database is on TCP and the driver is here")
    with pytest.raises(PipelineError, match="jdbc"):
        Source(spark, database_url, mode="jdbc")
