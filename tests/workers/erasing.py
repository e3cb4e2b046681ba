"""A process that runs one erasure in small batches until it is killed or the erasure is done.
Used to kill -9 it in the middle of an erasure (tests/test_erasure_races.py).

    python -m tests.workers.erasing DATABASE_URL ERASURE_ID BATCH_ROWS
"""

from __future__ import annotations

import sys

from tickler.scheduler.db import create_engine
from tickler.scheduler.erasing import Eraser, Hasher


def main(url: str, erasure_id: int, batch_rows: int) -> None:
    engine = create_engine(url, pool_size=1)
    Eraser(engine, Hasher(engine), batch_rows=batch_rows).run(erasure_id)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
