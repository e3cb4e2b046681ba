"""A process that finishes events as fast as it can, until it is killed: claims due events of a
queue in batches and acks them, fails every seventh lease as dead. Used to kill -9 it in the
middle of a finish (tests/test_history_crash.py).

    python -m tests.workers.finishing DATABASE_URL QUEUE
"""

from __future__ import annotations

import sys

from tickler.scheduler.db import create_engine
from tickler.scheduler.store import Store


def main(url: str, queue_name: str) -> None:
    store = Store(create_engine(url, pool_size=1))
    queue = store.queues.get(queue_name)
    batches = 0
    while True:
        leases = store.leases.claim(queue, worker="finishing", limit=20)
        if not leases:
            continue
        batches += 1
        if batches % 7 == 0:
            store.leases.nack(leases[0].lease_id, error="stop", dead=True)
            leases = leases[1:]
        store.leases.ack([lease.lease_id for lease in leases])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
