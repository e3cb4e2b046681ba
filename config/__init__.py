"""Settings: every environment variable tickler reads, with its default, in one place."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path


def _env(name: str, default: str) -> str:
    value = os.environ.get(name)
    return default if value is None or value == "" else value


def _env_float(name: str, default: float) -> float:
    raw = _env(name, str(default))
    try:
        return float(raw)
    except ValueError:
        raise SystemExit(f"{name} must be a number, not {raw!r}") from None


def _env_int(name: str, default: int) -> int:
    raw = _env(name, str(default))
    try:
        return int(raw)
    except ValueError:
        raise SystemExit(f"{name} must be a whole number, not {raw!r}") from None


def _env_bool(name: str, default: bool) -> bool:
    raw = _env(name, "true" if default else "false").strip().lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise SystemExit(f"{name} must be true or false, not {raw!r}")


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
    # When set, /metrics needs `Authorization: Bearer <metrics_token>`.
    metrics_token: str = ""
    # Log level of the JSON logs (DEBUG, INFO, WARNING, ...).
    log_level: str = "INFO"
    # Connections per process in the database pool.
    pool_size: int = 10
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
    # Apply pending migrations when the service starts.
    migrate_on_start: bool = True

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            database_url=_env("TICKLER_DATABASE_URL", ""),
            data_dir=Path(_env("TICKLER_DATA_DIR", ".tickler")),
            max_event_data_bytes=_env_int("TICKLER_MAX_EVENT_DATA_BYTES", 256 * 1024),
            max_body_bytes=_env_int("TICKLER_MAX_BODY_BYTES", 32 * 1024 * 1024),
            max_batch_events=_env_int("TICKLER_MAX_BATCH_EVENTS", 10_000),
            max_page_size=_env_int("TICKLER_MAX_PAGE_SIZE", 1_000),
            metrics_token=_env("TICKLER_METRICS_TOKEN", ""),
            log_level=_env("TICKLER_LOG_LEVEL", "INFO").upper(),
            pool_size=_env_int("TICKLER_POOL_SIZE", 10),
            cache_seconds=_env_float("TICKLER_CACHE_SECONDS", 5.0),
            default_lease_seconds=_env_float("TICKLER_DEFAULT_LEASE_SECONDS", 30.0),
            default_max_attempts=_env_int("TICKLER_DEFAULT_MAX_ATTEMPTS", 10),
            default_backoff_initial_seconds=_env_float("TICKLER_DEFAULT_BACKOFF_INITIAL_SECONDS", 1.0),
            default_backoff_max_seconds=_env_float("TICKLER_DEFAULT_BACKOFF_MAX_SECONDS", 3600.0),
            default_backoff_multiplier=_env_float("TICKLER_DEFAULT_BACKOFF_MULTIPLIER", 2.0),
            default_webhook_timeout_seconds=_env_float("TICKLER_DEFAULT_WEBHOOK_TIMEOUT_SECONDS", 10.0),
            migrate_on_start=_env_bool("TICKLER_MIGRATE_ON_START", True),
        )

    def with_overrides(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]
