"""The second peer: awa-pg (PyPI, a Rust core with a Python SDK), through its public API only, in the
batch row only: its workers run inside its Rust runtime (`AsyncClient.start`), which bench/ does not
drive yet.

Its schema goes into a database of its own by `Client.migrate()`, then its queue-storage backend
(without it, `enqueue_many_copy` refuses: "requires an active queue_storage backend"). A job is keyed
by its arguments (`unique_opts` `by_args`), so the key rides in them beside the payload; the group is
its `ordering_key`. A batch holding a key an open job has fails whole (UniqueConflict): awa has no
`ignore`, so the batches compared hold new keys only, which every side writes alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import closing
from datetime import UTC, datetime, timedelta
from typing import Any

from tickler.config.database_url import parse

KIND = "bench"
QUEUE = "bench"


def _client(url: str) -> Any:
    import awa

    # awa's driver reads host:port in the URL's authority only (not libpq's ?host= form)
    found = parse(url)
    [host] = found.hosts
    plain = f"postgresql://{found.user or 'postgres'}@{host.name}:{host.port or 5432}/{found.dbname}"
    return awa.Client(plain, max_connections=2)


def install(url: str) -> None:
    with closing(_client(url)) as client:
        client.migrate()
        client.install_queue_storage()


class Producer:
    """awa's synchronous client (its own connection pool)."""

    def __init__(self, url: str) -> None:
        self.client = _client(url)

    def many(
        self,
        keys: Sequence[str],
        payloads: Sequence[dict[str, Any]],
        groups: Sequence[str | None],
        *,
        delay: float = 3600.0,
    ) -> None:
        """One COPY for the whole list, keyed by the arguments, each job in its group's order."""
        self.client.enqueue_many_copy(
            [{"key": key, **payload} for key, payload in zip(keys, payloads, strict=True)],
            kind=KIND,
            queue=QUEUE,
            run_at=datetime.now(UTC) + timedelta(seconds=delay),
            unique_opts={"by_args": True},
            opts=[{"ordering_key": group} if group else None for group in groups],
        )

    def close(self) -> None:
        self.client.close()
