"""The mistakes people make starting tickler get one line on stderr and exit 2, never a traceback:
a database that cannot be reached, a role or database that does not exist, a URL that is not
PostgreSQL's, a port in use, a bad log setting, Ctrl-C during start-up, a closed pipe. Real
processes against the tests' real PostgreSQL."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from tests import pg
from tests.helpers import kill_if_running
from tests.helpers_wait import wait_until
from tickler.scheduler.db import libpq_url
from tickler.scheduler.migrate import MIGRATION_LOCK_KEY

TICKLER = [sys.executable, "-m", "tickler.cli"]


def _env(tmp_path: Path, **variables: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TICKLER_")}
    return {**env, "TICKLER_DATA_DIR": str(tmp_path / "nothing-here"), "TICKLER_LOG_FORMAT": "json", **variables}


def _run(tmp_path: Path, *args: str, **variables: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TICKLER, *args], env=_env(tmp_path, **variables), capture_output=True, text=True, timeout=60
    )


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The error line, after checking that it is the only thing said besides JSON log lines."""
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr, result.stderr
    said = [line for line in result.stderr.splitlines() if not line.startswith(("{", "tickler migrate: database"))]
    assert len(said) == 1 and said[0].startswith("tickler: "), result.stderr
    return said[0]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _url(database_url: str, **parts: object) -> str:
    return make_url(libpq_url(database_url)).set(**parts).render_as_string(hide_password=False)  # type: ignore[arg-type]


# Each mistake once, spread over the commands that reach the database.
@pytest.mark.parametrize(
    ("command", "mistake", "said"),
    [
        (("queues", "list"), "unreachable", "Connection refused"),
        (("migrate",), "unresolvable", "check the host name"),
        (("token", "create", "svc"), "no_role", 'role "nobody" does not exist'),
        (("serve", "--port", "0"), "no_database", 'database "nothing" does not exist'),
        (("events", "list", "emails"), "unreachable", "is PostgreSQL running there"),
    ],
)
def test_a_database_that_cannot_be_reached_is_one_line_naming_it_without_the_password(
    database_url: str, tmp_path: Path, command: tuple[str, ...], mistake: str, said: str
) -> None:
    url = {
        "unreachable": f"postgresql://ana:s3cret@127.0.0.1:{_free_port()}/tickler",
        "unresolvable": "postgresql://ana:s3cret@no-such-host.invalid/tickler",
        "no_role": _url(database_url, username="nobody", password="s3cret"),
        "no_database": _url(database_url, database="nothing", password="s3cret"),
    }[mistake]
    result = _run(tmp_path, *command, TICKLER_DATABASE_URL=url)
    line = _one_line_error(result)
    assert said in line, line
    assert "s3cret" not in result.stderr + result.stdout
    if mistake == "unreachable":
        assert "127.0.0.1" in line and "/tickler as ana" in line


@pytest.fixture(scope="module")
def password_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private embedded PostgreSQL that asks every role but `postgres` for a password (SCRAM),
    with a role `ana` whose password is `right`; the socket URL of its `postgres` database.
    (The tests' own servers trust every connection, so a wrong password is never refused there.)"""
    data = tmp_path_factory.mktemp("password-server") / "pgdata"
    server = pg.embedded_server(data)
    try:
        hba = data / "pg_hba.conf"
        # First match wins: postgres keeps its trust (to set up), everyone else needs a password.
        lines = "local all postgres trust\nlocal all all scram-sha-256\nhost all all 127.0.0.1/32 scram-sha-256\n"
        hba.write_text(lines + hba.read_text())
        with psycopg.connect(str(server.get_uri()), autocommit=True) as conn:
            conn.execute("SET password_encryption = 'scram-sha-256'")
            conn.execute("CREATE ROLE ana LOGIN PASSWORD 'right'")
            conn.execute("SELECT pg_reload_conf()")
        # The server asks, and the right password is let in: the refusals below are about the password.
        right = make_url(str(server.get_uri())).set(username="ana", password="right")
        psycopg.connect(right.render_as_string(hide_password=False)).close()
        yield str(server.get_uri())
    finally:
        server.cleanup()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "user", "password", "said"),
    [
        (("queues", "list"), "ana", "s3cret", 'password authentication failed for user "ana"'),
        (("migrate",), "ana", "s3cret", 'password authentication failed for user "ana"'),
        (("token", "create", "svc"), "ana", "s3cret", 'password authentication failed for user "ana"'),
        (("serve", "--port", "0"), "ana", "s3cret", 'password authentication failed for user "ana"'),
        # Under password authentication the server does not tell a missing role from a wrong password.
        (("events", "list", "emails"), "nobody", "s3cret", 'password authentication failed for user "nobody"'),
        (("queues", "list"), "ana", None, "no password supplied"),
    ],
)
def test_a_wrong_password_or_missing_role_is_one_line(
    password_server: str,
    tmp_path: Path,
    command: tuple[str, ...],
    user: str,
    password: str | None,
    said: str,
) -> None:
    url = make_url(password_server).set(username=user, password=password)
    result = _run(tmp_path, *command, TICKLER_DATABASE_URL=url.render_as_string(hide_password=False))
    line = _one_line_error(result)
    assert said in line and "check the user and password in TICKLER_DATABASE_URL" in line, line
    assert f"/postgres as {user}" in line, line
    assert "s3cret" not in result.stderr + result.stdout


