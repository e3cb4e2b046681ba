"""The benchmarks' CPU meter: it counts what the application's processes and the database's backends
spent inside the window, and sorts each to its side (bench/cpu.py)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import psycopg
import pytest

from bench.cpu import CpuMeter, SelfCpu, available

pytestmark = pytest.mark.skipif(not available(), reason="per-process CPU comes from /proc")

BURN = "x = 0\nfor i in range(3_000_000):\n    x += i\n"
# Work only a backend does: a few million rows summed inside PostgreSQL.
QUERY = "SELECT sum(g) FROM generate_series(1, 3000000) AS g"


def test_the_meter_counts_a_child_process_as_application_and_a_backend_as_database(
    database_url: str, raw: psycopg.Connection[Any]
) -> None:
    # The child burns CPU when told, says so, and stays alive until the window has closed.
    script = f"import sys\nsys.stdin.readline()\n{BURN}print('done', flush=True)\nsys.stdin.readline()\n"
    with subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE) as app:
        assert app.stdin is not None and app.stdout is not None
        with CpuMeter(database_url, [app.pid]) as meter:
            raw.execute(QUERY)
            app.stdin.write(b"go\n")
            app.stdin.flush()
            assert app.stdout.readline() == b"done\n"
        app.communicate(b"\n", timeout=60)
    assert meter.use.app > 0.0
    assert meter.use.db > 0.0


def test_work_before_the_window_is_not_counted(database_url: str, raw: psycopg.Connection[Any]) -> None:
    with CpuMeter(database_url) as busy:
        raw.execute(QUERY)
    with CpuMeter(database_url) as idle:  # the same backend, which has spent that CPU before
        pass
    assert busy.use.db > 0.0
    assert idle.use.db < busy.use.db / 2
    assert idle.use.app == 0.0


def test_a_process_measures_itself_and_its_backend(raw: psycopg.Connection[Any]) -> None:
    cpu = SelfCpu(raw.info.backend_pid)
    raw.execute(QUERY)
    exec(BURN)
    spent = cpu.spent()
    assert spent.app > 0.0
    assert spent.db > 0.0
