"""The Spark session, and the checks that turn a missing Java or JDBC driver into a one-line error."""

from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tickler.pipeline import ship

# Where Debian's libpostgresql-jdbc-java puts the driver.
DEFAULT_JDBC_JAR = Path("/usr/share/java/postgresql.jar")
MIN_JAVA = 17

# Spark's own logging says a lot at WARN that a user of `tickler pipeline` cannot act on.
_LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


class PipelineError(Exception):
    """A problem the user can fix: the CLI prints it on one line and exits with status 2."""


def java_executable() -> str:
    """The `java` Spark will start (JAVA_HOME first, as spark-submit does), checked to be 17 or newer."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        raise PipelineError(
            f"Java {MIN_JAVA}+ is needed to run Spark and was not found "
            "(install a JDK, e.g. `apt-get install openjdk-17-jre-headless`, or set JAVA_HOME)"
        )
    try:
        result = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30, check=False)
    except OSError as error:
        raise PipelineError(f"cannot run {java}: {error}") from None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', result.stderr + result.stdout)
    if not match:
        raise PipelineError(f"cannot tell the version of {java}; Spark needs Java {MIN_JAVA}+")
    major = int(match[1]) if match[1] != "1" else int(match[2] or 0)
    if major < MIN_JAVA:
        raise PipelineError(f"{java} is Java {major}; Spark 4 needs Java {MIN_JAVA}+ (set JAVA_HOME)")
    return java


def jdbc_jar(explicit: str | None = None) -> Path | None:
    """The PostgreSQL JDBC driver jar: `explicit`, else TICKLER_JDBC_JAR, else Debian's; None if absent."""
    wanted = explicit or os.environ.get("TICKLER_JDBC_JAR")
    if wanted:
        path = Path(wanted).expanduser()
        if not path.is_file():
            raise PipelineError(f"the JDBC driver jar {path} does not exist")
        return path.resolve()
    return DEFAULT_JDBC_JAR if DEFAULT_JDBC_JAR.is_file() else None


def one_line(error: BaseException) -> str:
    """The line of a (Spark, Python worker or Java) error that says what went wrong."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    causes = [line for line in lines if re.match(r"^[\w.$]+(Error|Exception)\b.*:", line)]
    if causes:
        return causes[-1]
    return lines[0] if lines else type(error).__name__


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[")


def _log_config() -> str:
    path = Path(tempfile.gettempdir()) / "tickler-pipeline-log4j2.properties"
    if not path.exists() or path.read_text() != _LOG4J:
        path.write_text(_LOG4J)
    return str(path)


def create_session(
    master: str = "local[*]",
    *,
    jar: Path | None = None,
    driver_memory: str | None = None,
    conf: Mapping[str, str] | None = None,
    app_name: str = "tickler-pipeline",
) -> Any:
    """A SparkSession on `master`, in UTC, with the JDBC driver on its class path when given."""
    java_executable()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    settings: dict[str, str] = {
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": f"-Duser.timezone=UTC -Dlog4j.configurationFile={_log_config()}",
        "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
        # partition values are strings (a queue named "2024" stays a string)
        "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
        # Parquet's own UTC timestamp type, which every reader knows (Spark's default, INT96, is
        # deprecated and read as local time by some)
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    }
    conf = dict(conf or {})
    # PySpark takes the workers' Python from PYSPARK_PYTHON when the context starts, not from
    # spark.pyspark.python (only spark-submit turns that setting into the variable): do it here.
    if conf.get("spark.pyspark.python"):
        os.environ["PYSPARK_PYTHON"] = conf["spark.pyspark.python"]
    shipped: Path | None = None
    if is_local(master):
        # Workers run this interpreter, which has tickler and psycopg; a bare `python3` may not.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        settings["spark.pyspark.python"] = os.environ["PYSPARK_PYTHON"]
        settings["spark.ui.enabled"] = "false"
        settings["spark.sql.shuffle.partitions"] = str(max(4, 2 * (os.cpu_count() or 1)))
        settings["spark.driver.memory"] = driver_memory or "2g"
    else:
        if driver_memory:
            settings["spark.driver.memory"] = driver_memory
        # executors have Python and pyspark only: the job brings its code and its modules
        code, deps = ship.build(Path(tempfile.mkdtemp(prefix="tickler-ship-")))
        shipped = code
        atexit.register(shutil.rmtree, code.parent, True)
        conf.update(ship.executor_settings(deps, conf))
    if jar is not None:
        settings["spark.jars"] = str(jar)
    settings.update(conf)
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        session = builder.getOrCreate()
    except Exception as error:  # the JVM did not start: say why in one line, not a stack trace
        raise PipelineError(f"Spark did not start on {master}: {one_line(error)}") from None
    session.sparkContext.setLogLevel("ERROR")
    # py4j says INFO lines as connections close, some from __del__ at the interpreter's exit, to
    # whatever handler the root logger has by then (one writing to a closed stream logs a "Logging
    # error" traceback). Its warnings and errors still pass.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    if shipped is not None:
        session.sparkContext.addPyFile(str(shipped))
    return session


def stop_session(session: Any) -> None:
    """Stop Spark and the Python side of its bridge now, rather than at the interpreter's exit."""
    session.stop()


# Causes Spark logs but does not put in the exception it raises ("An error occurred while calling
# None.org.apache.spark.api.java.JavaSparkContext"): the line of the log that names them.
_LOGGED_CAUSES = ("All masters are unresponsive",)


def log_cause(log: Path) -> str | None:
    """The cause of a failure, as the tail of the JVM's log names it; None if it names none."""
    try:
        with log.open("rb") as f:
            f.seek(max(0, log.stat().st_size - 256 * 1024))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    for cause in _LOGGED_CAUSES:
        if cause in tail:
            line = next(line for line in reversed(tail.splitlines()) if cause in line)
            return line[line.index(cause) :].strip()
    return None


def check_master(master: str, timeout: float = 10.0) -> None:
    """For a standalone master (spark://host:port[,host:port...]): one of them accepts a connection.

    Spark itself tries three times, 20 s apart, then fails with a message that does not say why."""
    if not master.startswith("spark://"):
        return
    problems = []
    for address in master[len("spark://") :].split(","):
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host or address, int(port or 7077)), timeout=timeout).close()
            return
        except (OSError, ValueError) as error:
            problems.append(f"{address}: {error.strerror if isinstance(error, OSError) and error.strerror else error}")
    raise PipelineError(f"All masters are unresponsive: cannot connect to the Spark master {master} "
                        f"({'; '.join(problems)})")  # fmt: skip
