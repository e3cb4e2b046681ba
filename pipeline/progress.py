"""Progress of the running Spark jobs, from Spark's status tracker, on stderr.

On a terminal: one line redrawn in place (a bar of the active stages' tasks, elapsed time, rate).
Otherwise (a log, an orchestrator): a plain line when something changed, at most every 10 s.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

BAR = 30


def _snapshot(context: Any) -> tuple[int, int, int] | None:
    """(stages running, tasks done, tasks in all) of the active stages; None when none runs."""
    tracker = context.statusTracker()
    stages = [tracker.getStageInfo(stage) for stage in tracker.getActiveStageIds()]
    stages = [s for s in stages if s is not None]
    if not stages:
        return None
    return len(stages), sum(s.numCompletedTasks for s in stages), sum(s.numTasks for s in stages)


def _line(found: tuple[int, int, int], elapsed: float, done_total: int, tty: bool) -> str:
    stages, done, total = found
    minutes, seconds = divmod(int(elapsed), 60)
    rate = done_total / elapsed if elapsed > 0 else 0.0
    plural = "s" if stages > 1 else ""
    text = f"{stages} stage{plural}: {done}/{total} tasks, {minutes:02d}:{seconds:02d}, {rate:.1f} tasks/s"
    if not tty:
        return text
    filled = BAR * done // max(total, 1)
    return f"[{'#' * filled}{'.' * (BAR - filled)}] {text}"


@contextmanager
def reporting(context: Any, *, out: TextIO | None = None, every: float | None = None) -> Iterator[None]:
    """Report progress on `out` (stderr) while the block runs."""
    out = out or sys.stderr
    tty = out.isatty()
    every = every if every is not None else (0.5 if tty else 10.0)
    stop = threading.Event()
    started = time.monotonic()
    seen: dict[str, Any] = {"last": None, "done": 0, "previous": 0}

    def run() -> None:
        while not stop.wait(every):
            try:
                found = _snapshot(context)
            except Exception:  # the context is stopping: nothing more to say
                return
            if found is None or found == seen["last"]:
                continue
            seen["done"] += max(0, found[1] - seen["previous"])
            seen["previous"], seen["last"] = found[1], found
            text = _line(found, time.monotonic() - started, seen["done"], tty)
            out.write(f"\r{text}\x1b[K" if tty else f"{text}\n")
            out.flush()

    thread = threading.Thread(target=run, name="tickler-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
        if tty and seen["last"] is not None:
            out.write("\r\x1b[K")
            out.flush()


@contextmanager
def jvm_output_to(log: Path) -> Iterator[None]:
    """While the block runs, file descriptor 2 goes to `log`: a JVM started here keeps it as its
    stderr, so its start-up lines (and Spark's own logging) go there, not to the console."""
    sys.stderr.flush()
    saved = os.dup(2)
    target = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(target, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(target)
