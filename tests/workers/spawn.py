"""Start `tickler worker` processes over a test database, read what they handled, and stop them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def start_worker(
    database_url: str, record_dir: Path, *args: str, name: str, webhooks: bool = False, **env: str
) -> subprocess.Popen[bytes]:
    """A `tickler worker` process running tests.workers.recording (and delivering webhook queues
    when `webhooks`); its output goes to <record_dir>/<name>.log."""
    environment = {
        **os.environ,
        "TICKLER_DATABASE_URL": database_url,
        "TICKLER_LOG_LEVEL": "WARNING",
        "TICKLER_MIGRATE_ON_START": "false",
        "PYTHONPATH": str(ROOT),
        "RECORD_DIR": str(record_dir),
        **env,
    }
    with open(record_dir / f"{name}.log", "wb") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tickler.cli",
                "worker",
                "--handlers",
                "tests.workers.recording:handlers",
                *(() if webhooks else ("--no-webhooks",)),
                "--name",
                name,
                *args,
            ],
            cwd=ROOT,
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def stop_workers(processes: list[subprocess.Popen[bytes]], timeout: float = 15.0) -> None:
    """SIGTERM every process still running, wait, SIGKILL those that hang."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def handled(record_dir: Path) -> Counter[int]:
    """How many times each event id was handled, over every worker process."""
    counts: Counter[int] = Counter()
    for path in record_dir.glob("handled-*.txt"):
        counts.update(int(line) for line in path.read_text().split())
    return counts


def logs(record_dir: Path, limit: int = 3000) -> str:
    """The tail of every worker's output, for failure messages."""
    return "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-limit:]}" for p in sorted(record_dir.glob("*.log"))
    )
