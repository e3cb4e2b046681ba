"""The Python client's errors and retries against real servers: tickler's own 401/403/404/413/503
answers, and a real proxy that answers 503 or drops connections, to tell the calls that are
retried (safe to repeat) from those sent once."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from tickler_client import Client, Lease, errors
from werkzeug.serving import make_server

from tests.client_fixtures import MakeClient
from tests.client_proxy import FlakyProxy, flaky_proxy
from tests.helpers_wait import wait_until
from tickler.api import close_app, create_app
from tickler.config import Settings


@pytest.fixture
def proxy(tickler: Client, live_server: str) -> Iterator[FlakyProxy]:
    with flaky_proxy(live_server) as proxy:
        yield proxy


@pytest.fixture
def via_proxy(proxy: FlakyProxy, token: str, make_client: MakeClient) -> Client:
    return make_client(proxy.url, token, timeout=10, retries=2, retry_backoff=0.01)


def test_unauthorized_forbidden_and_not_found(live_server: str, tickler: Client, store_token: str) -> None:
    with Client(live_server, "not-a-token") as stranger, pytest.raises(errors.Unauthorized) as caught:
        stranger.get("emails", "k")
    assert caught.value.status == 401 and isinstance(caught.value, errors.TicklerError)
    with pytest.raises(errors.Forbidden):
        tickler.put_queue("emails", max_attempts=3)  # a queue token is no admin
    with Client(live_server, store_token) as other_tenant, pytest.raises(errors.NotFound):
        other_tenant.schedule("emails", "k")  # 404, not 403: another tenant's queue is not revealed
    with pytest.raises(errors.NotFound):
        tickler.get_queue("nope")


@pytest.fixture
def store_token(store: object) -> str:
    from tickler.scheduler.store import Store

    assert isinstance(store, Store)
    return store.tokens.create("billing-service", queues=["invoices"])


def test_payload_too_large(tickler: Client) -> None:
    with pytest.raises(errors.PayloadTooLarge) as caught:
        tickler.schedule("emails", "big", {"blob": "x" * 300_000})
    assert caught.value.status == 413 and "data" in caught.value.errors


def test_a_server_whose_database_is_down_answers_503_with_retry_after(token: str, make_client: MakeClient) -> None:
    # The real app, pointed at a database nobody listens on: every token check fails to connect.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    app = create_app(
        # cache_seconds=0: no LISTEN connection, which would keep trying to reach the database
        Settings(
            database_url=f"postgresql://postgres@127.0.0.1:{closed_port}/none", migrate_on_start=False, cache_seconds=0
        ),
        configure_logs=False,
    )
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with (
            make_client(f"http://127.0.0.1:{server.server_port}", token, retries=0) as client,
            pytest.raises(errors.ServiceUnavailable) as caught,
        ):
            client.schedule("emails", "k")
    finally:
        server.shutdown()
        thread.join(timeout=10)
        close_app(app)
    assert caught.value.status == 503 and caught.value.retry_after == 1.0


def test_no_server_is_a_transport_error(make_client: MakeClient) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with (
        make_client(f"http://127.0.0.1:{port}", "t", retries=1, retry_backoff=0.01) as client,
        pytest.raises(errors.TransportError) as caught,
    ):
        client.get("emails", "k")
    assert caught.value.status == 0 and "no answer" in str(caught.value)


def test_reads_are_retried_after_503_and_dropped_connections(proxy: FlakyProxy, via_proxy: Client) -> None:
    via_proxy.schedule("emails", "k", delay=60)
    proxy.fail_next("503", "drop")
    assert via_proxy.get("emails", "k").item_key == "k"
    assert len(proxy.seen) == 3  # 503, no answer, then the answer
    proxy.fail_next("503", "503", "503")  # one more than the two retries
    with pytest.raises(errors.ServiceUnavailable) as caught:
        via_proxy.timeline("emails", "k")
    assert caught.value.retry_after == 0.0 and len(proxy.seen) == 3
    proxy.fail_next("drop", "503")
    assert [e.item_key for e in via_proxy.search("emails")] == ["k"] and len(proxy.seen) == 3


def test_writes_that_are_not_safe_to_repeat_are_sent_once(
    proxy: FlakyProxy, via_proxy: Client, tickler: Client
) -> None:
    tickler.schedule("emails", "k", delay=60)
    proxy.fail_next("503")
    with pytest.raises(errors.ServiceUnavailable):
        via_proxy.cancel("emails", "k")
    assert len(proxy.seen) == 1 and tickler.get("emails", "k").status == "pending"
    proxy.fail_next("drop")
    with pytest.raises(errors.TransportError):
        via_proxy.schedule("emails", "new")
    assert len(proxy.seen) == 1
    proxy.fail_next("503")
    with pytest.raises(errors.ServiceUnavailable):
        via_proxy.reschedule("emails", "k", delay=5)
    assert len(proxy.seen) == 1
    tickler.schedule("emails", "due")
    proxy.fail_next("503")
    with pytest.raises(errors.ServiceUnavailable):
        via_proxy.claim("emails", worker="w")
    assert len(proxy.seen) == 1


def test_schedule_with_ignore_and_ack_are_retried(proxy: FlakyProxy, via_proxy: Client, tickler: Client) -> None:
    proxy.fail_next("503", "drop")
    event = via_proxy.schedule("emails", "k", on_conflict="ignore")
    assert event.outcome == "created" and len(proxy.seen) == 3
    [lease] = tickler.claim("emails", worker="w")
    proxy.fail_next("drop")
    via_proxy.ack(lease)
    assert len(proxy.seen) == 2 and tickler.get("emails", "k").status == "delivered"


def test_a_resent_ack_is_told_apart_from_a_lost_lease(
    proxy: FlakyProxy, via_proxy: Client, tickler: Client, raw: psycopg.Connection[Any]
) -> None:
    tickler.schedule("emails", "k")
    [lease] = tickler.claim("emails", worker="w")
    proxy.fail_next("lose")  # the ack lands, its answer is lost; the retry finds the lease finished
    with pytest.raises(errors.StaleLease) as caught:
        via_proxy.ack(lease)
    resent = caught.value
    # the ack, sent again after no answer, then the key's timeline read to tell why it is stale
    assert [method for method, _ in proxy.seen] == ["POST", "POST", "GET"]
    assert tickler.get("emails", "k").status == "delivered"
    assert (resent.after_unanswered_try, resent.lease_status, resent.already_finished) == (True, "delivered", True)
    assert "already finished" in resent.detail and "already finished" in str(resent)
    tickler.schedule("emails", "j")
    [lost] = tickler.claim("emails", worker="w", lease_seconds=0.2)

    def expired() -> bool:
        row = raw.execute("SELECT lease_expires_on <= now() FROM tickler_event WHERE item_key = 'j'").fetchone()
        return row is not None and bool(row[0])

    wait_until(expired, what="the lease expiring")
    with pytest.raises(errors.StaleLease) as caught:
        via_proxy.ack(lost)  # no answer was lost: the lease itself was
    assert (caught.value.after_unanswered_try, caught.value.lease_status) == (False, "expired")
    assert not caught.value.already_finished and "expired" in caught.value.detail
    [again] = tickler.claim("emails", worker="other")
    with pytest.raises(errors.StaleLease) as caught:
        via_proxy.extend(lost, 30)  # claimed again by another worker: the server cannot say more
    assert (caught.value.lease_status, caught.value.already_finished) == ("unknown", False)
    tickler.ack(again)


def test_an_unexpected_answer_is_a_server_error_and_not_retried(proxy: FlakyProxy, via_proxy: Client) -> None:
    proxy.fail_next("500")
    with pytest.raises(errors.ServerError) as caught:
        via_proxy.get("emails", "k")
    assert caught.value.status == 500 and "Internal Server Error" in caught.value.detail and len(proxy.seen) == 1


def test_consume_rides_out_a_server_that_does_not_answer(proxy: FlakyProxy, via_proxy: Client, tickler: Client) -> None:
    tickler.schedule("emails", "k")
    proxy.fail_next("drop", "503")  # the first claim gets no answer, the second a 503
    stop = threading.Event()
    handled: list[str] = []

    def handler(lease: Lease) -> None:
        handled.append(lease.events[0].item_key)
        stop.set()

    stats = via_proxy.consume("emails", handler, worker="w", wait_seconds=1, stop=stop, handle_signals=False)
    assert handled == ["k"] and stats.acked == 1
    assert [method for method, _ in proxy.seen[:3]] == ["POST", "POST", "POST"]  # claim, claim, claim
    assert tickler.get("emails", "k").status == "delivered"