def test_a_url_that_is_not_postgresql_is_one_line(tmp_path: Path) -> None:
    line = _one_line_error(_run(tmp_path, "migrate", TICKLER_DATABASE_URL="mysql://root:s3cret@localhost/app"))
    assert "must be a PostgreSQL URL" in line and "mysql://" in line and "s3cret" not in line


@pytest.mark.parametrize(
    ("variable", "value"), [("TICKLER_LOG_LEVEL", "verbose"), ("TICKLER_LOG_FORMAT", "xml"), ("TICKLER_POOL_SIZE", "x")]
)
def test_a_bad_setting_is_one_line(tmp_path: Path, variable: str, value: str) -> None:
    line = _one_line_error(_run(tmp_path, "queues", "list", **{variable: value}))
    assert variable in line and repr(value) in line


def test_migrate_names_the_server_and_database_it_migrates_first(admin_url: str, tmp_path: Path) -> None:
    url = pg.create_database(admin_url, prefix="tickler_named")
    try:
        result = _run(tmp_path, "migrate", TICKLER_DATABASE_URL=url)
        assert result.returncode == 0, result.stderr
        first = result.stderr.splitlines()[0]
        assert first.startswith("tickler migrate: database ") and make_url(url).database in first, first
        # One summary line for the run, not one per migration file.
        logged = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
        assert [entry["event"] for entry in logged] == ["migrations_applied"], logged
        again = _run(tmp_path, "migrate", TICKLER_DATABASE_URL=url).stderr.splitlines()
        assert again[1:] == ["nothing to apply: the database is up to date"], again
    finally:
        pg.drop_database(admin_url, url)


@pytest.fixture
def fresh_database(admin_url: str) -> Iterator[str]:
    """An empty database (not migrated): what a start-up that went too far would change."""
    url = pg.create_database(admin_url, prefix="tickler_fresh")
    yield url
    pg.drop_database(admin_url, url)


def _migrated(url: str) -> bool:
    with psycopg.connect(libpq_url(url)) as conn:
        found = conn.execute("SELECT to_regclass('tickler_migration') IS NOT NULL").fetchone()
        return bool(found and found[0])


def test_a_port_in_use_is_one_line_and_nothing_starts(fresh_database: str, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = _one_line_error(_run(tmp_path, "serve", "--port", str(port), TICKLER_DATABASE_URL=fresh_database))
    assert f"port {port} on 127.0.0.1 is already in use" in line
    assert not _migrated(fresh_database)  # the database was not even reached


def test_a_host_that_does_not_resolve_is_one_line(fresh_database: str, tmp_path: Path) -> None:
    result = _run(tmp_path, "serve", "--host", "no-such-host.invalid", TICKLER_DATABASE_URL=fresh_database)
    assert "does not resolve" in _one_line_error(result)
    assert not _migrated(fresh_database)


def test_sigint_during_start_up_stops_serve_with_one_line(fresh_database: str, tmp_path: Path) -> None:
    """Start-up is held inside the migrations (the test holds their lock) and interrupted there,
    as a Ctrl-C would; also when SIGINT was ignored at launch, as `tickler serve &` does."""
    log_path = tmp_path / "serve.log"
    with psycopg.connect(libpq_url(fresh_database), autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", [MIGRATION_LOCK_KEY])
        with log_path.open("w") as log:
            process = subprocess.Popen(
                [*TICKLER, "serve", "--port", "0"],
                env=_env(tmp_path, TICKLER_DATABASE_URL=fresh_database),
                stderr=log,
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # what `&` does
            )
        try:

            def waiting_for_the_lock() -> bool:
                row = holder.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                ).fetchone()
                return bool(row and row[0])

            wait_until(waiting_for_the_lock, timeout=60, what=lambda: log_path.read_text())
            process.send_signal(signal.SIGINT)
            assert process.wait(timeout=30) == 130
        finally:
            kill_if_running(process)
    said = [line for line in log_path.read_text().splitlines() if not line.startswith("{")]
    assert said == ["tickler: interrupted while starting; nothing was left running"], log_path.read_text()
    first = json.loads(log_path.read_text().splitlines()[0])
    assert first["event"] == "database" and make_url(fresh_database).database in first["database"]


def test_a_closed_pipe_ends_quietly(database_url: str, tmp_path: Path) -> None:
    """`tickler token list --json | head -c 10`: the reader is gone before tickler writes."""
    process = subprocess.Popen(
        [*TICKLER, "token", "list", "--json"],
        env=_env(tmp_path, TICKLER_DATABASE_URL=database_url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # long before the command has its answer to print
    with process.stderr:
        stderr = process.stderr.read()
    assert process.wait(timeout=60) == 0, stderr
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr
