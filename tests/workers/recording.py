"""Handlers for `tickler worker --handlers tests.workers.recording:handlers`, set up by environment:

RECORD_DIR      each process appends the id of every event it handled (one per line) to
                handled-<pid>.txt there, after the handler's work and before it returns
QUEUE           the queue handled (default "work")
BLOCK_KEY       the handler of this item_key writes started-<item_key> in RECORD_DIR, then never returns
HANDLE_SECONDS  how long each handler works (default 0)
SLOW_KEY        the handler of this item_key writes started-<item_key> in RECORD_DIR, then works
                SLOW_SECONDS (default 0.3) before it returns
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from tickler.scheduler.delivery.handlers import Handlers
from tickler.scheduler.models import Event

handlers = Handlers()

_record_dir = Path(os.environ["RECORD_DIR"])
_block_key = os.environ.get("BLOCK_KEY")
_handle_seconds = float(os.environ.get("HANDLE_SECONDS", "0"))
_slow_key = os.environ.get("SLOW_KEY")
_slow_seconds = float(os.environ.get("SLOW_SECONDS", "0.3"))
_fd: int | None = None
_fd_lock = threading.Lock()
_never = threading.Event()


def _record(event_id: int) -> None:
    global _fd
    with _fd_lock:
        if _fd is None:
            _fd = os.open(_record_dir / f"handled-{os.getpid()}.txt", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    # one small write on an O_APPEND file: a whole line, even when the process is killed
    os.write(_fd, f"{event_id}\n".encode())


@handlers.handler(os.environ.get("QUEUE", "work"))
def record(event: Event) -> None:
    if event.item_key == _block_key:
        (_record_dir / f"started-{event.item_key}").write_text(str(os.getpid()))
        _never.wait()  # a hung handler: only SIGKILL or the end of the process stops it
    if event.item_key == _slow_key:
        (_record_dir / f"started-{event.item_key}").write_text(str(os.getpid()))
        time.sleep(_slow_seconds)
    if _handle_seconds:
        time.sleep(_handle_seconds)
    _record(event.id)
