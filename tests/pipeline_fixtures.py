"""The pipeline tests' fixtures (a pytest plugin, see conftest.py): one SparkSession per test
session, and the test database with the archive's tables emptied."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tickler.scheduler.db import libpq_url

ARCHIVE_TABLES = "tickler_archived_key, tickler_archive_item, tickler_archive_run"


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local Spark for every pipeline test (starting one takes seconds)."""
    if shutil.which("java") is None:
        pytest.skip("Spark needs Java 17 (apt-get install openjdk-17-jre-headless; .ci/run does)")
    from tickler.pipeline.spark import create_session, jdbc_jar, stop_session  # pyspark only for the tests that use it

    session = create_session("local[2]", jar=jdbc_jar(), conf={"spark.sql.shuffle.partitions": "4"})
    yield session
    # Stopped here, while pytest's streams are open: left to the interpreter's exit, py4j's
    # shutdown logs to a closed stream and `make test` ended with a "Logging error" traceback.
    stop_session(session)


@pytest.fixture
def pipeline_db(database_url: str) -> str:
    """The test database with the archive's tables emptied too (conftest empties tickler's)."""
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        conn.execute(f"TRUNCATE {ARCHIVE_TABLES} RESTART IDENTITY CASCADE")
    return database_url
