"""The import keeps each row's `traceparent` with its event (SPEC §11), as the API keeps a schedule
call's header: normalised, and a malformed one ignored (the row is still imported). A Spark file,
run with the other Spark files (tests/conftest.py groups them on one worker)."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tickler.pipeline.importer import run_import
from tickler.scheduler.models import Queue

CONTEXT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
OTHER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def import_rows(spark: Any, url: str, tmp_path: Path, rows: list[dict[str, str]], on_conflict: str) -> Any:
    source = tmp_path / f"{on_conflict}.csv"
    with source.open("w", newline="", encoding="utf-8") as out:
        writer = csv.DictWriter(out, fieldnames=["item_key", "data", "traceparent"])
        writer.writeheader()
        writer.writerows(rows)
    return run_import(
        spark, url, str(source), principal="bot", on_conflict=on_conflict, queue="emails",
        rejects_path=str(tmp_path / f"rejects-{on_conflict}.csv"), partitions=1, max_data_bytes=1024,
    )  # fmt: skip


def contexts(raw: psycopg.Connection[Any]) -> dict[str, str | None]:
    return dict(raw.execute("SELECT item_key, traceparent FROM tickler_event").fetchall())


@pytest.mark.slow
def test_an_import_keeps_each_rows_trace_context_and_ignores_a_malformed_one(
    spark: Any, database_url: str, raw: psycopg.Connection[Any], make_queue: Callable[..., Queue], tmp_path: Path
) -> None:
    make_queue("emails")
    rows = [
        {"item_key": "plain", "data": "{}", "traceparent": CONTEXT},  # vouched for on the JVM
        {"item_key": "upper", "data": "{}", "traceparent": CONTEXT.upper()},  # by Python: normalised
        {"item_key": "malformed", "data": "{}", "traceparent": "00-not-a-context"},  # ignored, not refused
        {"item_key": "none", "data": "{}", "traceparent": ""},
    ]
    result = import_rows(spark, database_url, tmp_path, rows, "reject")
    assert result.counts["created"] == 4 and result.counts["invalid"] == 0, result.counts
    assert contexts(raw) == {"plain": CONTEXT, "upper": CONTEXT, "malformed": None, "none": None}

    # a row left alone (ignore) keeps the event's context; a replaced one takes the row's
    again = [{"item_key": "plain", "data": '{"v": 2}', "traceparent": OTHER}]
    assert import_rows(spark, database_url, tmp_path, again, "ignore").counts["ignored"] == 1
    assert contexts(raw)["plain"] == CONTEXT
    assert import_rows(spark, database_url, tmp_path, again, "replace").counts["replaced"] == 1
    assert contexts(raw)["plain"] == OTHER
