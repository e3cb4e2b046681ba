"""Tracing (SPEC §11), end to end: `tickler serve` and `tickler worker` run as processes with the
standard OTEL_* variables pointing at a real OTLP/HTTP receiver started here; the client runs in
a process of its own with OpenTelemetry configured, as a service would. Every span is checked as
the receiver decoded it (opentelemetry-proto): parents, links, attributes, status."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.helpers_wait import wait_until
from tests.otlp_receiver import OtlpReceiver, running_otlp_receiver
from tests.receiver import running_receiver
from tickler.scheduler.store import Store

ROOT = Path(__file__).resolve().parent.parent
CLIENT_TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
PRODUCER = 4
CONSUMER = 5
ERROR = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _otel_env(receiver: OtlpReceiver | None, service: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(ROOT)
    if receiver is not None:
        env.update(
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_BSP_SCHEDULE_DELAY="50",
            OTEL_SERVICE_NAME=service,
        )
    return env


@contextmanager
def _process(args: list[str], env: dict[str, str], ready: Callable[[], object]) -> Iterator[None]:
    process = subprocess.Popen(args, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: ready() or process.poll() is not None, 30, what="the process to start")
        assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
        yield
    finally:
        process.send_signal(signal.SIGTERM)  # stops gracefully: buffered spans are exported
        process.communicate(timeout=30)  # reads and closes its stderr


def _answers(url: str) -> bool:
    try:
        return requests.get(url + "/healthz", timeout=1).ok
    except requests.ConnectionError:
        return False


@contextmanager
def _serve(database_url: str, receiver: OtlpReceiver | None) -> Iterator[str]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**_otel_env(receiver, "tickler"), "TICKLER_DATABASE_URL": database_url}
    with _process([sys.executable, "-m", "tickler.cli", "serve", "--port", str(port)], env, lambda: _answers(url)):
        yield url


def _run_client(script: str, receiver: OtlpReceiver, **values: str) -> dict[str, Any]:
    """Run `script` in a process of its own with an OpenTelemetry SDK exporting to the receiver;
    the script prints one JSON object."""
    prelude = """
import json, sys, threading
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
provider = TracerProvider(resource=Resource.create({"service.name": "signup-service"}))
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("signup")
from tickler_client import Client
values = json.loads(sys.argv[1])
"""
    env = _otel_env(receiver, "signup-service")
    done = subprocess.run(
        [sys.executable, "-c", prelude + script, json.dumps(values)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def _put_queue(url: str, admin_token: str, name: str, delivery: dict[str, Any]) -> None:
    answer = requests.put(
        f"{url}/v1/queues/{name}",
        json={"delivery": delivery, "backoff": {"initial_seconds": 0.05, "max_seconds": 0.05, "multiplier": 1}},
        headers={"Authorization": f"Bearer {admin_token}"},
        timeout=10,
    )
    assert answer.status_code in (200, 201), answer.text


def _tokens(store: Store, queue: str) -> tuple[str, str]:
    """An admin token, and the token of the signup service, a client of `queue`."""
    return store.tokens.create("ops", is_admin=True), store.tokens.create("signup-service", queues=[queue])


@contextmanager
def _serving_pull_queue(database_url: str, store: Store, otlp: OtlpReceiver, queue: str) -> Iterator[tuple[str, str]]:
    """`tickler serve`, exporting its spans to `otlp`, with the pull queue `queue`; yields its URL
    and the token of the signup service, a client of `queue`."""
    admin_token, token = _tokens(store, queue)
    with _serve(database_url, otlp) as url:
        _put_queue(url, admin_token, queue, {"mode": "pull"})
        yield url, token


def _send_traced(method: str, url: str, token: str, body: dict[str, Any]) -> requests.Response:
    """A request of the signup service that carries its trace context, CLIENT_TRACEPARENT."""
    headers = {"Authorization": f"Bearer {token}", "traceparent": CLIENT_TRACEPARENT}
    return requests.request(method, url, json=body, headers=headers, timeout=10)


def _timeline(url: str, token: str, queue: str, key: str) -> list[dict[str, Any]]:
    answer = requests.get(
        f"{url}/v1/queues/{queue}/events/{key}/timeline", headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    entries: list[dict[str, Any]] = answer.json()["entries"]
    return entries


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    with running_otlp_receiver() as receiver:
        yield receiver


def test_webhook_attempts_continue_the_client_trace(database_url: str, store: Store, otlp: OtlpReceiver) -> None:
    admin_token, token = _tokens(store, "hooks")
    with running_receiver([(500, {}), (200, {})]) as hooks, _serve(database_url, otlp) as url:
        _put_queue(url, admin_token, "hooks", {"mode": "webhook", "url": hooks.url, "timeout_seconds": 5})
        client = _run_client(
            """
