"""Fixtures of the Python client's tests: `tickler_client.Client`s talking to the real app served
over a real threaded HTTP server (`live_server`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tickler_client import Client


@pytest.fixture
def admin(live_server: str, admin_token: str) -> Iterator[Client]:
    """A client with an admin token."""
    with Client(live_server, admin_token, timeout=10, retry_backoff=0.01) as client:
        yield client


@pytest.fixture
def tickler(live_server: str, token: str, admin: Client) -> Iterator[Client]:
    """The signup service's client: its token may use the pull queue `emails`, created here."""
    admin.put_queue("emails", pull=True, backoff_initial_seconds=0.05, backoff_max_seconds=0.05)
    with Client(live_server, token, timeout=10, retry_backoff=0.01) as client:
        yield client
