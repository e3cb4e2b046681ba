"""`tickler serve` on the embedded PostgreSQL: a second command reaches the same database while it
runs, and the data survives a restart. Real processes, real HTTP."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.helpers_wait import wait_until

# An embedded PostgreSQL of its own, whatever TICKLER_TEST_DATABASE_URL names.
pytestmark = pytest.mark.own_server

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def data_dir() -> Iterator[Path]:
    # A short path of our own: PostgreSQL's socket path must stay short, and pytest prunes its
    # old temp dirs, which must not happen under a running server.
    path = Path(tempfile.mkdtemp(prefix="tkl-cli-"))
    try:
        yield path
    finally:
        _stop_leftover_postgres(path)
        shutil.rmtree(path, ignore_errors=True)


def _stop_leftover_postgres(path: Path) -> None:
    """If a test failed half-way, the embedded server it started may still run: stop it by pid."""
    for pid_file in path.rglob("postmaster.pid"):
        try:
            pid = int(pid_file.read_text().split()[0])
            os.kill(pid, signal.SIGINT)  # PostgreSQL's "fast" shutdown
        except (ValueError, IndexError, ProcessLookupError, PermissionError):
            continue
        wait_until(lambda pid=pid: not _alive(pid), timeout=20)  # type: ignore[misc]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _env(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TICKLER_")}
    return {**env, "TICKLER_DATA_DIR": str(data_dir), "TICKLER_LOG_LEVEL": "WARNING", "PYTHONPATH": str(ROOT)}


def _tickler(*args: str) -> list[str]:
    return [sys.executable, "-m", "tickler.cli", *args]


class Serve:
    """One `tickler serve` process."""

    def __init__(self, data_dir: Path, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(data_dir / f"serve-{time.monotonic_ns()}.log", "w+b")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            _tickler("serve", "--port", str(port)), cwd=ROOT, env=_env(data_dir), stdout=self.log, stderr=self.log
        )

    def wait_ready(self) -> None:
        def answers() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"serve exited with {self.process.returncode}: {self.output()}")
            try:
                return requests.get(f"{self.url}/healthz", timeout=1).status_code == 200
            except requests.ConnectionError:
                return False

        wait_until(answers, timeout=60, interval=0.1)

    def output(self) -> str:
        if self.log.closed:  # stopped: what it wrote was kept then
            return self.last_output
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-3000:]

    def stop(self) -> None:
        try:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
        finally:
            self.last_output = self.output()
            self.log.close()


def test_serve_embedded_survives_restart(data_dir: Path) -> None:
    port = _free_port()
    serve = Serve(data_dir, port)
    try:
        serve.wait_ready()
        created = subprocess.run(
            _tickler("token", "create", "ops", "--admin"),
            cwd=ROOT,
            env=_env(data_dir),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert created.returncode == 0, created.stderr
        assert re.fullmatch(r"tkl_[A-Za-z0-9_-]{20,}\n", created.stdout), created.stdout
        headers = {"Authorization": f"Bearer {created.stdout.strip()}"}
        assert requests.put(f"{serve.url}/v1/queues/emails", json={}, headers=headers, timeout=10).status_code == 201
        scheduled = requests.post(
            f"{serve.url}/v1/queues/emails/events",
            json={"item_key": "welcome:ana@example.com", "delay_seconds": 3600, "data": {"name": "Ana"}},
            headers=headers,
            timeout=10,
        )
        assert scheduled.status_code == 202, scheduled.text
        assert requests.get(f"{serve.url}/readyz", timeout=10).status_code == 200
    finally:
        serve.stop()
    assert serve.process.returncode == 0, serve.output()

    again = Serve(data_dir, port)
    try:
        again.wait_ready()
        got = requests.get(f"{again.url}/v1/queues/emails/events/welcome:ana@example.com", headers=headers, timeout=10)
        assert got.status_code == 200, got.text
        assert got.json()["id"] == scheduled.json()["id"]
        assert got.json()["data"] == {"name": "Ana"}
        assert got.json()["status"] == "pending"
    finally:
        again.stop()
    assert again.process.returncode == 0, again.output()
