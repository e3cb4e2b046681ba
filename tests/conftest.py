"""Fixtures: one migrated database per test session, emptied before each test (TRUNCATE), an
app over it, and tokens. Everything talks to a real PostgreSQL; nothing is mocked."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
import structlog
from flask import Flask
from flask.testing import FlaskClient

from tests import pg
from tests.helpers_http import serving_app
from tickler.api import close_app, create_app
from tickler.config import Settings
from tickler.scheduler.db import create_engine, libpq_url
from tickler.scheduler.delivery.webhook import WebhookDeliverer
from tickler.scheduler.dispatcher import Dispatcher, DispatcherConfig
from tickler.scheduler.logs import route_structlog_to_stdlib
from tickler.scheduler.migrate import migrate
from tickler.scheduler.models import Queue
from tickler.scheduler.store import QueueSettings, Store
from tickler.scheduler.wakeup import WakeupListener

# The Python client's fixtures (admin, tickler), for tests/test_client_*.py; the pipeline's (spark,
# pipeline_db), for tests/test_pipeline_*.py.
pytest_plugins = ["tests.client_fixtures", "tests.pipeline_fixtures"]

# Each checkout keeps pytest's temporary directories under its own root. Under the shared one
# (/tmp/pytest-of-<user>), a test session that starts beside a running one makes that root private
# again (mode 0700) and prunes its older numbered directories: as root, the embedded PostgreSQL
# runs as the user `pgserver`, which then can no longer reach the data directories of the session
# already running (initdb: "could not open pg_control: Permission denied").
_TEMP_ROOT = Path(__file__).resolve().parent.parent / ".pytest-tmp"
if "PYTEST_DEBUG_TEMPROOT" not in os.environ:
    _TEMP_ROOT.mkdir(exist_ok=True)
    os.environ["PYTEST_DEBUG_TEMPROOT"] = str(_TEMP_ROOT)

# What `make test-quick` leaves out: the tests that start a Spark session or a browser.
HEAVY = {"spark": "spark", "browser": "browser"}


# The longest runs of the suite, started first: under xdist a worker takes the next file when it
# is free, so a long file collected late (alphabetically) would run alone at the end. The Spark
# files are one unit (below) and the longest of all. xdist keeps this order only with
# --no-loadscope-reorder (pyproject.toml): by default it hands out the files with the most tests
# first, and a long file of one or two tests (the fuzz run, the standalone Spark cluster, the
# 100,000 deliveries) then started last of all.
LONG_FIRST = (
    "test_pipeline_",
    "test_readme.py",
    "test_openapi_fuzz.py",
    "test_webhook_memory.py",
    "test_tracing.py",
    "test_cli_operations.py",
    "test_webhook_engine.py",
    "test_serve_signals.py",
    "test_erasure_races.py",
    "test_plans_history.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the Spark and browser tests (by the fixture they use, or their file) for `-m`, and
    put the longest files first (a stable sort: each file's tests keep their order)."""
    for item in items:
        heavy = _heavy_group(item.path.name)
        fixtures = getattr(item, "fixturenames", ())
        heavy = heavy or next((marker for fixture, marker in HEAVY.items() if fixture in fixtures), None)
        if heavy:
            item.add_marker(getattr(pytest.mark, heavy))
    items.sort(key=_start_rank)


def _start_rank(item: pytest.Item) -> int:
    name = item.path.name
    return next((rank for rank, start in enumerate(LONG_FIRST) if name.startswith(start)), len(LONG_FIRST))


def _heavy_group(file_name: str) -> str | None:
    if file_name.startswith("test_pipeline_"):
        return "spark"  # the spark fixture's users, and the commands that start Spark in-process
    if file_name.endswith("_browser.py"):
        return "browser"
    return None


