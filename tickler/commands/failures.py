"""The mistakes people make starting tickler, said in one line each (cli.py prints it, exit 2).

A database that cannot be reached, a password or role it refuses, a URL that is not
PostgreSQL's: each becomes one sentence that names the database tried (never its password) and
what to check, instead of a page of traceback ending in psycopg.OperationalError.
"""

from __future__ import annotations

import getpass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from tickler.config import Settings


class Refused(Exception):
    """A start-up mistake, said in one line; `tickler` prints it and exits with exit_code."""

    def __init__(self, message: str, *, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def describe_database(settings: Settings) -> str:
    """Which database the settings lead to, for people: the server and database of the URL
    (user, host, port and name; never the password), or the embedded one's data directory."""
    if not settings.database_url:
        return f"embedded PostgreSQL in {Path(settings.data_dir).expanduser().resolve()}"
    return describe_url(settings.database_url)


def describe_url(url: str) -> str:
    """host:port/database as user, as libpq will read the URL (a missing user is the OS user, a
    missing database the user's name), without the password."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    host = parts.hostname or parse_qs(parts.query).get("host", ["localhost"])[0]
    user = parts.username or getpass.getuser()
    database = parts.path.lstrip("/") or user
    return f"{host}:{port or 5432}/{database} as {user}"


def explain(error: BaseException, settings: Settings) -> str | None:
    """One line for an error people cause by their settings or surroundings; None for a bug
    (which keeps its traceback)."""
    original = getattr(error, "orig", None) or error  # SQLAlchemy wraps psycopg's errors
    module = type(original).__module__
    # By the classes' names (importing psycopg here would slow every command's start); a subclass
    # counts too (ConnectionTimeout is an OperationalError).
    names = {cls.__name__ for cls in type(original).__mro__ if cls.__module__.startswith("psycopg")}
    if names & {"OperationalError", "InterfaceError"}:
        return _unreachable(str(original), settings)
    if module.startswith("psycopg") and getattr(original, "sqlstate", None) == "42501":  # insufficient_privilege
        first = str(original).splitlines()[0]
        return f"the database {describe_database(settings)} refused: {first} (see docs/deploy.md for the privileges)"
    return None


def _unreachable(message: str, settings: Settings) -> str:
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    # psycopg says "connection failed: connection to server at ... failed: <reason>"; the reason
    # is what a person acts on.
    reason = lines[0].rsplit(" failed: ", 1)[-1] if lines else "no answer"
    reason = reason.removeprefix("FATAL:").strip()
    where = describe_database(settings)
    if "password authentication failed" in reason or "no password supplied" in reason:
        hint = "check the user and password in TICKLER_DATABASE_URL"
    elif "does not exist" in reason and "role" in reason:
        hint = "create the role, or use one that exists, in TICKLER_DATABASE_URL"
    elif "does not exist" in reason and "database" in reason:
        hint = "create the database (createdb) or name an existing one in TICKLER_DATABASE_URL"
    elif "timeout expired" in reason:
        reason = f"no answer within {settings.connect_timeout} s"
        hint = "is it PostgreSQL listening at that host and port? (TICKLER_CONNECT_TIMEOUT sets the wait)"
    elif "resolve host" in reason or "Name or service not known" in reason:
        hint = "check the host name in TICKLER_DATABASE_URL"
    else:
        hint = "is PostgreSQL running there, and is TICKLER_DATABASE_URL right?"
    return f"cannot reach the database {where}: {reason}; {hint}"
