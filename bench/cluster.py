"""The server of a benchmark run: a private PostgreSQL cluster with stated settings, or one given.

A server that has lived on a machine carries its history (ALTER SYSTEM, e.g. `autovacuum = off`);
results measured on it depend on that history. A full run therefore starts its own cluster:
initdb into a temporary directory with the settings below (the machine's PostgreSQL binaries,
/usr/lib/postgresql/N/bin, the newest N; else the embedded pgserver with the same settings), on a
free port, over TCP 127.0.0.1, and removes it at the end. The settings are recorded in the report.
Otherwise (`--server local`) the server given, the local one, or an embedded one.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from bench.harness import DEFAULT_URL, ROOT, execute, free_port, say
from tickler.scheduler.db import libpq_url

# Durable and vacuumed, as a deployment runs; memory sizes stated, not inherited.
SETTINGS: dict[str, str] = {
    "autovacuum": "on",
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "wal_level": "replica",
    "shared_buffers": "128MB",
    "work_mem": "4MB",
    "max_connections": "200",
    "max_wal_size": "4GB",
    "checkpoint_timeout": "15min",
    "commit_delay": "0",
}


def _bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parent.parent.name))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _pgserver(data: Path) -> Any:
    """The embedded PostgreSQL (pgserver) on `data`, stopped when this process ends."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver

        return pgserver.get_server(data, cleanup_mode="stop")


class PrivateCluster:
    """start() -> admin URL; stop() removes everything."""

    def __init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="tickler-bench-pg-"))
        self.port = free_port()
        self._pgserver: Any = None
        self._bindir = _bindir()
        self._user: str | None = None

    def _run(self, *args: str) -> None:
        command = list(args)
        if self._user:  # PostgreSQL refuses to run as root: run it as the machine's postgres user
            command = ["runuser", "-u", self._user, "--", *command]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def start(self) -> str:
        if self._bindir is None:
            return self._start_pgserver()
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                return self._start_pgserver()
            self._user = "postgres"
            shutil.chown(self.tmp, "postgres")
        data = self.tmp / "data"
        self._run(str(self._bindir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "-E", "UTF8")
        options = " ".join(f"-c {k}={v}" for k, v in SETTINGS.items())
        options += f" -c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.tmp}"
        self._run(
            str(self._bindir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(self.tmp / "log"), "-w", "start"
        )
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _start_pgserver(self) -> str:
        self._pgserver = _pgserver(self.tmp / "pgdata")
        url = str(self._pgserver.get_uri())
        execute(url, *(f"ALTER SYSTEM SET {name} = '{value}'" for name, value in SETTINGS.items()))
        # shared_buffers, max_connections and wal_level take a restart
        self._pgserver.cleanup()
        self._pgserver = _pgserver(self.tmp / "pgdata")
        return str(self._pgserver.get_uri())

    def stop(self) -> None:
        try:
            if self._pgserver is not None:
                self._pgserver.cleanup()
            elif self._bindir is not None and (self.tmp / "data").exists():
                self._run(str(self._bindir / "pg_ctl"), "-D", str(self.tmp / "data"), "-m", "fast", "-w", "stop")
        finally:
            for _ in range(3):
                shutil.rmtree(self.tmp, ignore_errors=True)
                if not self.tmp.exists():
                    break
                time.sleep(0.5)


_embedded: list[Any] = []  # the embedded server lives as long as this process


def resolve_server(url: str | None) -> str:
    """The admin URL of the target server: the one given, the local PostgreSQL, or an embedded one."""
    candidate = url or os.environ.get("TICKLER_BENCH_DATABASE_URL") or DEFAULT_URL
    try:
        with psycopg.connect(libpq_url(candidate), connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return libpq_url(candidate)
    except psycopg.OperationalError:
        if url:
            raise
    say(f"{candidate} is not reachable: starting an embedded PostgreSQL (pgserver)")
    server = _pgserver(ROOT / ".tickler-bench" / "pgdata")
    _embedded.append(server)
    execute(str(server.get_uri()), "ALTER SYSTEM SET max_connections = 200")
    return str(server.get_uri())


@contextmanager
def server(private: bool, url: str | None = None) -> Iterator[str]:
    """The admin URL of a run's server: a private cluster, removed at the end; else resolve_server's."""
    cluster = PrivateCluster() if private else None
    try:
        yield cluster.start() if cluster else resolve_server(url)
    finally:
        if cluster:
            cluster.stop()
