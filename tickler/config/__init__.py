"""Settings: every environment variable tickler reads, with its default, in one place."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

_T = TypeVar("_T")

# The levels and formats TICKLER_LOG_LEVEL and TICKLER_LOG_FORMAT take.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMATS = ("console", "json")
# The URL schemes of a PostgreSQL database (tickler speaks to it with psycopg 3).
POSTGRESQL_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg")


class SettingsError(SystemExit):
    """A setting that cannot be used; its message names the variable and what it must be.
    A SystemExit, so that a process built on the settings (gunicorn's worker) stops with the
    message instead of a traceback; `tickler` prints it as one line and exits with 2."""


# How an environment variable is read into a field of each type, and what it must be otherwise.
_BOOLEANS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
_READERS: dict[str, tuple[Callable[[str], object], str]] = {
    "str": (str, "text"),
    "Path": (Path, "a path"),
    "int": (int, "a whole number"),
    "float": (float, "a number"),
    "bool": (lambda raw: _BOOLEANS[raw.strip().lower()], "true or false"),
}


def _from_env(cls: type[_T], prefix: str, environ: Mapping[str, str], **given: object) -> _T:
    """`cls` with each field read from PREFIX + FIELD_NAME where that is set and not empty, and
    its default otherwise: the defaults are written once, in the dataclass."""
    values = dict(given)
    for field_ in fields(cls):  # type: ignore[arg-type]
        name = prefix + field_.name.upper()
        raw = environ.get(name, "")
        if field_.name in values or raw == "":
            continue
        read, kind = _READERS[str(field_.type)]
        try:
            values[field_.name] = read(raw)
        except (KeyError, ValueError):
            raise SettingsError(f"{name} must be {kind}, not {raw!r}") from None
    return cls(**values)


def _knob(default: _T, meaning: str) -> _T:
    """A tuning knob's default and what it means (`tickler worker -h` shows it)."""
    return field(default=default, metadata={"meaning": meaning})  # type: ignore[no-any-return]


@dataclass(frozen=True)
class WorkerSettings:
    """The dispatcher's tuning knobs (TICKLER_WORKER_BATCH_SIZE, ...): what `tickler worker`,
    `tickler serve` and an embedded Worker use unless told otherwise."""

    batch_size: int = _knob(100, "leases asked for per claim (per queue)")
    concurrency: int = _knob(96, "delivery threads of this process (they mostly wait on I/O)")
    queue_concurrency: int = _knob(
        64,
        "leases of one queue claimed and not yet delivered; keep it below the concurrency so that one slow "
        "receiver cannot take every thread",
    )
    poll_interval: float = _knob(5.0, "safety poll: look for due events at least this often (seconds)")
    reap_interval: float = _knob(1.0, "how often to end expired leases (seconds)")
    refresh_interval: float = _knob(5.0, "how often to re-read which queues to serve and their settings (seconds)")
    shutdown_grace: float = _knob(10.0, "on stop, how long deliveries in progress may take to finish (seconds)")
    # After a claim that came back small, wait at least this long before the next one, so that
    # events falling due a fraction of a millisecond apart are claimed (and acked) together
    # instead of each costing its own commits: at most this much lateness, for throughput.
    coalesce_seconds: float = _knob(0.005, "after a small claim, wait this long before the next (seconds)")


@dataclass(frozen=True)
class Settings:
    """tickler's settings. `Settings.from_env()` reads them; tests build them directly."""

    # PostgreSQL URL. Empty: an embedded PostgreSQL under `data_dir`.
    database_url: str = ""
    # Where the embedded PostgreSQL keeps its data.
    data_dir: Path = field(default_factory=lambda: Path(".tickler"))
    # Largest `data` of one event, in bytes of its JSON text (larger: 413).
    max_event_data_bytes: int = 256 * 1024
    # Largest request body, in bytes (larger: 413).
    max_body_bytes: int = 32 * 1024 * 1024
    # Largest batch of events in one request.
    max_batch_events: int = 10_000
    # Largest page of a search.
    max_page_size: int = 1_000
    # Longest long poll of a claim (`wait_seconds`); lower it behind a proxy with a shorter timeout.
    max_wait_seconds: float = 20.0
    # When set, /metrics needs `Authorization: Bearer <metrics_token>`.
    metrics_token: str = ""
    # Log level (DEBUG, INFO, WARNING, ERROR, CRITICAL).
    log_level: str = "INFO"
    # How log lines look: "console" (for people) or "json" (one object per line, for machines).
    # Empty: console when standard error is a terminal, JSON otherwise.
    log_format: str = ""
    # Connections per process in the database pool.
    pool_size: int = 10
    # Seconds a new database connection may take to be accepted and answered (libpq's
    # connect_timeout, on every connection tickler opens; 0: wait for ever). A server that accepts
    # TCP and never answers would otherwise hang a command, or a start, with nothing said.
    connect_timeout: int = 10
    # Group commit of single-event schedules: concurrent requests of one API process that arrive
    # within this many milliseconds share one statement and one commit (0: off). A request alone
    # in its process never waits.
    group_commit_ms: float = 2.0
    # Seconds a token's principal and a queue's settings are remembered in each API process
    # (0: read them on every request). A revoked token or a changed queue takes effect after it.
    cache_seconds: float = 5.0
    # Defaults of a new queue.
    default_lease_seconds: float = 30.0
    default_max_attempts: int = 10
    default_backoff_initial_seconds: float = 1.0
    default_backoff_max_seconds: float = 3600.0
    default_backoff_multiplier: float = 2.0
    default_webhook_timeout_seconds: float = 10.0
    # max_in_flight of a new webhook queue (when not given): leases live at once, cluster-wide.
    default_webhook_max_in_flight: int = 100
    # Apply pending migrations when the service starts.
    migrate_on_start: bool = True
    # Key that signs the dashboard's session cookies. Empty: a key generated once and kept in the
    # database (table tickler_ui_secret), shared by every process of the deployment.
    secret_key: str = ""
    # Send the dashboard's session cookie only over HTTPS (set it when tickler is behind TLS).
    secure_cookies: bool = False
    # Who writes API responses: "auto" (orjson when it is installed, else the json module) or
    # "stdlib" (the json module always). The same JSON text either way (api/jsonio.py).
    json: str = "auto"

    # The dispatcher's tuning knobs (TICKLER_WORKER_*).
    worker: WorkerSettings = field(default_factory=WorkerSettings)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Settings:
        """Each setting from TICKLER_ + its name in capitals (TICKLER_POOL_SIZE, ...), the worker's
        from TICKLER_WORKER_ + the knob's name (TICKLER_WORKER_BATCH_SIZE, ...)."""
        settings = _from_env(cls, "TICKLER_", environ, worker=_from_env(WorkerSettings, "TICKLER_WORKER_", environ))
        level, log_format = settings.log_level.strip().upper(), settings.log_format.strip().lower()
        if level not in LOG_LEVELS:
            raise SettingsError(f"TICKLER_LOG_LEVEL must be one of {', '.join(LOG_LEVELS)}, not {settings.log_level!r}")
        if log_format and log_format not in LOG_FORMATS:
            raise SettingsError(f"TICKLER_LOG_FORMAT must be console or json, not {settings.log_format!r}")
        if settings.connect_timeout < 0:
            raise SettingsError(f"TICKLER_CONNECT_TIMEOUT must be 0 or more seconds, not {settings.connect_timeout!r}")
        if not 0 <= settings.group_commit_ms <= 1000:
            raise SettingsError(f"TICKLER_GROUP_COMMIT_MS must be from 0 to 1000, not {settings.group_commit_ms!r}")
        scheme = urlsplit(settings.database_url).scheme.lower()
        if settings.database_url and scheme not in POSTGRESQL_SCHEMES:
            # The scheme only: the rest of a URL may hold a password.
            raise SettingsError(
                f"TICKLER_DATABASE_URL must be a PostgreSQL URL (postgresql://user:password@host:port/database), "
                f"not a {scheme or 'schemeless'}:// one"
            )
        return settings.with_overrides(log_level=level, log_format=log_format)

    def with_overrides(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]
