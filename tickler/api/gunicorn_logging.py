"""gunicorn's own lines (start-up, workers, errors, access) in tickler's log format.

`gunicorn --logger-class tickler.api.gunicorn_logging.Logger tickler.wsgi:app`: the master's and
the workers' lines then come out like tickler's (TICKLER_LOG_FORMAT, JSON when not on a
terminal), so that one log pipeline reads the whole process tree.
"""

from __future__ import annotations

from typing import Any

from gunicorn import glogging

from tickler.config import Settings
from tickler.scheduler.logs import configure_logging


class Logger(glogging.Logger):  # type: ignore[misc]
    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        settings = Settings.from_env()
        configure_logging(settings.log_level, settings.log_format)
        # gunicorn gives its loggers handlers of their own and stops them at themselves; hand
        # their records to the root logger, which writes tickler's format.
        for logger in (self.error_log, self.access_log):
            logger.handlers[:] = []
            logger.propagate = True
