"""Log lines: structlog for tickler's own, and stdlib loggers (waitress, gunicorn, apscheduler)
rendered the same way. Two formats: `console` for people (the default on a terminal) and `json`
for machines (one object per line; the default otherwise). TICKLER_LOG_FORMAT picks one."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

_SHARED_PROCESSORS: list[structlog.types.Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


def resolve_format(log_format: str, stream: TextIO) -> str:
    """`console` or `json`: the one asked for, else console on a terminal and JSON elsewhere."""
    if log_format:
        return log_format
    isatty = getattr(stream, "isatty", None)
    return "console" if isatty is not None and isatty() else "json"


def log_handler(log_format: str = "", stream: TextIO | None = None) -> logging.Handler:
    """A handler that writes records, tickler's and other libraries', in the chosen format."""
    stream = stream or sys.stderr
    renderer: list[structlog.types.Processor]
    if resolve_format(log_format, stream) == "console":
        # ConsoleRenderer lays out exceptions itself (format_exc_info would make it warn).
        renderer = [structlog.dev.ConsoleRenderer(colors=bool(stream.isatty()))]
    else:
        renderer = [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_SHARED_PROCESSORS,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *renderer],
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    return handler


def route_structlog_to_stdlib(*, cache: bool = True) -> None:
    """tickler's structlog lines go through stdlib logging, whose root handler renders them.
    `cache`: each module's logger is assembled once, on its first use (the tests, which swap
    the configuration, turn it off)."""
    structlog.configure(
        processors=[
            # A line below the level is dropped before it is stamped and merged, not after (the
            # access line of every request at TICKLER_LOG_LEVEL=WARNING: ~4 % of a schedule's CPU).
            structlog.stdlib.filter_by_level,
            *_SHARED_PROCESSORS,
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=cache,
    )


def configure_logging(level: str = "INFO", log_format: str = "") -> None:
    route_structlog_to_stdlib()
    root = logging.getLogger()
    root.handlers[:] = [log_handler(log_format)]
    root.setLevel(level)
    # Requests are logged once, by tickler, with their request id; the servers' own access
    # lines would only repeat them.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)
    logging.getLogger("pgserver").setLevel(logging.WARNING)  # it narrates every start-up at INFO
    # APScheduler logs every run of the poll job ("Running job", "executed successfully"): several
    # lines a second that drown tickler's own. Its warnings (a missed run) still show.
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
