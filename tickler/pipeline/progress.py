"""Progress of a job on stderr: Spark's status tracker, and the job's own units when it has some.

On a terminal: one line redrawn in place. Otherwise (a log, an orchestrator): a plain line when
something changed, at most every 10 s, and at least every 30 s whatever happens (a heartbeat),
so that a cron log tells a hung job from a slow one. A line says what runs:
  1 stage: 12/40 tasks (30%), ETA 01:10, 00:35 elapsed, 0.3 tasks/s
  12,000/50,000 rows checked (24%), 11,800 written, ETA 00:40, 00:35 elapsed
  waiting for executors: 1 stage, 0/4 tasks, no executor registered, 01:30 elapsed
  no Spark stage running (work on the driver or in PostgreSQL), 00:35 elapsed
The percentage of Spark's tasks counts every stage of the running jobs that Spark has planned;
a job's own units (`track`: the import's rows) are the whole job's.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

BAR = 30
HEARTBEAT = 30.0


@dataclass(frozen=True)
class Snapshot:
    stages: int  # stages running
    done: int  # tasks done, of the running jobs' planned stages
    total: int
    executors: int  # executors registered (the driver not counted), -1 in local mode


@dataclass
class _Tracked:
    label: str
    total: int
    done: Callable[[], tuple[int, str]]
    started: float


_tracked: list[_Tracked] = []


@contextmanager
def track(label: str, total: int, done: Callable[[], tuple[int, str]]) -> Iterator[None]:
    """While the block runs, progress is `done()[0]` of `total` `label` (`done()[1]`: a note)."""
    entry = _Tracked(label, total, done, time.monotonic())
    _tracked.append(entry)
    try:
        yield
    finally:
        _tracked.remove(entry)


def _snapshot(context: Any) -> Snapshot | None:
    """The running jobs' tasks, and who could run them; None when no stage runs."""
    tracker = context.statusTracker()
    active = [tracker.getStageInfo(stage) for stage in tracker.getActiveStageIds()]
    active = [s for s in active if s is not None]
    if not active:
        return None
    stage_ids: set[int] = {s.stageId for s in active}
    for job in tracker.getActiveJobsIds():
        info = tracker.getJobInfo(job)
        if info is not None:
            stage_ids.update(info.stageIds)
    planned = [s for s in (tracker.getStageInfo(i) for i in stage_ids) if s is not None]
    local = str(context.master).startswith("local")
    executors = -1 if local else max(0, len(tracker.getExecutorInfos()) - 1)
    return Snapshot(len(active), sum(s.numCompletedTasks for s in planned), sum(s.numTasks for s in planned), executors)


def _clock(seconds: float) -> str:
    minutes, rest = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{rest:02d}" if hours else f"{minutes:02d}:{rest:02d}"


def _eta(done: int, total: int, elapsed: float) -> str:
    if done <= 0 or total <= 0:
        return ""
    return f", ETA {_clock(elapsed * max(total - done, 0) / done)}"


def _percent(done: int, total: int) -> str:
    return f"{100 * done // total}%" if total > 0 else "?%"


def _line(found: Snapshot | None, elapsed: float, rate: float, tty: bool) -> str:
    if _tracked:
        entry = _tracked[-1]
        done, note = entry.done()
        mine = time.monotonic() - entry.started
        text = (f"{done:,}/{entry.total:,} {entry.label} "
                f"({_percent(done, entry.total)}){', ' + note if note else ''}{_eta(done, entry.total, mine)}, "
                f"{_clock(elapsed)} elapsed")  # fmt: skip
        bar_done, bar_total = done, entry.total
    elif found is None:
        return f"no Spark stage running (work on the driver or in PostgreSQL), {_clock(elapsed)} elapsed"
    elif found.executors == 0:
        plural = "s" if found.stages > 1 else ""
        return (f"waiting for executors: {found.stages} stage{plural}, {found.done}/{found.total} tasks, "
                f"no executor registered, {_clock(elapsed)} elapsed")  # fmt: skip
    else:
        plural = "s" if found.stages > 1 else ""
        text = (f"{found.stages} stage{plural}: {found.done}/{found.total} tasks ({_percent(found.done, found.total)})"
                f"{_eta(found.done, found.total, elapsed)}, {_clock(elapsed)} elapsed, {rate:.1f} tasks/s")  # fmt: skip
        bar_done, bar_total = found.done, found.total
    if not tty:
        return text
    filled = BAR * bar_done // max(bar_total, 1)
    return f"[{'#' * filled}{'.' * (BAR - filled)}] {text}"


@contextmanager
def reporting(
    context: Any, *, out: TextIO | None = None, every: float | None = None, heartbeat: float = HEARTBEAT
) -> Iterator[None]:
    """Report progress on `out` (stderr) while the block runs."""
    out = out or sys.stderr
    tty = out.isatty()
    every = every if every is not None else (0.5 if tty else 10.0)
    poll = min(every, heartbeat, 1.0)
    stop = threading.Event()
    started = time.monotonic()
    seen: dict[str, Any] = {"text": None, "at": started, "done": 0, "previous": 0, "shown": False}

    def run() -> None:
        while not stop.wait(poll):
            try:
                found = _snapshot(context)
                if found is not None:
                    seen["done"] += max(0, found.done - seen["previous"])
                    seen["previous"] = found.done
                now = time.monotonic()
                text = _line(found, now - started, seen["done"] / max(now - started, 1e-9), tty)
            except Exception:  # the context is stopping: nothing more to say
                return
            changed = text.split(", ")[0] != (seen["text"] or "").split(", ")[0]
            since = now - seen["at"]
            if tty:
                if found is None and not _tracked:
                    continue  # on a terminal, the last line stays until work shows again
            elif not ((changed and since >= every) or since >= heartbeat):
                continue
            seen["text"], seen["at"], seen["shown"] = text, now, True
            out.write(f"\r{text}\x1b[K" if tty else f"{text}\n")
            out.flush()

    thread = threading.Thread(target=run, name="tickler-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
        if tty and seen["shown"]:
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