# Pipeline files that use no shared Spark session (their jobs run in `tickler pipeline` processes
# of their own, or they need no Spark at all) run beside the Spark worker instead of after it.
OWN_SPARK = {
    "test_pipeline_cli.py",
    "test_pipeline_cluster.py",
    "test_pipeline_report_page.py",
    "test_pipeline_sessions.py",
}


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist (`-n 4 --dist loadfile`): a test file runs on one worker, so its module
    fixtures start once; all the Spark files that share the session run on one worker, one after
    the other (one Spark session, which no other file's tests can disturb half-way), and so do the
    browser files (one Chromium). A file whose jobs start a Spark of their own (OWN_SPARK) runs
    beside them, as any other file. Each worker has its own database (`database_url`). (pytest
    9.2 ignores the node id suffix that `--dist loadgroup` relies on, hence a scheduler of our
    own.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByFileSparkAndBrowserTogether(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            name = path.rsplit("/", 1)[-1]
            return path if name in OWN_SPARK else _heavy_group(name) or path

    return ByFileSparkAndBrowserTogether(config, log)


TABLES = (
    "tickler_event, tickler_timeline, tickler_queue_count, tickler_token, tickler_queue, "
    "tickler_archived_key, tickler_archive_item, tickler_archive_run, tickler_minute_stat, tickler_ui_secret, "
    "tickler_schedule, tickler_import_reject, tickler_import_batch, tickler_import, "
    "tickler_event_history, tickler_history_count, tickler_archive_progress, tickler_erasure, tickler_erasure_work, "
    "tickler_erased_value, "
    "tickler_operation_log, tickler_due_count"
)


@pytest.fixture(scope="session")
def admin_url() -> Iterator[str]:
    """A PostgreSQL server on which the tests may create databases."""
    external = os.environ.get("TICKLER_TEST_DATABASE_URL")
    if external:
        yield external
        return
    # Not under pytest's tmp_path: pytest prunes old base directories, which could remove the
    # data of a server another test session (running at the same time) still uses.
    directory = Path(tempfile.mkdtemp(prefix="tickler-test-pg-"))
    yield pg.start_embedded_server(directory / "data")
    pg.stop_embedded_server()
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def database_url(admin_url: str) -> Iterator[str]:
    url = pg.create_database(admin_url)
    migrate(url)
    yield url
    pg.drop_database(admin_url, url)


@pytest.fixture(scope="session")
def engine(database_url: str) -> Iterator[sa.Engine]:
    engine = create_engine(database_url, pool_size=5)
    yield engine
    engine.dispose()


# Every test starts from the same logging: tickler's structlog lines go through stdlib logging
# (INFO dropped, warnings to stderr, until a test configures a handler), whichever tests this
# worker ran before, and no logger is cached, so that `capture_logs` sees every line.
route_structlog_to_stdlib(cache=False)


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """A test that configures logging (as `tickler serve` and the app do) leaves the process's
    logging as it found it. Otherwise its root handler, bound to the test's captured stderr, and
    the loggers structlog cached under its configuration outlive it: a later test's request then
    logs through a closed stream, and `capture_logs` there captures nothing."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    processors = structlog.get_config()["processors"]
    yield
    if structlog.get_config()["processors"] is processors and root.handlers == handlers:
        return
    route_structlog_to_stdlib(cache=False)
    root.handlers[:] = handlers
    root.setLevel(level)
    _uncache_module_loggers()


def _uncache_module_loggers() -> None:
    """structlog's module-level loggers keep the processors of the configuration they were
    first used under (cache_logger_on_first_use); forgetting that makes them read it anew."""
    lazy_logger = type(structlog.get_logger())
    for name, module in list(sys.modules.items()):
        if name.startswith("tickler") and module is not None:
            for value in vars(module).values():
                if isinstance(value, lazy_logger):
                    vars(value).pop("bind", None)


@pytest.fixture(autouse=True)
def _empty_tables(request: pytest.FixtureRequest) -> None:
    """Each test starts from empty tables (identities restarted)."""
    if "database_url" not in request.fixturenames:
        return
    url = request.getfixturevalue("database_url")
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        empty_tables(conn)
        # Today's history and timeline partitions, as a running deployment always has them: a
        # retention test may have dropped them, and the first pass of the next test's dispatcher
        # would then attach today's while that test writes its first rows (which PostgreSQL
        # refuses: a row routed to the default partition just before the attach).
        # Tests move the maintenance clock days ahead; a day a pass at such a clock settled (its
        # `_rest` sorted once) is not over for the next test, which writes at its own clock.
        conn.execute("UPDATE tickler_history_partition SET settled = false WHERE settled")
        conn.execute("SELECT tickler_maintain_history()")


# The tables of TABLES that a test wrote to: TRUNCATE takes ~5 ms per table (a new file for it
# and each of its indexes, and every open connection's cache of them invalidated), ~150 ms for the
# ~40 tables, partitions and tables referring to them; a test writes to a few. A table with no
# page was not written to since it was emptied (any insert, even one rolled back, adds one); one
# with statistics (reltuples not -1) was analyzed or vacuumed since, maybe empty, and plans for
# such a table differ from those for a table TRUNCATE left (tests check plans): both are emptied.
_WRITTEN_TO = """
WITH RECURSIVE
edge(parent, child) AS (
    SELECT confrelid, conrelid FROM pg_constraint WHERE contype = 'f'
    UNION ALL
    SELECT inhparent, inhrelid FROM pg_inherits
),
emptied(rel) AS (
    SELECT unnest(%(tables)s::regclass[])
    UNION
    SELECT edge.child FROM edge JOIN emptied ON edge.parent = emptied.rel
)
SELECT coalesce(array_agg(c.oid::regclass::text ORDER BY c.oid), '{}')
FROM emptied JOIN pg_class AS c ON c.oid = emptied.rel
WHERE c.relkind = 'r' AND (pg_relation_size(c.oid) > 0 OR c.reltuples >= 0)
"""
_TABLE_NAMES = [name.strip() for name in TABLES.split(",")]


def empty_tables(conn: psycopg.Connection[Any]) -> None:
    """`TRUNCATE {TABLES} RESTART IDENTITY CASCADE`, of the tables a test wrote to only (the
    others are as that TRUNCATE leaves them: no page, no statistics, identities at their start)."""
    [[written_to]] = conn.execute(_WRITTEN_TO, {"tables": _TABLE_NAMES}).fetchall()
    if written_to:
        conn.execute("SET tickler.archiving = 'on'")
        conn.execute(f"TRUNCATE {', '.join(written_to)} RESTART IDENTITY CASCADE")
        conn.execute("RESET tickler.archiving")


@pytest.fixture
def raw(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A plain autocommit psycopg connection, for checking what is really in the tables."""
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        yield conn


@pytest.fixture(scope="session")
def settings(database_url: str) -> Settings:
    return Settings(database_url=database_url, migrate_on_start=False, cache_seconds=0, pool_size=5)


@pytest.fixture
def store(engine: sa.Engine) -> Store:
    return Store(engine)


@pytest.fixture(scope="session")
def app(settings: Settings) -> Iterator[Flask]:
    app = create_app(settings, configure_logs=False)
    yield app
    close_app(app)


@pytest.fixture
def make_queue(store: Store) -> Callable[..., Queue]:
    """Create a queue straight in the store: make_queue("emails", lease_seconds=5, ...)."""

    def make(name: str, **wanted: Any) -> Queue:
        return store.queues.put(name, QueueSettings(**wanted), Settings()).queue

    return make


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def admin_token(store: Store) -> str:
    return store.tokens.create("ops", is_admin=True)


@pytest.fixture
def token(store: Store) -> str:
    """A client service's token, scoped to the queue `emails`."""
    return store.tokens.create("signup-service", queues=["emails"])


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def emails(client: FlaskClient, admin_token: str) -> str:
    """The pull queue `emails`, created through the API."""
    response = client.put("/v1/queues/emails", json={}, headers=auth(admin_token))
    assert response.status_code == 201, response.json
    return "emails"


@pytest.fixture
def webhook_dispatcher(store: Store, database_url: str) -> Iterator[Dispatcher]:
    """A running dispatcher that delivers webhook queues (reaping every 0.2 s: retries come soon)."""
    dispatcher = Dispatcher(
        store,
        WakeupListener(database_url),
        DispatcherConfig(worker_name="hooks-test", reap_interval=0.2),
        webhook=WebhookDeliverer(),
    ).start()
    yield dispatcher
    dispatcher.stop()


@pytest.fixture
def live_server(app: Flask) -> Iterator[str]:
    """The app behind a real threaded HTTP server on a free local port; yields its base URL."""
    with serving_app(app) as url:
        yield url
