"""JSON logs: structlog for tickler's own lines, and stdlib loggers (werkzeug, waitress,
gunicorn, apscheduler) rendered the same way, one JSON object per line."""

from __future__ import annotations

import logging
import sys

import structlog

_SHARED_PROCESSORS: list[structlog.types.Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


def configure_logging(level: str = "INFO") -> None:
    structlog.configure(
        processors=[
            *_SHARED_PROCESSORS,
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_SHARED_PROCESSORS,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Requests are logged once, by tickler, with their request id; the servers' own access
    # lines would only repeat them.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)
    logging.getLogger("pgserver").setLevel(logging.WARNING)  # it narrates every start-up at INFO
    # APScheduler logs every run of the poll job ("Running job", "executed successfully"): several
    # lines a second that drown tickler's own. Its warnings (a missed run) still show.
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
