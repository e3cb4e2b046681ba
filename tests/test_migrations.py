"""Migrations: once each, also when several runs race on a fresh database; edits are caught."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests import pg
from tests.helpers import kill_if_running
from tickler.scheduler import migrate as migrate_module
from tickler.scheduler.db import libpq_url
from tickler.scheduler.migrate import (
    Migration,
    MigrationError,
    Step,
    available_migrations,
    code_files,
    migrate,
    pending_migrations,
)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def fresh_url(admin_url: str) -> Iterator[str]:
    with pg.own_database(admin_url, "tickler_migrate") as url:
        yield url


def _ledger(url: str) -> list[tuple[int, str]]:
    with psycopg.connect(libpq_url(url)) as conn:
        return [(v, n) for v, n in conn.execute("SELECT version, name FROM tickler_migration ORDER BY version")]


def every_step() -> list[Step]:
    """What a new database is brought to: every numbered step, then every code file."""
    return [*available_migrations(), *code_files()]


def test_fresh_database_is_pending_then_migrated(fresh_url: str) -> None:
    everything = [step.label for step in every_step()]
    assert [step.label for step in pending_migrations(fresh_url)] == everything
    applied = migrate(fresh_url)
    assert [step.label for step in applied] == everything
    assert pending_migrations(fresh_url) == []
    assert migrate(fresh_url) == []  # the second run is a no-op
    assert _ledger(fresh_url) == [(m.version, m.name) for m in available_migrations()]


def test_concurrent_threads_apply_each_migration_once(fresh_url: str) -> None:
    barrier = threading.Barrier(4)
    results: list[list[Migration]] = []
    failures: list[BaseException] = []

    def run() -> None:
        try:
            barrier.wait(timeout=30)
            results.append(migrate(fresh_url))
        except BaseException as error:  # reported below, on the test's thread
            failures.append(error)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures, failures
    applied = sorted(step.label for result in results for step in result)
    assert applied == sorted(step.label for step in every_step())
    assert _ledger(fresh_url) == [(m.version, m.name) for m in available_migrations()]


def test_concurrent_processes_apply_each_migration_once(fresh_url: str) -> None:
    code = (
        "import sys; from scheduler.migrate import migrate; "
        "print('applied:' + ','.join(m.label for m in migrate(sys.argv[1])))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", code, fresh_url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
        )
        for _ in range(4)
    ]
    outputs = []
    try:
        for process in processes:
            out, err = process.communicate(timeout=60)
            assert process.returncode == 0, err
            # Only the marked line: log lines may share stdout.
            [line] = [line for line in out.splitlines() if line.startswith("applied:")]
            outputs.append(line.removeprefix("applied:"))
    finally:
        for process in processes:
            kill_if_running(process)
    applied = sorted(label for out in outputs for label in out.split(",") if label)
    assert applied == sorted(step.label for step in every_step())
    assert _ledger(fresh_url) == [(m.version, m.name) for m in available_migrations()]


def test_edited_migration_is_detected(fresh_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    migrate(fresh_url)
    original = available_migrations()
    edited = [Migration(m.version, m.name, m.sql + "\n-- an edit\n") if m.version == 1 else m for m in original]
    monkeypatch.setattr(migrate_module, "available_migrations", lambda: edited)
    with pytest.raises(MigrationError, match="changed"):
        migrate_module.migrate(fresh_url)
    with pytest.raises(MigrationError, match="changed"):
        migrate_module.pending_migrations(fresh_url)


def test_unknown_applied_migration_is_detected(fresh_url: str) -> None:
    migrate(fresh_url)
    with psycopg.connect(libpq_url(fresh_url), autocommit=True) as conn:
        conn.execute("INSERT INTO tickler_migration (version, name, checksum) VALUES (9999, 'future', 'x')")
    with pytest.raises(MigrationError, match="9999"):
        migrate(fresh_url)


def test_failed_migration_leaves_nothing_behind(fresh_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    migrate(fresh_url)  # a new database takes schema.sql; the next release's step then fails
    broken = [*available_migrations(), Migration(9998, "broken", "CREATE TABLE half_done (x int); SELECT 1/0;")]
    monkeypatch.setattr(migrate_module, "available_migrations", lambda: broken)
    with pytest.raises(psycopg.errors.DivisionByZero):
        migrate_module.migrate(fresh_url)
    with psycopg.connect(libpq_url(fresh_url)) as conn:
        assert conn.execute("SELECT to_regclass('half_done')").fetchone() == (None,)
    assert 9998 not in [v for v, _ in _ledger(fresh_url)]
    # The lock was released: a later run works.
    monkeypatch.setattr(migrate_module, "available_migrations", available_migrations)
    assert migrate_module.migrate(fresh_url) == []