with tracer.start_as_current_span("signup") as span, Client(values["url"], values["token"]) as tickler:
    tickler.schedule("hooks", "welcome:ana@example.com", {"to": "ana"})
    print(json.dumps({"trace_id": format(span.get_span_context().trace_id, "032x"),
                      "span_id": format(span.get_span_context().span_id, "016x")}))
""",
            otlp,
            url=url,
            token=token,
        )
        trace_id = client["trace_id"]
        received = hooks.wait_for(2)
        entries = wait_until(
            lambda: (
                [e for e in _timeline(url, token, "hooks", "welcome:ana@example.com") if e["action"] == "delivered"]
                and _timeline(url, token, "hooks", "welcome:ana@example.com")
            )
        )
        [create] = otlp.wait_named("create hooks")
        processes = otlp.wait_named("process hooks", 2)
        otlp.wait_named("settle hooks", 2)

    # The server's create span is the client's request's child, and the trace goes on from there.
    assert create.trace_id == trace_id and create.parent_span_id == client["span_id"]
    assert create.kind == PRODUCER
    assert create.attributes["messaging.system"] == "tickler"
    assert create.attributes["messaging.destination.name"] == "hooks"
    assert create.attributes["tickler.item_key"] == "welcome:ana@example.com"
    # Each attempt: a process span in the same trace, linked to the producer's context.
    failed, delivered = sorted(processes, key=lambda s: s.attributes["tickler.attempt"])
    for attempt in (failed, delivered):
        assert attempt.trace_id == trace_id and attempt.kind == CONSUMER
        assert attempt.parent_span_id == create.span_id
        assert (create.trace_id, create.span_id) in attempt.links
        assert attempt.attributes["messaging.system"] == "tickler"
        assert attempt.attributes["messaging.destination.name"] == "hooks"
        assert attempt.attributes["tickler.item_key"] == "welcome:ana@example.com"
    assert failed.attributes["tickler.attempt"] == 1 and delivered.attributes["tickler.attempt"] == 2
    assert failed.attributes["tickler.outcome"] == "failed" and failed.status_code == ERROR
    assert "HTTP 500" in failed.status_message and failed.attributes["error.type"] == "failed"
    assert delivered.attributes["tickler.outcome"] == "delivered" and delivered.status_code != ERROR
    # The receiver saw each attempt's own traceparent.
    # (Its flags say sampled; newer SDKs also set W3C level 2's random-trace-id bit.)
    assert [r.headers["traceparent"][:53] for r in received] == [
        f"00-{trace_id}-{failed.span_id}-",
        f"00-{trace_id}-{delivered.span_id}-",
    ]
    assert all(int(r.headers["traceparent"][53:], 16) & 1 for r in received)
    # The settle spans are the attempts' children; the timeline keeps each attempt's trace.
    settles = otlp.named("settle hooks")
    assert {s.parent_span_id for s in settles} == {failed.span_id, delivered.span_id}
    attempts = [e for e in entries if e["action"] in ("failed", "delivered")]
    assert [e["details"].get("trace_id") for e in attempts] == [trace_id, trace_id]


BLOCKING_CONSUMER = """
with Client(values["url"], values["token"]) as tickler:
    with tracer.start_as_current_span("signup") as span:
        tickler.schedule("pulled", "welcome:bo", {"to": "bo"})
    claimed = []
    stop = threading.Event()
    def handle(lease):
        claimed.append(lease.events[0].raw.get("traceparent"))
        with tracer.start_as_current_span("send email"):
            if len(claimed) == 1:
                raise RuntimeError("mail server said 421")
        stop.set()
    tickler.consume("pulled", handle, wait_seconds=1, stop=stop, handle_signals=False)
    print(json.dumps({"trace_id": format(span.get_span_context().trace_id, "032x"), "claimed": claimed}))
