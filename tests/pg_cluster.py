"""Real PostgreSQL 15 servers on loopback TCP ports (Debian's binaries), for the tests of several
hosts: a primary, a streaming standby made with pg_basebackup, kill -9, promotion.

initdb and postgres refuse to run as root: as root, every command runs as the system user the
embedded server (pgserver) already runs as, which owns the data directories.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import psutil  # pgserver's dependency
import psycopg

PG_BIN = Path("/usr/lib/postgresql/15/bin")
RUN_AS = "pgserver"


def available() -> bool:
    return (PG_BIN / "initdb").is_file()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_user() -> dict[str, Any]:
    if os.geteuid() != 0:
        return {}
    try:
        pwd.getpwnam(RUN_AS)
    except KeyError:
        subprocess.run(["useradd", "-s", "/bin/bash", RUN_AS], check=True, capture_output=True)
    return {"user": RUN_AS, "group": RUN_AS}


def _run(*command: str | Path) -> None:
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, cwd="/", **_as_user())
    if done.returncode != 0:
        raise RuntimeError(f"{command[0]} failed: {done.stdout}{done.stderr}")


class Node:
    """One server: its data directory and port."""

    def __init__(self, root: Path, name: str, port: int | None = None) -> None:
        self.data = root / name
        self.port = port or free_port()
        self.name = name

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def init(self, **settings: str) -> Node:
        """initdb, with these settings over the tests' (e.g. a benchmark's fsync = on)."""
        _run(PG_BIN / "initdb", "-D", self.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        defaults = {
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": "''",
            "wal_level": "replica",
            "max_wal_senders": "10",
            "wal_keep_size": "'128MB'",
            "wal_log_hints": "on",  # pg_rewind
            "hot_standby": "on",
            "max_connections": "100",
            "shared_buffers": "'32MB'",
            "fsync": "off",  # a kill -9 keeps the OS's cache: what these tests lose is the process
        }
        self.configure(**{**defaults, **settings})
        return self

    def configure(self, **settings: str) -> None:
        lines = "".join(f"{name} = {value}\n" for name, value in settings.items())
        with (self.data / "postgresql.auto.conf").open("a") as conf:
            conf.write(lines)

    def start(self) -> Node:
        self.configure(port=str(self.port))
        _run(PG_BIN / "pg_ctl", "-D", self.data, "-l", self.data / "server.log", "-w", "-t", "30", "start")
        return self

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            subprocess.run(
                [str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"],
                capture_output=True,
                cwd="/",
                **_as_user(),
            )

    def kill(self) -> None:
        """kill -9 the server and every process of it, as a machine that died would leave it."""
        pid = int((self.data / "postmaster.pid").read_text().split()[0])
        postmaster = psutil.Process(pid)
        processes = [postmaster, *postmaster.children(recursive=True)]
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGKILL)
        psutil.wait_procs(processes, timeout=10)

    def promote(self) -> None:
        _run(PG_BIN / "pg_ctl", "-D", self.data, "-w", "-t", "30", "promote")

    def standby(self, root: Path, name: str) -> Node:
        """A streaming standby of this server (pg_basebackup -R), not started."""
        node = Node(root, name)
        _run(PG_BIN / "pg_basebackup", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
             "-D", node.data, "-R", "-X", "stream", "--no-sync", "-c", "fast")  # fmt: skip
        node.configure(primary_conninfo=f"'host=127.0.0.1 port={self.port} user=postgres application_name={name}'")
        return node

    def rewind_to(self, source: Node) -> None:
        """Make this (stopped) old primary a standby of `source` (pg_rewind). pg_rewind copies
        the source's configuration too: this node's own port and upstream are set again after."""
        # a promoted server's control file names its new timeline only after a checkpoint;
        # without one pg_rewind finds nothing to rewind, and the node cannot follow
        source.execute("CHECKPOINT")
        _run(PG_BIN / "pg_rewind", "-D", self.data, f"--source-server=host=127.0.0.1 port={source.port} user=postgres",
             "-R", "--no-sync")  # fmt: skip
        self.configure(
            primary_conninfo=f"'host=127.0.0.1 port={source.port} user=postgres application_name={self.name}'"
        )

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the server's log, for a failure message."""
        log = self.data / "server.log"
        return log.read_text(errors="replace")[-chars:] if log.exists() else "(no log)"

    def execute(self, statement: str, dbname: str = "postgres") -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url(dbname), autocommit=True, connect_timeout=5) as conn:
            cursor = conn.execute(statement)  # type: ignore[call-overload]
            return list(cursor.fetchall()) if cursor.description else []


def synchronous_pair(root: Path, dbname: str = "tickler", **settings: str) -> tuple[Node, Node]:
    """A started primary with database `dbname` migrated, and its started standby, synchronous
    (synchronous_standby_names = '*': a commit is answered once the standby has it). `settings`:
    Node.init's. The failover tests' fixture and bench/failover.py."""
    from tests.helpers_wait import wait_until
    from tickler.scheduler.migrate import migrate

    primary = Node(root, "a").init(**settings).start()
    try:
        primary.execute(f"CREATE DATABASE {dbname}")
        migrate(primary.url(dbname))
        standby = primary.standby(root, "b").start()
    except BaseException:
        primary.stop()
        raise
    # synchronous from now on (before, a commit would wait for a standby not there yet)
    primary.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
    primary.execute("SELECT pg_reload_conf()")
    try:
        wait_until(
            lambda: primary.execute("SELECT sync_state FROM pg_stat_replication") == [("sync",)],
            timeout=30,
            what=lambda: "the standby streaming synchronously: " + standby.log_tail(),
        )
    except BaseException:
        for node in (primary, standby):
            node.stop()
        raise
    return primary, standby


def make_root() -> Path:
    """A directory the server's user can reach (not under pytest's private tmp)."""
    root = Path(tempfile.mkdtemp(prefix="tickler-pg15-"))
    root.chmod(0o755)
    if _as_user():
        shutil.chown(root, RUN_AS, RUN_AS)
    return root


def remove_root(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
