"""The pipeline's side of PostgreSQL: its named queries, connections, and where the server listens.

A named query runs as the engine's do (sql.run), on a job's own connection: rows() and rowcount()."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, LiteralString
from urllib.parse import urlencode

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

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
    """Where the server is: TCP host and port, or a unix socket directory."""

    host: str
    port: int
    dbname: str
    user: str
    password: str
    params: dict[str, str]

    @property
    def is_tcp(self) -> bool:
        return bool(self.host) and not self.host.startswith("/") and not self.host.startswith("@")

    def jdbc_url(self) -> str:
        """The JDBC URL (credentials travel as properties, not in the URL), with the job's session
        settings and TCP keepalives (pgjdbc's are the operating system's timings)."""
        params = {**self.params, "tcpKeepAlive": "true", "options": session_options()}
        return f"jdbc:postgresql://{self.host}:{self.port}/{self.dbname}?{urlencode(params)}"


# libpq parameters that pgjdbc understands under the same name
_JDBC_PARAMS = ("sslmode", "sslrootcert", "sslcert", "sslkey", "connect_timeout")


def endpoint(url: str) -> Endpoint:
    info = conninfo_to_dict(libpq_url(url))
    host = str(info.get("host") or "")
    # several hosts (failover lists): JDBC takes the first one here
    host = host.split(",")[0]
    port = int(str(info.get("port") or "5432").split(",")[0])
    return Endpoint(
        host=host,
        port=port,
        dbname=str(info.get("dbname") or info.get("user") or "postgres"),
        user=str(info.get("user") or "postgres"),
        password=str(info.get("password") or ""),
        params={k: str(info[k]) for k in _JDBC_PARAMS if info.get(k)},
    )
