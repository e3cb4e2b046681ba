"""Webhook requests on the event loop: a thousand in flight to a slow receiver, a worker killed or
stopped with many in flight, and the destination policy — all against real local receivers."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.helpers_wait import wait_until
from tests.receiver import running_receiver
from tests.receiver_async import HoldingReceiver, holding_receiver
from tests.workers.spawn import logs, start_worker, stop_workers
from tickler.config import Settings, SettingsError, parse_networks
from tickler.scheduler.delivery.destinations import DestinationPolicy, StaticResolver
from tickler.scheduler.delivery.webhook import WebhookDeliverer
from tickler.scheduler.dispatcher import Dispatcher, DispatcherConfig
from tickler.scheduler.models import NewEvent, Queue
from tickler.scheduler.store import QueueSettings, Store
from tickler.scheduler.wakeup import WakeupListener


@contextmanager
def dispatching(store: Store, database_url: str, deliverer: WebhookDeliverer, **config: Any) -> Iterator[Dispatcher]:
    dispatcher = Dispatcher(
        store,
        WakeupListener(database_url),
        DispatcherConfig(worker_name="engine-test", reap_interval=0.2, **config),
        webhook=deliverer,
    ).start()
    try:
        yield dispatcher
    finally:
        dispatcher.stop()


def schedule(store: Store, queue: Queue, n: int) -> None:
    store.events.schedule_batch(queue, [NewEvent(f"k{i}", {"i": i}) for i in range(n)], actor="test")


def count(raw: psycopg.Connection[Any], sql: str) -> int:
    row = raw.execute(sql).fetchone()
    assert row is not None
    return int(row[0])


def delivered(raw: psycopg.Connection[Any]) -> int:
    return count(raw, "SELECT count(*) FROM tickler_event_all WHERE outcome = 'delivered'")


def test_a_thousand_requests_in_flight_to_a_slow_receiver_keep_their_leases_and_arrive_once(
    store: Store, database_url: str, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    with holding_receiver() as receiver:
        queue = make_queue(
            "hooks", delivery_mode="webhook", webhook_url=receiver.url, lease_seconds=4, webhook_timeout_seconds=60
        )
        with dispatching(store, database_url, WebhookDeliverer()):
            # A receiver that has answered on kept-alive connections is given new ones faster.
            receiver.hold = False
            store.events.schedule_batch(queue, [NewEvent(f"warm{i}", {}) for i in range(50)], actor="test")
            wait_until(lambda: delivered(raw) == 50, timeout=30)
            receiver.hold = True
            schedule(store, queue, 1000)
            wait_until(lambda: receiver.held == 1000, timeout=60, what=lambda: f"{receiver.held} held")
            # Held past half the lease: the heartbeat extended every lease beyond what its claim set.
            wait_until(
                lambda: (
                    count(raw, "SELECT count(*) FROM tickler_event WHERE lease_expires_on > claimed_expires_on") == 1000
                ),
                timeout=30,
            )
            receiver.release()
            wait_until(lambda: delivered(raw) == 1050, timeout=60)
    assert set(receiver.arrivals.values()) == {1}  # each event once: no lease ran out meanwhile
    assert len(receiver.arrivals) == 1050
    assert count(raw, "SELECT count(*) FROM tickler_event_all WHERE redeliver_count > 0") == 0


def worker_env(**knobs: str) -> dict[str, str]:
    return {"TICKLER_WORKER_REAP_INTERVAL": "0.2", **knobs}


def schedule_held(store: Store, queue: Queue, n: int, receiver: HoldingReceiver, tmp_path: Path) -> None:
    """Schedule `n` events and wait until the receiver holds a request of each (the worker's log
    in tmp_path tells why, if it never does)."""
    schedule(store, queue, n)
    wait_until(lambda: receiver.held == n, timeout=60, what=lambda: f"{receiver.held} held\n{logs(tmp_path)}")


def test_a_worker_killed_with_many_requests_in_flight_has_each_redelivered_once_after_its_lease(
    store: Store, database_url: str, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any], tmp_path: Path
) -> None:
    n = 1_000
    with holding_receiver() as receiver:
        queue = make_queue(
            "hooks", delivery_mode="webhook", webhook_url=receiver.url, lease_seconds=2, webhook_timeout_seconds=60
        )
        worker = start_worker(database_url, tmp_path, name="doomed", webhooks=True, **worker_env())
        try:
            schedule_held(store, queue, n, receiver, tmp_path)
        finally:
            worker.send_signal(signal.SIGKILL)
            worker.wait(10)
        receiver.answer_at_once()
        # The killed worker's 2 s leases are what this test waits out; the redeliveries get leases
        # that a loaded machine cannot let expire as well (that would count some a second time).
        make_queue("hooks", lease_seconds=60)
        with dispatching(store, database_url, WebhookDeliverer()):
            wait_until(lambda: delivered(raw) == n, timeout=60)
    assert set(receiver.arrivals.values()) == {2}  # the killed attempt and the redelivery, no more
    outcomes = raw.execute("SELECT outcome, redeliver_count, count(*) FROM tickler_event_all GROUP BY 1, 2").fetchall()
    assert outcomes == [("delivered", 1, n)]  # the expired lease counted once
    assert count(raw, "SELECT count(*) FROM tickler_timeline WHERE action = 'lease_expired'") == n


def test_sigterm_lets_requests_in_flight_finish_within_the_grace_period_and_releases_the_rest(
    store: Store, database_url: str, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any], tmp_path: Path
) -> None:
    n = 200
    with holding_receiver() as receiver:
        queue = make_queue("hooks", delivery_mode="webhook", webhook_url=receiver.url, lease_seconds=60)
        worker = start_worker(
            database_url, tmp_path, name="stopped", webhooks=True, **worker_env(TICKLER_WORKER_SHUTDOWN_GRACE="3")
        )
        try:
            schedule_held(store, queue, n, receiver, tmp_path)
            ids = sorted(receiver.arrivals)
            finishing = set(ids[: n // 2])
            worker.send_signal(signal.SIGTERM)
            receiver.release(lambda got: got[0] in finishing)  # these answer during the grace period
            assert worker.wait(30) == 0, logs(tmp_path)
        finally:
            stop_workers([worker])
    outcomes = dict(
        raw.execute(
            "SELECT e.id, coalesce(e.outcome, 'open') || ':' || e.redeliver_count || ':' || (e.lease_id IS NULL)"
            " FROM tickler_event_all AS e"
        ).fetchall()
    )
    assert {outcomes[i].rsplit(":", 1)[0] for i in finishing} == {"delivered:0"}
    assert {outcomes[i] for i in ids if i not in finishing} == {"open:0:true"}  # released: claimable, not counted
    assert set(receiver.arrivals.values()) == {1}


# -- the destination policy --------------------------------------------------------------------


def deny(*networks: str) -> DestinationPolicy:
    return DestinationPolicy(deny=parse_networks("TICKLER_WEBHOOK_DENY_NETWORKS", ",".join(networks)))


def failed_with(store: Store, key: str = "k0") -> str:
    wait_until(lambda: store.events.get("hooks", key).redeliver_count == 1, timeout=30)
    return store.events.get("hooks", key).last_error or ""


def test_a_receiver_on_a_denied_address_gets_no_request(
    store: Store, database_url: str, make_queue: Callable[..., Queue]
) -> None:
    with holding_receiver() as receiver, dispatching(store, database_url, WebhookDeliverer(policy=deny("127.0.0.0/8"))):
        receiver.hold = False
        schedule(store, make_queue("hooks", delivery_mode="webhook", webhook_url=receiver.url), 1)
        assert failed_with(store) == "destination 127.0.0.1 is denied by TICKLER_WEBHOOK_DENY_NETWORKS"
    assert not receiver.arrivals


@pytest.mark.parametrize("address", ["169.254.169.254", "[fd00:ec2::254]", "[::ffff:169.254.169.254]"])
def test_cloud_metadata_addresses_are_denied_by_default(
    store: Store, database_url: str, make_queue: Callable[..., Queue], address: str
) -> None:
    with dispatching(store, database_url, WebhookDeliverer()):
        schedule(store, make_queue("hooks", delivery_mode="webhook", webhook_url=f"http://{address}/latest"), 1)
        assert "is denied by TICKLER_WEBHOOK_DENY_NETWORKS" in failed_with(store)


def test_a_name_that_resolves_to_a_denied_address_gets_no_request(
    store: Store, database_url: str, make_queue: Callable[..., Queue]
) -> None:
    with holding_receiver() as receiver, dispatching(store, database_url, WebhookDeliverer(policy=deny("127.0.0.0/8"))):
        receiver.hold = False
        url = receiver.url.replace("127.0.0.1", "localhost")  # the system resolver: 127.0.0.1 (and ::1)
        schedule(store, make_queue("hooks", delivery_mode="webhook", webhook_url=url), 1)
        assert failed_with(store) == "destination 127.0.0.1 is denied by TICKLER_WEBHOOK_DENY_NETWORKS"
    assert not receiver.arrivals


def test_a_name_is_connected_to_at_its_checked_address_with_its_own_host_header(
    store: Store, database_url: str, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    names = StaticResolver({"hooks.example": ["127.0.0.1"], "metadata.example": ["169.254.169.254"]})
    with holding_receiver() as receiver, dispatching(store, database_url, WebhookDeliverer(lookup=names)):
        receiver.hold = False
        url = receiver.url.replace("127.0.0.1", "hooks.example")
        schedule(store, make_queue("hooks", delivery_mode="webhook", webhook_url=url), 1)
        wait_until(lambda: delivered(raw) == 1)
        assert receiver.hosts == [url.split("/")[2]]
        store.queues.put(
            "hooks", QueueSettings(webhook_url=url.replace("hooks.example", "metadata.example")), Settings()
        )
        store.events.schedule(store.queues.get("hooks"), NewEvent("k9", {}), actor="test")
        assert failed_with(store, "k9") == "destination 169.254.169.254 is denied by TICKLER_WEBHOOK_DENY_NETWORKS"


def test_a_name_that_re_resolves_to_a_denied_address_is_refused_on_its_next_connection(
    store: Store, database_url: str, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    names = StaticResolver({"flip.example": ["127.0.0.1"]})
    deliverer = WebhookDeliverer(lookup=names, dns_cache_seconds=None)
    # An HTTP/1.0 receiver closes every connection: each attempt connects, and resolves, anew.
    with running_receiver() as receiver, dispatching(store, database_url, deliverer):
        url = receiver.url.replace("127.0.0.1", "flip.example")
        queue = make_queue("hooks", delivery_mode="webhook", webhook_url=url)
        store.events.schedule(queue, NewEvent("k0", {}), actor="test")
        wait_until(lambda: delivered(raw) == 1)
        names.table["flip.example"] = ["169.254.169.254"]  # the name's owner rebinds it
        store.events.schedule(queue, NewEvent("k1", {}), actor="test")
        assert failed_with(store, "k1") == "destination 169.254.169.254 is denied by TICKLER_WEBHOOK_DENY_NETWORKS"
    assert len(receiver.received) == 1


def test_a_redirect_is_never_followed(store: Store, database_url: str, make_queue: Callable[..., Queue]) -> None:
    with holding_receiver() as target, running_receiver([(302, {"Location": "TARGET"})]) as redirecting:
        target.hold = False
        redirecting.script = [(302, {"Location": target.url})]
        with dispatching(store, database_url, WebhookDeliverer()):
            schedule(store, make_queue("hooks", delivery_mode="webhook", webhook_url=redirecting.url), 1)
            assert failed_with(store).startswith("HTTP 302")
    assert not target.arrivals


def test_a_denied_network_setting_that_is_not_cidr_is_refused() -> None:
    with pytest.raises(SettingsError, match="TICKLER_WEBHOOK_DENY_NETWORKS must be comma-separated CIDR"):
        Settings.from_env({"TICKLER_WEBHOOK_DENY_NETWORKS": "169.254.0.0/16,metadata"})
    allowed = Settings.from_env({"TICKLER_WEBHOOK_ALLOW_NETWORKS": "10.0.0.0/8, fd00::/8"})
    policy = DestinationPolicy.from_settings(allowed)
    assert policy.refusal("10.1.2.3") is None
    assert policy.refusal("192.168.1.1") == "destination 192.168.1.1 is not in TICKLER_WEBHOOK_ALLOW_NETWORKS"
