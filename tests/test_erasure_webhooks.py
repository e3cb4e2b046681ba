"""An erasure while webhooks of its subject are in flight (SPEC §12: never delivered afterwards):
requests already handed to the dispatcher's event loop, waiting for a connection to a slow
receiver, are not sent once their lease is gone, and the erasure is done only once every lease it
took away has ended. So after `done` no request for an erased key reaches the receiver."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import sqlalchemy as sa

from tests.helpers_http import QuietHandler, serving
from tests.helpers_wait import wait_until
from tickler.config import Settings
from tickler.scheduler.delivery.webhook import WebhookDeliverer
from tickler.scheduler.dispatcher import Dispatcher, DispatcherConfig
from tickler.scheduler.erasing import Eraser, Hasher, request
from tickler.scheduler.models import NewEvent
from tickler.scheduler.store import QueueSettings, Store
from tickler.scheduler.store.erasures import ErasureStore, Selector
from tickler.scheduler.wakeup import WakeupListener

MARK = "zqxhook"
ANSWER_AFTER = 0.3  # the receiver is slow: each request holds a connection this long


@dataclass
class SlowReceiver:
    url: str = ""
    # (when it arrived, monotonic; its keys)
    arrived: list[tuple[float, list[str]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def keys_after(self, moment: float) -> list[str]:
        with self.lock:
            return [key for at, keys in self.arrived if at > moment for key in keys]

    def count(self) -> int:
        with self.lock:
            return len(self.arrived)


@contextmanager
def slow_receiver() -> Iterator[SlowReceiver]:
    receiver = SlowReceiver()

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            keys = [event["item_key"] for event in json.loads(self.body())["events"]]
            with receiver.lock:
                receiver.arrived.append((time.monotonic(), keys))
            time.sleep(ANSWER_AFTER)  # the receiver's own slowness, not a wait for work
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    with serving(Handler) as base:
        receiver.url = f"{base}/hooks"
        yield receiver


def test_nothing_of_an_erased_subject_reaches_the_receiver_after_the_erasure_is_done(
    store: Store, engine: sa.Engine, database_url: str
) -> None:
    with slow_receiver() as receiver:
        put = store.queues.put(
            "hooks",
            QueueSettings(delivery_mode="webhook", webhook_url=receiver.url, lease_seconds=2),
            Settings(),
        )
        for start in range(0, 1200, 100):
            store.events.schedule_batch(
                put.queue,
                [NewEvent(item_key=f"welcome:{MARK}:{i}", data={"who": MARK}) for i in range(start, start + 100)],
                actor="signup",
            )
        store.events.schedule_batch(
            put.queue, [NewEvent(item_key=f"bystander:{i}", data={}) for i in range(40)], actor="signup"
        )
        config = DispatcherConfig(worker_name="erasure-hooks", reap_interval=0.2)
        dispatcher = Dispatcher(store, WakeupListener(database_url), config, webhook=WebhookDeliverer()).start()
        try:
            # Requests are going out, four new connections at a time, hundreds more handed to the loop.
            wait_until(lambda: receiver.count() >= 20, timeout=30)
            erasure = request(
                engine,
                Selector(item_key_prefix=f"welcome:{MARK}"),
                reason="hooks in flight",
                requested_by="ops",
                secret="",
            )
            eraser = Eraser(engine, Hasher(engine))
            wait_until(lambda: eraser.run_or_fail(erasure.id), timeout=60)
            done_seen = time.monotonic()
            done = ErasureStore(engine).get(erasure.id)
            assert done is not None and done.status == "done" and done.open_events > 0
            # Everything handed to the loop ends: sent before, or dropped with its lease.
            wait_until(lambda: not dispatcher.keeper.running(), timeout=60)
            wait_until(lambda: store.events.get("hooks", "bystander:39").status == "delivered", timeout=60)
        finally:
            dispatcher.stop()
        assert [key for key in receiver.keys_after(done_seen) if MARK in key] == []
        with receiver.lock:
            sent = {key for _, keys in receiver.arrived for key in keys if MARK in key}
        assert 0 < len(sent) < 1200  # some went out before the erasure, the rest never did
