"""Settings from the environment: the worker's tuning knobs (TICKLER_WORKER_*) reach the dispatcher
of `tickler worker`, its options win over them, and a bad value stops with the variable's name."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

from tests.helpers_wait import wait_until
from tests.workers.spawn import logs, start_worker, stop_workers
from tickler.config import Settings, WorkerSettings


def test_worker_knobs_are_read_from_the_environment() -> None:
    settings = Settings.from_env({"TICKLER_WORKER_BATCH_SIZE": "7", "TICKLER_WORKER_POLL_INTERVAL": "0.5"})
    assert settings.worker.batch_size == 7
    assert settings.worker.poll_interval == 0.5
    assert settings.worker.concurrency == WorkerSettings().concurrency  # not set: the default
    assert Settings.from_env({"TICKLER_WORKER_CONCURRENCY": ""}).worker == WorkerSettings()  # empty: unset


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("TICKLER_WORKER_BATCH_SIZE", "many", "TICKLER_WORKER_BATCH_SIZE must be a whole number, not 'many'"),
        ("TICKLER_WORKER_SHUTDOWN_GRACE", "10s", "TICKLER_WORKER_SHUTDOWN_GRACE must be a number, not '10s'"),
        ("TICKLER_MIGRATE_ON_START", "maybe", "TICKLER_MIGRATE_ON_START must be true or false, not 'maybe'"),
    ],
)
def test_a_bad_value_stops_with_the_variable_name(variable: str, value: str, message: str) -> None:
    with pytest.raises(SystemExit) as stopped:
        Settings.from_env({variable: value})
    assert str(stopped.value) == message


def _started(log: Path) -> dict[str, object] | None:
    for line in log.read_text(errors="replace").splitlines():
        if '"dispatcher_started"' in line:
            found: dict[str, object] = json.loads(line)
            return found
    return None


def test_tickler_worker_runs_with_the_environment_knobs_and_its_options_win(database_url: str, tmp_path: Path) -> None:
    worker = start_worker(
        database_url,
        tmp_path,
        "--concurrency",
        "2",
        name="tuned",
        TICKLER_LOG_LEVEL="INFO",
        TICKLER_WORKER_BATCH_SIZE="7",
        TICKLER_WORKER_CONCURRENCY="3",
        TICKLER_WORKER_REAP_INTERVAL="0.5",
    )
    try:
        started = wait_until(lambda: _started(tmp_path / "tuned.log"), 30, what=lambda: logs(tmp_path))
    finally:
        stop_workers([worker])
    assert started["batch_size"] == 7
    assert started["reap_interval"] == 0.5
    assert started["concurrency"] == 2  # the option, over TICKLER_WORKER_CONCURRENCY
    assert started["queue_concurrency"] == WorkerSettings().queue_concurrency


def test_every_setting_is_in_the_configuration_table() -> None:
    page = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text()
    variables = [f"TICKLER_{f.name.upper()}" for f in fields(Settings) if f.name != "worker"]
    variables += [f"TICKLER_WORKER_{f.name.upper()}" for f in fields(WorkerSettings)]
    missing = [name for name in variables if f"| `{name}` |" not in page]
    assert not missing, f"add to the configuration table of docs/operations.md: {missing}"
