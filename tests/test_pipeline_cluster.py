"""The import on a real Spark standalone cluster (a master and a worker process started from the
installed pyspark) whose executors run a Python with neither tickler, psycopg nor pyspark
installed: the job ships its code and its modules, and honours spark.pyspark.python."""

from __future__ import annotations

import csv
import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.helpers_wait import wait_until
from tests.test_pipeline_support import add_queue

# A Python without this project's packages: the system one, when it is the same minor version
# (the shipped psycopg is compiled for it).
BARE_PYTHON = "/usr/bin/python3"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("pipeline_db"),
    pytest.mark.timeout(300),  # four JVMs start on a busy 2-core machine
    pytest.mark.skipif(shutil.which("java") is None, reason="Spark needs Java"),
]


def _bare_python() -> str | None:
    if not Path(BARE_PYTHON).exists():
        return None
    probe = subprocess.run(
        [BARE_PYTHON, "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
        capture_output=True, text=True, check=False, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    same = probe.stdout.strip() == f"{sys.version_info[0]}.{sys.version_info[1]}"
    for module in ("psycopg", "tickler", "pyspark"):
        found = subprocess.run([BARE_PYTHON, "-c", f"import {module}"], capture_output=True, check=False, cwd="/")
        if found.returncode == 0:
            return None  # not bare: the test would prove nothing
    return BARE_PYTHON if same else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _master_status(ui: int) -> dict[str, Any]:
    """The master's /json/ status, or {} while it is not answering yet: a master still starting
    can accept the connection and answer with an empty body (a JSONDecodeError, not an OSError)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as answer:
            status = json.load(answer)
    except (OSError, ValueError):
        return {}
    return status if isinstance(status, dict) else {}


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=20)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[str]:
    """spark://host:port of a master with one worker (1 core, 1 GB); both stopped afterwards."""
    import pyspark

    home = Path(pyspark.__file__).parent
    spark_class = home / "bin" / "spark-class"
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_NO_DAEMONIZE": "1"}
    port, ui = _free_port(), _free_port()
    master_url = f"spark://127.0.0.1:{port}"
    processes: list[subprocess.Popen[bytes]] = []
    logs = tmp_path / "logs"
    logs.mkdir()
    try:
        for name, args in (
            ("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                        "--webui-port", str(ui)]),
            ("worker", ["org.apache.spark.deploy.worker.Worker", master_url, "--host", "127.0.0.1", "--cores", "1",
                        "--memory", "1g", "--webui-port", str(_free_port()), "--work-dir", str(tmp_path / "work")]),
        ):  # fmt: skip
            with (logs / f"{name}.log").open("wb") as log:
                processes.append(
                    subprocess.Popen([str(spark_class), *args], env=env, stdout=log, stderr=subprocess.STDOUT)
                )

        def workers_alive() -> bool:
            return int(_master_status(ui).get("aliveworkers", 0)) >= 1

        wait_until(workers_alive, timeout=150, interval=0.5, what=lambda: (logs / "worker.log").read_text()[-2000:])
        yield master_url
    finally:
        for process in reversed(processes):
            _stop(process)


def test_import_on_a_standalone_cluster_with_bare_executors(
    cluster: str, database_url: str, raw: psycopg.Connection[Any], tmp_path: Path
) -> None:
    if os.environ.get("TICKLER_TEST_DATABASE_URL"):
        pytest.skip("the cluster is tested once, on the embedded database (it tests shipping, not PostgreSQL)")
    python = _bare_python()
    if python is None:
        pytest.skip(f"no bare {BARE_PYTHON} of Python {sys.version_info[0]}.{sys.version_info[1]} here")
    add_queue(raw, "emails")
    source = tmp_path / "campaign.csv"
    with source.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["item_key", "data", "delay_seconds"])
        writer.writerows([[f"k{n}", json.dumps({"n": n}), "3600"] for n in range(50)])
        writer.writerow(["bad/key", "{}", ""])
    env = {**os.environ, "TICKLER_DATABASE_URL": database_url}
    env.pop("PYSPARK_PYTHON", None)
    run = subprocess.run(
        [sys.executable, "-m", "tickler.cli", "pipeline", "import", str(source), "--principal", "ops",
         "--queue", "emails",
         "--master", cluster, "--partitions", "2", "--conf", f"spark.pyspark.python={python}",
         "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.executor.memory=512m",
         "--conf", "spark.cores.max=1"],
        capture_output=True, text=True, env=env, cwd=Path(__file__).parent.parent, timeout=240, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"{'created':<10} {50:>12,}" in run.stdout and f"{'invalid':<10} {1:>12,}" in run.stdout, run.stdout
    found = raw.execute("SELECT count(*), count(DISTINCT item_key) FROM tickler_event_all WHERE queue = 'emails'")
    assert found.fetchone() == (50, 50)


@pytest.fixture
def master_alone(tmp_path: Path) -> Iterator[str]:
    """spark://host:port of a master whose only worker is gone (none was started)."""
    import pyspark

    home = Path(pyspark.__file__).parent
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_NO_DAEMONIZE": "1"}
    port, ui = _free_port(), _free_port()
    log = tmp_path / "master.log"
    with log.open("wb") as out:
        master = subprocess.Popen(
            [str(home / "bin" / "spark-class"), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(port), "--webui-port", str(ui)],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:

        def up() -> bool:
            return _master_status(ui).get("status") == "ALIVE"

        wait_until(up, timeout=150, interval=0.5, what=lambda: log.read_text()[-2000:])
        yield f"spark://127.0.0.1:{port}"
    finally:
        _stop(master)


def test_a_job_without_executors_says_it_waits_and_stops_at_its_timeout(
    master_alone: str, database_url: str, raw: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """Losing the cluster's only worker hung the job forever without a line of progress."""
    # --timeout leaves room for the JVM to start on a loaded machine (20 s and more) and the first
    # lines of progress (each at least 10 s after the one before) to come: 60 s was too short on
    # a slow 2-core machine running the whole suite (no line of progress at all).
    add_queue(raw, "emails")
    source = tmp_path / "campaign.csv"
    source.write_text('item_key,data\nk1,"{}"\n')
    env = {**os.environ, "TICKLER_DATABASE_URL": database_url}
    run = subprocess.run(
        [sys.executable, "-m", "tickler.cli", "pipeline", "import", str(source), "--principal", "ops",
         "--queue", "emails", "--master", master_alone, "--conf", "spark.driver.host=127.0.0.1",
         "--timeout", "90", "--json"],
        capture_output=True, text=True, env=env, cwd=Path(__file__).parent.parent, timeout=240, check=False,
    )  # fmt: skip
    summary = json.loads(run.stdout)
    assert (run.returncode, summary["exit_code"]) == (1, 1), run.stderr[-3000:]
    assert summary["error"].startswith("timed out after 90 s (--timeout)")
    # stderr is no terminal: plain lines, and the heartbeat says what the job waits for
    assert "waiting for executors: 1 stage, 0/" in run.stderr, run.stderr[-3000:]
    assert "no executor registered" in run.stderr
