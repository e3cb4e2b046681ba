"""Every spelling of a database with several hosts reaches the live one from every entry point:
libpq's URL (h1:p1,h2:p2), its query (host=a,b&port=p,q), SQLAlchemy's repeated host=h:p, and
libpq's key=value conninfo. The URLs list a dead port first and a real PostgreSQL 15 on TCP
second, with target_session_attrs=read-write; `tickler migrate`, the command line and `serve` run
as real processes. A URL that cannot be read is one line and exit 2, never the password."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests import pg_cluster
from tests.helpers_wait import wait_until
from tickler.config import Settings, SettingsError
from tickler.config.database_url import Host, parse
from tickler.pipeline import db as pipeline_db
from tickler.scheduler.db import create_engine, driver_rows, libpq_url
from tickler.scheduler.wakeup import CHANNEL, WakeupListener

pytestmark = pytest.mark.skipif(not pg_cluster.available(), reason="needs PostgreSQL 15's binaries")

TICKLER = [sys.executable, "-m", "tickler.cli"]
SPELLINGS = ("url", "query", "repeated", "conninfo")


def spell(spelling: str, dead: int, live: int, dbname: str, password: str = "") -> str:
    secret = f":{password}" if password else ""
    return {
        "url": f"postgresql://postgres{secret}@127.0.0.1:{dead},127.0.0.1:{live}/{dbname}?target_session_attrs=read-write",
        "query": f"postgres://postgres{secret}@/{dbname}?host=127.0.0.1,127.0.0.1&port={dead},{live}"
        "&target_session_attrs=read-write",
        "repeated": f"postgresql+psycopg://postgres{secret}@/{dbname}?host=127.0.0.1:{dead}&host=127.0.0.1:{live}"
        "&target_session_attrs=read-write",
        "conninfo": f"host=127.0.0.1,127.0.0.1 port={dead},{live} dbname={dbname} user=postgres"
        + (f" password={password}" if password else "")
        + " target_session_attrs=read-write",
    }[spelling]


@pytest.fixture(scope="module")
def server() -> Iterator[pg_cluster.Node]:
    root = pg_cluster.make_root()
    node = pg_cluster.Node(root, "primary").init().start()
    yield node
    node.stop()
    pg_cluster.remove_root(root)


@pytest.fixture(scope="module")
def migrated(server: pg_cluster.Node) -> str:
    """A database `tickler migrate` built over the first spelling (its own test checks it)."""
    server.execute("CREATE DATABASE urls")
    done = _tickler(
        Path("/tmp"), "migrate", TICKLER_DATABASE_URL=spell("url", pg_cluster.free_port(), server.port, "urls")
    )
    assert done.returncode == 0, done.stderr
    return "urls"


def _tickler(cwd: Path, *args: str, **variables: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TICKLER_")}
    env.update(TICKLER_DATA_DIR=str(cwd / "no-embedded-here"), TICKLER_LOG_FORMAT="json", **variables)
    return subprocess.run([*TICKLER, *args], env=env, capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_every_spelling_reads_as_the_same_hosts_and_renders_them_all(spelling: str) -> None:
    address = parse(spell(spelling, 5001, 5002, "app", password="s3cret"))
    assert address.hosts == (Host("127.0.0.1", 5001), Host("127.0.0.1", 5002))
    assert (address.dbname, address.user, address.password) == ("app", "postgres", "s3cret")
    assert address.option("target_session_attrs") == "read-write"
    # each rendering reads back as the same database
    for rendered in (address.libpq_url(), address.sqlalchemy_url(), address.conninfo()):
        assert parse(rendered) == address
    assert address.jdbc_url() == "jdbc:postgresql://127.0.0.1:5001,127.0.0.1:5002/app?targetServerType=primary"
    shown = address.display()
    assert shown == "127.0.0.1:5001,127.0.0.1:5002/app as postgres (target_session_attrs=read-write)"
    assert "s3cret" not in shown


def test_one_port_serves_every_host_and_sockets_and_ipv6_keep_their_names() -> None:
    assert parse("postgresql:///db?host=a,b&port=6432").hosts == (Host("a", 6432), Host("b", 6432))
    assert parse("postgresql://u@[::1]:5433,b/db").hosts == (Host("::1", 5433), Host("b"))
    assert parse("postgresql://u@/db?host=/run/postgresql").hosts == (Host("/run/postgresql"),)
    assert parse("host=/run/postgresql,db2 port=5432").hosts == (Host("/run/postgresql", 5432), Host("db2", 5432))


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("postgresql://ana:s3cret@h1:5432,h2:nope/db", "port that is not a number"),
        ("postgresql://ana:s3cret@/db?host=a,b,c&port=1,2", "3 host(s) but 2 port(s)"),
        ("postgresql://ana:s3cret@/db?host=a:1&port=2", "both as host:port and as port="),
        ("host='a,b password=s3cret", "is not libpq's key=value conninfo"),
        ("mysql://root:s3cret@localhost/app", "not a mysql:// one"),
    ],
)
def test_a_malformed_url_is_one_line_and_exit_2_without_the_password(tmp_path: Path, url: str, said: str) -> None:
    with pytest.raises(SettingsError, match="TICKLER_DATABASE_URL"):
        Settings.from_env({"TICKLER_DATABASE_URL": url})
    with pytest.raises(SettingsError, match="TICKLER_READ_DATABASE_URL"):
        Settings.from_env({"TICKLER_READ_DATABASE_URL": url})
    done = _tickler(tmp_path, "migrate", TICKLER_DATABASE_URL=url)
    assert done.returncode == 2, done
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tickler: TICKLER_DATABASE_URL") and said in lines[0], lines
    assert "s3cret" not in done.stderr


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_migrate_skips_the_dead_host_and_names_every_host(
    server: pg_cluster.Node, tmp_path: Path, spelling: str
) -> None:
    dbname = f"migrate_{spelling}"
    server.execute(f"CREATE DATABASE {dbname}")
    dead = pg_cluster.free_port()
    done = _tickler(tmp_path, "migrate", TICKLER_DATABASE_URL=spell(spelling, dead, server.port, dbname))
    assert done.returncode == 0, done.stderr
    assert f"database 127.0.0.1:{dead},127.0.0.1:{server.port}/{dbname} as postgres" in done.stderr
    assert "applied" in done.stderr and "up to date" not in done.stderr
    assert server.execute("SELECT count(*) FROM tickler_migration", dbname)[0][0] > 0


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_engine_listen_pipeline_and_commands_reach_the_live_host(
    server: pg_cluster.Node, migrated: str, tmp_path: Path, spelling: str
) -> None:
    url = spell(spelling, pg_cluster.free_port(), server.port, migrated)
    # the store's engine (SQLAlchemy's URL)
    engine = create_engine(url, pool_size=1)
    try:
        assert driver_rows(engine, "SELECT inet_server_port() AS port") == [{"port": server.port}]
    finally:
        engine.dispose()
    # the LISTEN connection (libpq's URL) hears a NOTIFY sent on the live host
    listener = WakeupListener(url).start()
    try:
        wait_until(listener.connected.is_set, what="the LISTEN connection")
        mark = listener.mark(["emails"])
        with psycopg.connect(libpq_url(url), autocommit=True) as conn:
            conn.execute("SELECT pg_notify(%s, 'emails')", [CHANNEL])
        assert listener.wait(["emails"], mark, timeout=10)
    finally:
        listener.stop()
    # the pipeline's own connections, and Spark's JDBC URL over both hosts
    with pipeline_db.connect(url) as conn:
        assert conn.execute("SELECT inet_server_port()").fetchone() == (server.port,)
    jdbc = pipeline_db.endpoint(url).jdbc_url()
    assert jdbc.startswith(f"jdbc:postgresql://127.0.0.1:{url_dead(url)},127.0.0.1:{server.port}/{migrated}?")
    assert "targetServerType=primary" in jdbc
    # the command line
    done = _tickler(tmp_path, "queues", "list", "--json", TICKLER_DATABASE_URL=url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"queues": []}


def url_dead(url: str) -> int:
    port = parse(url).hosts[0].port
    assert port is not None
    return port


@pytest.mark.parametrize(("command", "event"), [(("serve", "--port", "0"), "serving"), (("worker",), "database")])
def test_serve_and_worker_log_every_host_and_the_read_replica(
    server: pg_cluster.Node, migrated: str, tmp_path: Path, command: tuple[str, ...], event: str
) -> None:
    dead = pg_cluster.free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TICKLER_")}
    env.update(
        TICKLER_LOG_FORMAT="json",
        TICKLER_DATABASE_URL=spell("repeated", dead, server.port, migrated, password="s3cret"),
        TICKLER_READ_DATABASE_URL=f"host=127.0.0.1 port={server.port} dbname={migrated} user=postgres password=s3cret",
    )
    process = subprocess.Popen([*TICKLER, *command], env=env, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    said: list[str] = []
    try:
        assert process.stderr is not None
        for line in process.stderr:
            said.append(line)
            if line.startswith("{") and json.loads(line).get("event") == event:
                banner = json.loads(line)
                break
        else:
            raise AssertionError(f"{command[0]} stopped before logging {event}: {said}")
    finally:
        process.terminate()
        process.wait(timeout=30)
        if process.stderr is not None:
            process.stderr.close()
    assert banner["database"].startswith(f"127.0.0.1:{dead},127.0.0.1:{server.port}/{migrated} as postgres")
    assert banner["read_database"] == f"127.0.0.1:{server.port}/{migrated} as postgres"
    assert not any("s3cret" in line for line in said)
