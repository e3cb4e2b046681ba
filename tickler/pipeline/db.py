"""The pipeline's side of PostgreSQL: its named queries, connections, and where the server listens.

A named query runs as the engine's do (sql.run), on a job's own connection: rows() and rowcount()."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, LiteralString

import psycopg
from psycopg.conninfo import make_conninfo

from tickler.config.database_url import DatabaseAddress, Host
from tickler.config.database_url import parse as parse_database_url
from tickler.scheduler import sql
from tickler.scheduler.db import libpq_url
from tickler.scheduler.sql import parse_queries


@cache
def queries() -> dict[str, str]:
    source = resources.files("tickler.pipeline").joinpath("queries.sql").read_text(encoding="utf-8")
    return parse_queries(source)


def q(name: str) -> LiteralString:
    """The named query `name` of pipeline/queries.sql (psycopg `%(name)s` parameters)."""
    # the text comes from our own file, never from input: that is what LiteralString stands for
    text: LiteralString = queries()[name]  # type: ignore[assignment]
    return text


def rows(
    conn: psycopg.Connection[Any], name: str, params: Mapping[str, Any] | None = None, *, tuples: bool = False
) -> list[Any]:
    """The rows of the named query `name` run on a job's connection (sql.run: as dicts; `tuples`:
    as tuples), [] for one that returns none. Prepared as psycopg chooses: a job runs most of its
    statements once."""
    return sql.run(conn, q(name), params, tuples=tuples, prepare=None)


def rowcount(conn: psycopg.Connection[Any], name: str, params: Mapping[str, Any] | None = None) -> int:
    """rows(), for the number of rows the statement changed (sql.rowcount)."""
    return sql.rowcount(conn, q(name), params, prepare=None)


# A job's queries must end with the job. Without these, a driver killed with -9 left its queries
# running for as long as they took (PostgreSQL only notices a gone client when it next writes to
# it): the server checks the connection while a query runs, TCP keepalives find a peer that
# vanished from the network, and no statement runs longer than the timeout.
STATEMENT_TIMEOUT_ENV = "TICKLER_PIPELINE_STATEMENT_TIMEOUT"
DEFAULT_STATEMENT_TIMEOUT = "2h"  # PostgreSQL's units: 250ms, 30s, 10min, 2h; 0 for none
CLIENT_CHECK = "5s"
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}


def session_settings() -> dict[str, str]:
    """The server settings of every session of a job (psycopg's and the JDBC reads')."""
    return {
        "TimeZone": "UTC",
        "statement_timeout": os.environ.get(STATEMENT_TIMEOUT_ENV) or DEFAULT_STATEMENT_TIMEOUT,
        "client_connection_check_interval": CLIENT_CHECK,
    }


def session_options() -> str:
    """session_settings() as a libpq `options` value."""
    return " ".join(f"-c {name}={value}" for name, value in session_settings().items())


def connect(url: str, **kwargs: Any) -> psycopg.Connection[Any]:
    """A psycopg connection to the database at `url` (any spelling tickler accepts), in UTC, with
    the job's statement timeout, keepalives and client check."""
    kwargs.setdefault("application_name", "tickler-pipeline")
    conninfo = make_conninfo(libpq_url(url), options=session_options(), **KEEPALIVES)
    return psycopg.connect(conninfo, **kwargs)


@dataclass(frozen=True)
class Endpoint:
    """Where the server is (every host of a failover list) and who logs in, for Spark's JDBC reads."""

    address: DatabaseAddress

    @property
    def user(self) -> str:
        return self.address.login

    @property
    def password(self) -> str:
        return self.address.password or ""

    @property
    def is_tcp(self) -> bool:
        return self.address.is_tcp

    def jdbc_url(self) -> str:
        """pgjdbc's URL over every host, the primary chosen as libpq's target_session_attrs says
        (credentials travel as properties, not in the URL), with the job's session settings and
        TCP keepalives (pgjdbc's are the operating system's timings)."""
        return self.address.jdbc_url([("tcpKeepAlive", "true"), ("options", session_options())])


def endpoint(url: str) -> Endpoint:
    return Endpoint(parse_database_url(url))


def pinned(url: str, conn: psycopg.Connection[Any]) -> str:
    """`url` naming only the host (and port) `conn` reached, as libpq's URL."""
    address = parse_database_url(url)
    host = Host(conn.info.host, int(conn.info.port) if conn.info.port else None)
    return DatabaseAddress((host,), address.dbname, address.user, address.password, address.options).libpq_url()
