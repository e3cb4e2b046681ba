"""The import job reads priority and fairness_key columns (SPEC §10): a Spark file, run with
the other Spark files (tests/conftest.py groups them on one worker)."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tickler.pipeline.importer import run_import
from tickler.scheduler.models import Queue
from tickler.scheduler.store import Store


@pytest.mark.slow
def test_an_import_reads_priority_and_fairness_key_columns(
    spark: Any, database_url: str, store: Store, make_queue: Callable[..., Queue], tmp_path: Path
) -> None:
    make_queue("emails")
    source = tmp_path / "import.csv"
    with source.open("w", newline="", encoding="utf-8") as out:
        writer = csv.DictWriter(out, fieldnames=["item_key", "data", "priority", "fairness_key"])
        writer.writeheader()
        writer.writerows(
            [
                {"item_key": "urgent", "data": "{}", "priority": "9", "fairness_key": "tenant-1"},
                {"item_key": "plain", "data": "{}", "priority": "", "fairness_key": ""},
                {"item_key": "bad", "data": "{}", "priority": "101", "fairness_key": ""},
            ]
        )
    result = run_import(
        spark, database_url, str(source), principal="bot", on_conflict="reject", queue="emails",
        rejects_path=str(tmp_path / "rejects.csv"), partitions=1, max_data_bytes=1024,
    )  # fmt: skip
    assert result.counts["created"] == 2 and result.counts["invalid"] == 1
    urgent, plain = store.events.get("emails", "urgent"), store.events.get("emails", "plain")
    assert (urgent.priority, urgent.fairness_key) == (9, "tenant-1")
    assert (plain.priority, plain.fairness_key) == (0, None)
    with (tmp_path / "rejects.csv").open(newline="", encoding="utf-8") as f:
        (rejected,) = list(csv.DictReader(f))
    assert rejected["reason"].startswith("priority:") and rejected["priority"] == "101"
