"""`tickler pipeline` as an orchestrator runs it: with --json, every outcome is one JSON object on
stdout and the documented exit status; problems found before Spark starts are said at once."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parent.parent


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once the socket is closed


def pipeline(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tickler.cli", "pipeline", *args],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout, check=False,
    )  # fmt: skip


def no_java(database_url: str, tmp_path: Path) -> dict[str, str]:
    """An environment where starting Spark would fail: a test passing in it proves Spark never started."""
    return {**os.environ, "TICKLER_DATABASE_URL": database_url, "JAVA_HOME": str(tmp_path / "no-java"),
            "PATH": str(tmp_path)}  # fmt: skip


def one_json(run: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    summary = json.loads(run.stdout)  # the whole of stdout is one JSON object
    assert isinstance(summary, dict)
    assert summary["exit_code"] == run.returncode
    return summary


def test_an_unreachable_database_is_one_json_object_and_status_2(tmp_path: Path) -> None:
    env = no_java(f"postgresql://postgres@127.0.0.1:{_closed_port()}/postgres", tmp_path)
    run = pipeline(["report", "--json"], env)
    summary = one_json(run)
    assert (run.returncode, summary["status"], summary["job"]) == (2, "failed", "report")
    assert "cannot reach the database" in summary["error"]
    assert "Traceback" not in run.stderr
    # without --json: one line on stderr that says so
    run = pipeline(["report"], env)
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "cannot reach the database" in run.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["import", "x.csv", "--principal", "ops", "--on-conflict", "bogus"], "--on-conflict"),
        (["report", "--since", "2026-13-01"], "--since"),
        (["import", "x.csv"], "--principal"),
        (["archive", "--limit", "many"], "--limit"),
        (["import", "x.csv", "--principal", "ops", "--max-invalid", "ten"], "--max-invalid"),
    ],
)
def test_bad_options_with_json_are_one_json_object(
    args: list[str], says: str, database_url: str, tmp_path: Path
) -> None:
    run = pipeline([*args, "--json"], no_java(database_url, tmp_path))
    summary = one_json(run)
    assert (run.returncode, summary["status"]) == (2, "failed")
    assert says in summary["error"]
    assert summary["job"] == args[0]
    # without --json, argparse's usage and its message, status 2 as before
    run = pipeline(args, no_java(database_url, tmp_path))
    assert run.returncode == 2 and "usage:" in run.stderr and says in run.stderr and run.stdout == ""


def test_importing_a_missing_file_says_so_before_spark_starts(database_url: str, tmp_path: Path) -> None:
    missing = tmp_path / "missing.csv"
    run = pipeline(["import", str(missing), "--principal", "ops", "--json"], no_java(database_url, tmp_path))
    summary = one_json(run)
    assert run.returncode == 2 and summary["error"] == f"no such file: {missing}"
    run = pipeline(["import", str(missing), "--principal", "ops"], no_java(database_url, tmp_path))
    assert (run.returncode, run.stderr) == (2, f"tickler pipeline: no such file: {missing}\n")


def test_an_unreachable_master_is_named_at_once(database_url: str, tmp_path: Path) -> None:
    """It took 77 s to fail with "An error occurred while calling None...", the cause only in the log."""
    master = f"spark://127.0.0.1:{_closed_port()}"
    run = pipeline(["report", "--source", "snapshot", "--master", master, "--json"], no_java(database_url, tmp_path))
    summary = one_json(run)
    assert run.returncode == 2
    assert summary["error"].startswith(f"All masters are unresponsive: cannot connect to the Spark master {master}")


def test_the_cause_spark_only_logs_is_found_in_its_log(tmp_path: Path) -> None:
    from tickler.pipeline.spark import log_cause

    log = tmp_path / "spark.log"
    log.write_text(
        "25/11/24 01:00:00 WARN StandaloneAppClient$ClientEndpoint: Failed to connect to master 10.0.0.9:7077\n"
        "25/11/24 01:01:00 ERROR StandaloneSchedulerBackend: Application has been killed. "
        "Reason: All masters are unresponsive! Giving up.\n"
    )
    assert log_cause(log) == "All masters are unresponsive! Giving up."
    assert log_cause(tmp_path / "none.log") is None
