"""Reading PostgreSQL into Spark, from one consistent snapshot: over JDBC, or exported with COPY.

JDBC (partitioned reads on an id column) is used when the server listens on TCP and the driver
jar is available; every partition joins the snapshot the coordinating transaction exported, so
all of them (and the ledger reads made on the coordinator) see the same instant. Otherwise (the
embedded server is unix-socket only, or no jar) the coordinator COPYs each id range of the
relation to CSV files in one REPEATABLE READ transaction and Spark reads the files.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import psycopg
from psycopg import sql

from tickler.pipeline import db
from tickler.pipeline.spark import PipelineError, is_local, jdbc_jar

SOURCES = ("auto", "jdbc", "snapshot")


@dataclass(frozen=True)
class Relation:
    """A named `source_*` query, its partition column and its Spark schema."""

    query: str
    partition_column: str
    columns: tuple[tuple[str, str], ...]


_EVENT_COLUMNS = (
    ("id", "bigint"),
    ("queue", "string"),
    ("item_key", "string"),
    ("group_key", "string"),
    ("schedule_on", "timestamp"),
    ("enqueued_on", "timestamp"),
    ("enqueued_by", "string"),
    ("dequeued_on", "timestamp"),
    ("dequeued_by", "string"),
    ("outcome", "string"),
    ("redeliver_count", "int"),
    ("max_attempts", "int"),
)
_TIMELINE_COLUMNS = (
    ("id", "bigint"),
    ("queue", "string"),
    ("item_key", "string"),
    ("event_id", "bigint"),
    ("at", "timestamp"),
    ("action", "string"),
    ("actor", "string"),
    ("schedule_on", "timestamp"),
    ("details", "string"),
)

EVENTS = Relation("source_events", "id", _EVENT_COLUMNS)
TIMELINE = Relation("source_timeline", "id", _TIMELINE_COLUMNS)
ARCHIVE_EVENTS = Relation(
    "source_archive_events",
    "id",
    (
        ("id", "bigint"),
        ("queue", "string"),
        ("item_key", "string"),
        ("group_key", "string"),
        ("schedule_on", "timestamp"),
        ("data", "string"),
        ("enqueued_on", "timestamp"),
        ("enqueued_by", "string"),
        ("dequeued_on", "timestamp"),
        ("dequeued_by", "string"),
        ("outcome", "string"),
        ("claimed_on", "timestamp"),
        ("claimed_by", "string"),
        ("lease_id", "string"),
        ("lease_expires_on", "timestamp"),
        ("redeliver_count", "int"),
        ("max_attempts", "int"),
        ("last_error", "string"),
        ("version", "int"),
        ("run_id", "bigint"),
        ("date", "string"),
    ),
)
ARCHIVE_TIMELINE = Relation(
    "source_archive_timeline",
    "event_id",
    (
        ("event_id", "bigint"),
        ("id", "bigint"),
        ("queue", "string"),
        ("item_key", "string"),
        ("at", "timestamp"),
        ("action", "string"),
        ("actor", "string"),
        ("schedule_on", "timestamp"),
        ("details", "string"),
        ("run_id", "bigint"),
        ("date", "string"),
    ),
)


def choose(mode: str, url: str, jar: Path | None) -> str:
    """'jdbc' or 'snapshot' for `mode` auto|jdbc|snapshot; jdbc needs TCP and the driver jar."""
    if mode not in SOURCES:
        raise PipelineError(f"--source must be one of {', '.join(SOURCES)}")
    if mode == "snapshot":
        return mode
    tcp = db.endpoint(url).is_tcp
    if mode == "jdbc":
        if not tcp:
            raise PipelineError("--source jdbc needs PostgreSQL on TCP (this database is on a unix socket)")
        if jar is None:
            raise PipelineError(
                "--source jdbc needs the PostgreSQL JDBC driver: apt-get install libpostgresql-jdbc-java, "
                "or give --jdbc-jar / TICKLER_JDBC_JAR"
            )
        return mode
    return "jdbc" if tcp and jar is not None else "snapshot"


class Source:
    """Relations of one database snapshot as DataFrames. Use as a context manager."""

    def __init__(
        self,
        spark: Any,
        url: str,
        *,
        mode: str = "auto",
        jar: str | Path | None = None,
        partitions: int | None = None,
        staging_dir: str | None = None,
    ) -> None:
        self.spark = spark
        self.url = url
        self.jar = jdbc_jar(str(jar)) if jar else jdbc_jar(None)
        self.kind = choose(mode, url, self.jar)
        self.partitions = partitions or max(2, 2 * spark.sparkContext.defaultParallelism)
        master = spark.sparkContext.master
        if self.kind == "snapshot" and staging_dir is None and not is_local(master):
            raise PipelineError(
                f"the snapshot source writes files every executor must read: give --staging-dir "
                f"(a shared directory) on {master}, or use JDBC"
            )
        self._staging_root = staging_dir
        self._staging: Path | None = None
        self._conn: psycopg.Connection[Any] | None = None
        self._snapshot_id: str | None = None
        self._exports = 0

    # -- the coordinating transaction -----------------------------------------------------------

    def __enter__(self) -> Source:
        self._conn = db.connect(self.url)
        # Spark's JDBC reads must reach the very server that exported the snapshot: of a list of
        # hosts (replicas, or a primary and its standbys), the one this connection reached.
        self.url = db.pinned(self.url, self._conn)
        self._conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        if self.kind == "jdbc":
            row = self._conn.execute("SELECT pg_export_snapshot()").fetchone()
            assert row is not None
            # it goes into the JDBC session's init statement, which takes no parameters
            if not re.fullmatch(r"[0-9A-F]+(-[0-9A-F]+)+", str(row[0])):
                raise RuntimeError(f"unexpected snapshot id {row[0]!r}")
            self._snapshot_id = str(row[0])
        else:
            self._conn.execute("SELECT 1")  # takes the snapshot now
            if self._staging_root:
                Path(self._staging_root).mkdir(parents=True, exist_ok=True)
            self._staging = Path(tempfile.mkdtemp(prefix="tickler-snapshot-", dir=self._staging_root))
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._conn is not None:
            self._conn.rollback()
            self._conn.close()
            self._conn = None
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None

    @property
    def conn(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            raise RuntimeError("Source is used outside its `with` block")
        return self._conn

    def rows(self, name: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """Run a named query in the snapshot (db.rows), its rows as tuples."""
        return db.rows(self.conn, name, params, tuples=True)

    # -- relations --------------------------------------------------------------------------------

    def read(
        self, relation: Relation, bounds: tuple[int | None, int | None], equals: dict[str, int] | None = None
    ) -> Any:
        """The relation's rows (with the `equals` column filters) whose partition column lies in `bounds`."""
        equals = equals or {}
        if self.kind == "jdbc":
            frame = self._read_jdbc(relation, bounds)
            for column, value in equals.items():
                frame = frame.where(frame[column] == value)  # pushed down to PostgreSQL by Spark
        else:
            frame = self._read_snapshot(relation, bounds, equals)
        return frame.selectExpr(*[f"CAST(`{name}` AS {kind}) AS `{name}`" for name, kind in relation.columns])

    def _read_jdbc(self, relation: Relation, bounds: tuple[int | None, int | None]) -> Any:
        where = db.endpoint(self.url)
        lo, hi = bounds
        reader = (
            self.spark.read.format("jdbc")
            .option("url", where.jdbc_url())
            .option("driver", "org.postgresql.Driver")
            .option("user", where.user)
            .option("password", where.password)
            .option("dbtable", f"({db.q(relation.query)}) AS src")
            .option("fetchsize", "10000")
            .option(
                "sessionInitStatement",
                # every partition reads the coordinator's snapshot (pgjdbc keeps the open transaction)
                f"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '{self._snapshot_id}'",
            )
        )
        if lo is not None and hi is not None:
            reader = (
                reader.option("partitionColumn", relation.partition_column)
                .option("lowerBound", str(lo))
                .option("upperBound", str(hi + 1))
                .option("numPartitions", str(max(1, min(self.partitions, hi - lo + 1))))
            )
        return reader.load()

    def _read_snapshot(self, relation: Relation, bounds: tuple[int | None, int | None], equals: dict[str, int]) -> Any:
        assert self._staging is not None
        self._exports += 1
        directory = self._staging / f"{self._exports:03d}-{relation.query}"
        directory.mkdir()
        lo, hi = bounds
        if lo is not None and hi is not None:
            count = max(1, min(self.partitions, hi - lo + 1))
            step = (hi - lo + count) // count
            conditions = [
                sql.SQL("{} >= %s AND {} < %s").format(
                    sql.Identifier(relation.partition_column), sql.Identifier(relation.partition_column)
                )
            ]
            conditions += [sql.SQL("{} = %s").format(sql.Identifier(column)) for column in equals]
            statement = sql.SQL("COPY (SELECT * FROM ({}) AS src WHERE {}) TO STDOUT (FORMAT csv)").format(
                sql.SQL(db.q(relation.query)),
                sql.SQL(" AND ").join(conditions),  # type: ignore[arg-type]
            )
            for part in range(count):
                start = lo + part * step
                params = [start, min(start + step, hi + 1), *equals.values()]
                with (
                    (directory / f"part-{part:05d}.csv").open("wb") as out,
                    self.conn.cursor().copy(statement, params) as copy,
                ):
                    for block in copy:
                        out.write(block)
        names = [name for name, _ in relation.columns]
        schema = ", ".join(f"`{name}` string" for name in names)
        return (
            self.spark.read.schema(schema)
            .option("multiLine", "true")
            .option("escape", '"')
            .option("mode", "FAILFAST")
            .csv(str(directory))
        )