"""
ASYNC_CONSUMER = """
import asyncio
from tickler_client import AsyncClient
async def main():
    async with AsyncClient(values["url"], values["token"]) as tickler:
        with tracer.start_as_current_span("signup") as span:
            await tickler.schedule("pulled", "welcome:bo", {"to": "bo"})
        claimed = []
        stop = asyncio.Event()
        async def handle(lease):
            claimed.append(lease.events[0].raw.get("traceparent"))
            with tracer.start_as_current_span("send email"):
                if len(claimed) == 1:
                    raise RuntimeError("mail server said 421")
            stop.set()
        await tickler.consume("pulled", handle, wait_seconds=1, stop=stop, handle_signals=False)
        print(json.dumps({"trace_id": format(span.get_span_context().trace_id, "032x"), "claimed": claimed}))
asyncio.run(main())
"""


@pytest.mark.parametrize("consumer", [BLOCKING_CONSUMER, ASYNC_CONSUMER], ids=["Client", "AsyncClient"])
def test_pull_claims_hand_the_producer_context_to_consume(
    consumer: str, database_url: str, store: Store, otlp: OtlpReceiver
) -> None:
    with _serving_pull_queue(database_url, store, otlp, "pulled") as (url, token):
        client = _run_client(
            consumer,
            otlp,
            url=url,
            token=token,
        )
        trace_id = client["trace_id"]
        [create] = otlp.wait_named("create pulled")
        processes = otlp.wait_named("process pulled", 2)
        sends = otlp.wait_named("send email", 2)
        receives = otlp.wait_named("receive pulled", 2)
        settles = otlp.wait_named("settle pulled", 2)
        entries = _timeline(url, token, "pulled", "welcome:bo")

    # Each claim returned the producer's context: the server's create span.
    assert [claimed[:53] for claimed in client["claimed"]] == [f"00-{trace_id}-{create.span_id}-"] * 2
    # consume ran the handler in a process span continuing the producer's trace, linked to it.
    failed, delivered = sorted(processes, key=lambda s: s.attributes["tickler.attempt"])
    for attempt in (failed, delivered):
        assert attempt.service == "signup-service" and attempt.kind == CONSUMER
        assert attempt.trace_id == trace_id and attempt.parent_span_id == create.span_id
        assert (trace_id, create.span_id) in attempt.links
        assert attempt.attributes["messaging.system"] == "tickler"
        assert attempt.attributes["tickler.item_key"] == "welcome:bo"
    assert failed.status_code == ERROR and "mail server said 421" in failed.status_message
    assert delivered.status_code != ERROR
    assert {s.parent_span_id for s in sends} == {failed.span_id, delivered.span_id}
    # The server's receive spans are linked to the producer; its settle spans (the nack, the ack)
    # are children of the consumer's attempts, whose traces the timeline keeps.
    for receive in receives:
        assert (trace_id, create.span_id) in receive.links and receive.service == "tickler"
    assert {s.parent_span_id for s in settles} == {failed.span_id, delivered.span_id}
    attempts = [e for e in entries if e["action"] in ("failed", "delivered")]
    assert [e["details"].get("trace_id") for e in attempts] == [trace_id, trace_id]


def test_in_process_handler_runs_inside_the_attempt_span(database_url: str, store: Store, otlp: OtlpReceiver) -> None:
    with _serving_pull_queue(database_url, store, otlp, "inproc") as (url, token):
        env = {**_otel_env(otlp, "tickler-worker"), "TICKLER_DATABASE_URL": database_url}
        worker = [sys.executable, "-m", "tickler.cli", "worker", "--handlers", "tests.tracing_handlers:handlers"]
        with _process(worker, env, lambda: True):
            answer = _send_traced(
                "POST", f"{url}/v1/queues/inproc/events", token, {"item_key": "welcome:cy", "data": {}}
            )
            assert answer.status_code == 202
            [create] = otlp.wait_named("create inproc")
            processes = otlp.wait_named("process inproc", 2)
            sends = otlp.wait_named("send welcome email", 2)

    trace_id = CLIENT_TRACEPARENT[3:35]
    assert create.trace_id == trace_id and create.parent_span_id == CLIENT_TRACEPARENT[36:52]
    failed, delivered = sorted(processes, key=lambda s: s.attributes["tickler.attempt"])
    for attempt in (failed, delivered):
        assert attempt.service == "tickler-worker" and attempt.trace_id == trace_id
        assert attempt.parent_span_id == create.span_id and (trace_id, create.span_id) in attempt.links
    assert failed.status_code == ERROR and "mail server said 421" in failed.status_message
    assert delivered.status_code != ERROR and delivered.attributes["tickler.outcome"] == "delivered"
    # The handler's own spans are children of the attempt it ran in.
    assert {s.parent_span_id for s in sends} == {failed.span_id, delivered.span_id}


@pytest.mark.parametrize(
    "traceparent",
    [
        "garbage",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # all-zero trace id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",  # version 00 with more
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        "",
    ],
)
def test_malformed_traceparent_is_ignored(client: Any, admin_token: str, token: str, traceparent: str) -> None:
    from tests.conftest import auth

    client.put("/v1/queues/emails", json={"delivery": {"mode": "pull"}}, headers=auth(admin_token))
    headers = {**auth(token), "traceparent": traceparent, "tracestate": "vendor=1"}
    one = client.post("/v1/queues/emails/events", json={"item_key": "a", "data": {}}, headers=headers)
    assert one.status_code == 202, one.json
    batch = client.post(
        "/v1/queues/emails/events/batch",
        json={"events": [{"item_key": "b", "data": {}, "traceparent": traceparent}, {"item_key": "c", "data": {}}]},
        headers=auth(token),
    )
    assert batch.status_code == 200, batch.json
    odd = client.post(
        "/v1/queues/emails/events/batch",
        json={"events": [{"item_key": "d", "data": {}, "traceparent": 42, "tracestate": ["x"]}]},
        headers=auth(token),
    )
    assert odd.status_code == 200, odd.json
    claim = client.post("/v1/queues/emails/claims", json={"worker": "w", "limit": 10}, headers=auth(token))
    events = [e for lease in claim.json["leases"] for e in lease["events"]]
    assert len(events) == 4 and all("traceparent" not in e and "tracestate" not in e for e in events)


def test_batch_items_keep_their_own_context(client: Any, admin_token: str, token: str) -> None:
    from tests.conftest import auth

    client.put("/v1/queues/emails", json={"delivery": {"mode": "pull"}}, headers=auth(admin_token))
    own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    answer = client.post(
        "/v1/queues/emails/events/batch",
        json={
            "events": [
                {"item_key": "own", "data": {}, "traceparent": own, "tracestate": "congo=t61rcWkgMzE"},
                {"item_key": "inherits", "data": {}},
            ]
        },
        headers={**auth(token), "traceparent": CLIENT_TRACEPARENT},
    )
    assert answer.status_code == 200, answer.json
    claim = client.post("/v1/queues/emails/claims", json={"worker": "w", "limit": 10}, headers=auth(token))
    by_key = {e["item_key"]: e for lease in claim.json["leases"] for e in lease["events"]}
    assert by_key["own"]["traceparent"] == own and by_key["own"]["tracestate"] == "congo=t61rcWkgMzE"
    # Tracing off in this process: the request's context is kept as it came.
    assert by_key["inherits"]["traceparent"] == CLIENT_TRACEPARENT and "tracestate" not in by_key["inherits"]


def test_tracing_off_emits_nothing_and_hands_the_context_on(
    database_url: str, store: Store, otlp: OtlpReceiver
) -> None:
    admin_token, token = _tokens(store, "hooks")
    with running_receiver() as hooks, _serve(database_url, None) as url:
        _put_queue(url, admin_token, "hooks", {"mode": "webhook", "url": hooks.url, "timeout_seconds": 5})
        answer = _send_traced("POST", f"{url}/v1/queues/hooks/events", token, {"item_key": "quiet", "data": {}})
        assert answer.status_code == 202
        [received] = hooks.wait_for(1)
        wait_until(lambda: any(e["action"] == "delivered" for e in _timeline(url, token, "hooks", "quiet")))
        entries = _timeline(url, token, "hooks", "quiet")
        # serve stopped (it would have flushed its spans): nothing reached the collector
    assert otlp.requests == 0 and otlp.spans == []
    assert received.headers["traceparent"] == CLIENT_TRACEPARENT
    assert all("trace_id" not in e["details"] for e in entries)


def test_each_schedule_occurrence_starts_a_trace_linked_to_the_change(
    database_url: str, store: Store, otlp: OtlpReceiver, raw: Any
) -> None:
    with _serving_pull_queue(database_url, store, otlp, "digests") as (url, token):
        answer = _send_traced(
            "PUT",
            f"{url}/v1/queues/digests/schedules/daily",
            token,
            {"cron": "0 9 * * *", "timezone": "Europe/Paris", "data": {}},
        )
        assert answer.status_code == 201, answer.text
        [occurrence] = otlp.wait_named("create digests")

    # A trace of its own (no parent), linked to the change that made the schedule.
    assert occurrence.parent_span_id == "" and occurrence.trace_id != CLIENT_TRACEPARENT[3:35]
    assert occurrence.links == [(CLIENT_TRACEPARENT[3:35], CLIENT_TRACEPARENT[36:52])]
    assert occurrence.attributes["tickler.schedule_key"] == "daily"
    [(key, traceparent)] = raw.execute(
        "SELECT item_key, traceparent FROM tickler_event WHERE item_key LIKE 'daily@%'"
    ).fetchall()
    assert occurrence.attributes["tickler.item_key"] == key
    assert traceparent[:53] == f"00-{occurrence.trace_id}-{occurrence.span_id}-"
    [(kept,)] = raw.execute("SELECT traceparent FROM tickler_schedule WHERE schedule_key = 'daily'").fetchall()
    assert kept == CLIENT_TRACEPARENT


def test_the_dashboard_links_an_attempts_trace(app: Any, client: Any, admin_token: str, token: str) -> None:
    from tests.conftest import auth
    from tests.test_ui import sign_in

    client.put("/v1/queues/emails", json={"delivery": {"mode": "pull"}}, headers=auth(admin_token))
    client.post("/v1/queues/emails/events", json={"item_key": "linked", "data": {}}, headers=auth(token))
    [lease] = client.post("/v1/queues/emails/claims", json={"worker": "w"}, headers=auth(token)).json["leases"]
    attempt = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    acked = client.post(f"/v1/leases/{lease['lease_id']}/ack", headers={**auth(token), "traceparent": attempt})
    assert acked.status_code == 200
    [delivered] = [
        e
        for e in client.get("/v1/queues/emails/events/linked/timeline", headers=auth(token)).json["entries"]
        if e["action"] == "delivered"
    ]
    assert delivered["details"]["trace_id"] == "0af7651916cd43dd8448eb211c80319c"

    sign_in(client, admin_token)
    previous = app.config.get("TICKLER_TRACE_URL_TEMPLATE")
    try:
        app.config["TICKLER_TRACE_URL_TEMPLATE"] = "http://jaeger.example:16686/trace/{trace_id}"
        page = client.get("/ui/queues/emails/events/linked").get_data(as_text=True)
        assert 'href="http://jaeger.example:16686/trace/0af7651916cd43dd8448eb211c80319c"' in page
        app.config["TICKLER_TRACE_URL_TEMPLATE"] = ""
        page = client.get("/ui/queues/emails/events/linked").get_data(as_text=True)
        assert "0af7651916cd43dd8448eb211c80319c" in page and "jaeger.example" not in page
    finally:
        app.config["TICKLER_TRACE_URL_TEMPLATE"] = previous


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


SPANS_THEN_REPORT = """
import sys
from tickler.scheduler import tracing
from tickler.scheduler.tracing import TraceContext
parent = TraceContext.parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
with tracing.span("process", "q", parent=parent, active=True) as span:
    span.set(tickler__attempt=1)
    span.fail("boom")
    assert span.context is None and tracing.current_headers() == {}
tracing.record("settle", "q", 0, parent=parent)
print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
"""


def test_off_never_imports_opentelemetry() -> None:
    done = _python("import tickler.api, tickler.scheduler.dispatcher\n" + SPANS_THEN_REPORT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_asked_for_without_the_extra_installed_spans_are_no_ops() -> None:
    # opentelemetry made unimportable, as in an installation without the `otel` extra
    blocked = "import sys\nsys.modules['opentelemetry'] = None\n"
    done = _python(blocked + SPANS_THEN_REPORT, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9")
    assert done.returncode == 0, done.stderr
    assert "tracing_unavailable" in done.stdout + done.stderr
