"""`--timeout`: a job that runs too long is stopped, and says so, rather than hanging a cron slot.

When the time is up, the running Spark jobs are cancelled (the job then fails as any failed job
does, exit status 1). Work that Spark cannot cancel (a driver waiting on PostgreSQL, a context
that does not answer) gets `GRACE` seconds more; then the process says why and exits at once.
Nothing is lost either way: every job is safe to kill and resumes or redoes its work on a rerun,
and its database sessions end with the process (pipeline/db.py).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

GRACE = 30.0


class Deadline:
    """Calls `cancel()` after `seconds`, and `give_up()` `grace` seconds later unless stopped."""

    def __init__(self, seconds: float, *, cancel: Callable[[], Any], give_up: Callable[[], Any],
                 grace: float = GRACE) -> None:  # fmt: skip
        self.seconds = seconds
        self.expired = threading.Event()
        self._stopped = threading.Event()
        self._cancel, self._give_up, self._grace = cancel, give_up, grace
        self._thread = threading.Thread(target=self._run, name="tickler-deadline", daemon=True)

    def __enter__(self) -> Deadline:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()

    def _run(self) -> None:
        if self._stopped.wait(self.seconds):
            return
        self.expired.set()
        with contextlib.suppress(Exception):  # a context already stopping: the grace period decides
            self._cancel()
        if not self._stopped.wait(self._grace):
            self._give_up()
