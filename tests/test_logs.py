"""Logs people and machines can read: console or JSON lines (TICKLER_LOG_FORMAT), gunicorn's own
lines in the same format, delivery failures that name their key (a dead event at error), and
`serve` saying where its data lives and where to point a browser."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from flask.testing import FlaskClient

from tests.helpers_wait import wait_until
from tests.receiver import running_receiver
from tests.test_webhooks import webhook_queue
from tickler.scheduler.dispatcher import Dispatcher
from tickler.scheduler.logs import configure_logging, log_handler
from tickler.scheduler.models import NewEvent
from tickler.scheduler.store import Store


def _render(log_format: str) -> str:
    stream = io.StringIO()
    handler = log_handler(log_format, stream)
    logger = logging.getLogger("tickler.test_logs")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("a stdlib line")
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    return stream.getvalue()


def test_json_is_one_object_per_line_and_console_is_for_people() -> None:
    entry = json.loads(_render("json"))
    assert (entry["event"], entry["level"], entry["logger"]) == ("a stdlib line", "warning", "tickler.test_logs")
    console = _render("console")
    assert "a stdlib line" in console and not console.startswith("{")
    assert "warning" in console.lower()


def test_the_format_follows_the_terminal_unless_chosen() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert not _render_to(Terminal(), "").startswith("{")
    assert _render_to(io.StringIO(), "").startswith("{")  # a file or a pipe: JSON
    assert _render_to(Terminal(), "json").startswith("{")


def _render_to(stream: io.StringIO, log_format: str) -> str:
    record = logging.LogRecord("tickler.x", logging.INFO, __file__, 1, "hello", None, None)
    log_handler(log_format, stream).emit(record)
    return stream.getvalue()


def test_the_bare_address_leads_to_the_dashboard(client: FlaskClient) -> None:
    response = client.get("/")
    assert response.status_code == 302 and response.headers["Location"] == "/ui/"


def test_failed_deliveries_name_their_key_and_the_last_attempt_is_an_error(
    store: Store, webhook_dispatcher: Dispatcher, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("INFO", "json")
    seen: list[dict[str, object]] = []

    def failures() -> list[dict[str, object]]:
        seen.extend(json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{"))
        return [entry for entry in seen if entry["event"] == "delivery_failed"]

    with running_receiver([(500, {}), (500, {})]) as receiver:
        queue, _ = webhook_queue(store, receiver, max_attempts=2)
        store.events.schedule(queue, NewEvent(item_key="welcome:ana", data={}), actor="signup")
        first, last = wait_until(lambda: len(failures()) >= 2 and failures(), timeout=30)
    assert (first["item_key"], first["level"], first["dead"]) == ("welcome:ana", "warning", False)
    assert (last["item_key"], last["level"], last["dead"]) == ("welcome:ana", "error", True)


def test_gunicorn_lines_come_out_in_ticklers_format(database_url: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TICKLER_")}
    env |= {"TICKLER_DATABASE_URL": database_url, "TICKLER_LOG_FORMAT": "json", "TICKLER_MIGRATE_ON_START": "false"}
    log_path = tmp_path / "gunicorn.log"
    gunicorn = Path(sys.executable).with_name("gunicorn")
    command = [str(gunicorn), "--logger-class", "tickler.api.gunicorn_logging.Logger", "--bind", "127.0.0.1:0"]
    with log_path.open("w") as log:
        process = subprocess.Popen([*command, "--workers", "1", "tickler.wsgi:app"], env=env, stderr=log)
    try:

        def listening() -> str | None:
            for line in log_path.read_text().splitlines():
                if "Listening at: " in line:
                    return str(json.loads(line)["event"]).split("Listening at: ")[1].split()[0]
            return None

        url = wait_until(listening, timeout=60, what=lambda: log_path.read_text())
        wait_until(lambda: _answers(url), timeout=60, what=lambda: log_path.read_text())
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    lines = log_path.read_text().splitlines()
    entries = [json.loads(line) for line in lines]  # every line is JSON, gunicorn's included
    loggers = {entry["logger"] for entry in entries}
    assert "gunicorn.error" in loggers, loggers
    assert any(str(entry["event"]).startswith("Booting worker") for entry in entries)


def _answers(url: str) -> bool:
    try:
        return requests.get(f"{url}/healthz", timeout=2).status_code == 200
    except requests.ConnectionError:
        return False
