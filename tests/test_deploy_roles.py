"""The two database roles of docs/deploy.md, set up as the guide writes them, on a PostgreSQL 15
cluster of our own that checks passwords (scram-sha-256 on loopback): the superuser creates the
roles and the database, the owner grants and migrates, and the data-only service role creates a
queue and runs a worker that delivers an event. A service role that finds a step pending stops in
one line; the owner's `tickler migrate` shows the step it applies."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.helpers_wait import wait_until
from tickler.scheduler.db import create_engine
from tickler.scheduler.models import NewEvent
from tickler.scheduler.store import Store

ROOT = Path(__file__).resolve().parent.parent
PG_BIN = Path("/usr/lib/postgresql/15/bin")
SUPERUSER_PASSWORD = "super-secret-1"
PASSWORDS = {"CHANGE-ME-owner": "owner-secret-2", "CHANGE-ME-app": "app-secret-3"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def superuser_url() -> Iterator[str]:
    """A throwaway cluster made by `initdb --auth=scram-sha-256`: every connection, loopback TCP
    included, must give its password. initdb refuses root: as root it runs as `postgres`."""
    if not (PG_BIN / "initdb").exists():
        pytest.skip("PostgreSQL 15's initdb is not installed here")
    run_as: dict[str, str] = {}
    if os.geteuid() == 0:
        run_as = {"user": "postgres", "group": "postgres"}
    base = Path(tempfile.mkdtemp(prefix="tkl-scram-"))
    password_file = base / "password"
    password_file.write_text(SUPERUSER_PASSWORD)
    if run_as:
        shutil.chown(base, "postgres", "postgres")
        shutil.chown(password_file, "postgres", "postgres")
    data, port = base / "data", _free_port()
    pg_ctl = [str(PG_BIN / "pg_ctl"), "-D", str(data)]
    try:
        subprocess.run(
            [str(PG_BIN / "initdb"), "-D", str(data), "--auth=scram-sha-256", "-U", "postgres",
             f"--pwfile={password_file}", "--encoding=UTF8", "--no-sync"],
            check=True, capture_output=True, **run_as,  # type: ignore[call-overload]
        )  # fmt: skip
        options = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run(
            [*pg_ctl, "-w", "-l", str(base / "log"), "-o", options, "start"],
            check=True, capture_output=True, timeout=60, **run_as,  # type: ignore[call-overload]
        )  # fmt: skip
        yield f"postgresql://postgres:{SUPERUSER_PASSWORD}@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*pg_ctl, "-m", "fast", "stop"], capture_output=True, timeout=60, **run_as)  # type: ignore[call-overload]
        shutil.rmtree(base, ignore_errors=True)


def _guide_sql(kind: str) -> list[str]:
    """The statements of docs/deploy.md's ```sql <kind>``` block, with the test's passwords."""
    guide = (ROOT / "docs" / "deploy.md").read_text()
    [block] = re.findall(rf"^```sql {kind}\n(.*?)^```", guide, re.DOTALL | re.MULTILINE)
    for placeholder, password in PASSWORDS.items():
        block = block.replace(placeholder, password)
    lines = [line for line in block.splitlines() if not line.lstrip().startswith("--")]
    return [statement.strip() for statement in "\n".join(lines).split(";") if statement.strip()]


def _url(superuser_url: str, role: str, password: str) -> str:
    return superuser_url.replace(f"postgres:{SUPERUSER_PASSWORD}@", f"{role}:{password}@").replace(
        "/postgres", "/tickler"
    )


def _env(url: str, tmp_path: Path, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TICKLER_")}
    return env | {
        "TICKLER_DATABASE_URL": url,
        "TICKLER_DATA_DIR": str(tmp_path / "no-embedded"),
        "TICKLER_LOG_FORMAT": "json",
        "PYTHONPATH": str(ROOT),
        **more,
    }


def _tickler(url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tickler.cli", *args],
        env=_env(url, tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )


def _said(result: subprocess.CompletedProcess[str]) -> list[str]:
    """What a command said for people (its JSON log lines left out)."""
    return [line for line in result.stderr.splitlines() if not line.startswith("{")]


def test_the_guides_two_roles_migrate_and_serve_on_a_password_checking_cluster(
    superuser_url: str, tmp_path: Path
) -> None:
    # 1. The superuser: the roles and the database.
    with psycopg.connect(superuser_url, autocommit=True) as conn:
        for statement in _guide_sql("as-superuser"):
            conn.execute(statement.encode())
    owner = _url(superuser_url, "tickler_owner", PASSWORDS["CHANGE-ME-owner"])
    app = _url(superuser_url, "tickler_app", PASSWORDS["CHANGE-ME-app"])
    # 2. The owner: the grants, then the migrations, step by step.
    with psycopg.connect(owner, autocommit=True) as conn:
        for statement in _guide_sql("as-owner"):
            conn.execute(statement.encode())
    migrated = _tickler(owner, tmp_path, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert any(line.startswith("a new database: creating today's schema") for line in _said(migrated)), migrated
    again = _tickler(owner, tmp_path, "migrate")
    assert _said(again)[1:] == ["nothing to apply: the database is up to date"], again.stderr

    # 3. The service role: data only, and enough to run tickler.
    with psycopg.connect(app, autocommit=True) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("CREATE TABLE not_allowed (id int)")
    created = _tickler(app, tmp_path, "queues", "create", "work", "--json")
    assert created.returncode == 0, created.stderr
    engine = create_engine(app, pool_size=1)
    try:
        store = Store(engine)
        event, _ = store.events.schedule(store.queues.get("work"), NewEvent("k1", {}), actor="test")
    finally:
        engine.dispose()
    # A worker as the service role, told nothing about migrations (TICKLER_MIGRATE_ON_START
    # defaults to true): nothing is pending, so it starts and delivers.
    record = tmp_path / "record"
    record.mkdir()
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "tickler.cli", "worker", "--handlers", "tests.workers.recording:handlers"],
            env=_env(app, tmp_path, RECORD_DIR=str(record), QUEUE="work"),
            cwd=ROOT,
            stdout=out,
            stderr=out,
        )
    try:

        def handled() -> bool:
            if worker.poll() is not None:
                raise AssertionError(f"the worker exited with {worker.returncode}: {log.read_text()}")
            return any(f.read_text().split() == [str(event.id)] for f in record.glob("handled-*.txt"))

        wait_until(handled, timeout=60, interval=0.1, what=log.read_text)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0, log.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert "Traceback" not in log.read_text()

    # A step pending (the owner has not migrated this release yet): the service role cannot
    # apply it, and says so in one line; the owner's migrate shows the step it applies.
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute("DELETE FROM tickler_code_file WHERE file = 'writing.sql'")
    refused = _tickler(app, tmp_path, "worker")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    [line] = _said(refused)
    assert "1 step pending (writing.sql)" in line and "tickler_app" in line and "tickler migrate" in line, line
    assert len(line) < 300, line
    applied = _tickler(owner, tmp_path, "migrate")
    assert applied.returncode == 0, applied.stderr
    assert re.fullmatch(r"  applied code file writing\.sql in \d+\.\d\d s", _said(applied)[1]), applied.stderr
    assert _said(applied)[2].startswith("applied 1 step(s) in "), applied.stderr

    # And the cluster does check passwords: a wrong one is refused in one line.
    wrong = _tickler(_url(superuser_url, "tickler_app", "wrong"), tmp_path, "queues", "list")
    assert wrong.returncode == 2 and "password authentication failed" in wrong.stderr, wrong.stderr
