"""`tickler --version`, `tickler queues ...` and `tickler events ...` as real processes against the
embedded database of a running `tickler serve`; and no command creates a database by mistake."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests

from tests.helpers_wait import wait_until
from tests.test_cli_embedded import ROOT, Serve, _env, _free_port, _stop_leftover_postgres, _tickler

# An embedded PostgreSQL of its own, whatever TICKLER_TEST_DATABASE_URL names.
pytestmark = pytest.mark.own_server


def run(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_tickler(*args), cwd=ROOT, env=_env(data_dir), capture_output=True, text=True, timeout=60)


def ok(data_dir: Path, *args: str) -> str:
    done = run(data_dir, *args)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def as_json(data_dir: Path, *args: str) -> Any:
    return json.loads(ok(data_dir, *args, "--json"))


class Running:
    def __init__(self, data_dir: Path, serve: Serve, token: str) -> None:
        self.data_dir, self.serve, self.headers = data_dir, serve, {"Authorization": f"Bearer {token}"}

    def http(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        return requests.request(method, f"{self.serve.url}{path}", headers=self.headers, timeout=30, **kwargs)

    def dead(self, item_key: str) -> None:
        scheduled = self.http(
            "POST", "/v1/queues/emails/events", json={"item_key": item_key, "data": {}, "max_attempts": 1}
        )
        assert scheduled.status_code == 202, scheduled.text
        leases = self.http("POST", "/v1/queues/emails/claims", json={"worker": "w", "limit": 10}).json()["leases"]
        for lease in leases:
            assert self.http("POST", f"/v1/leases/{lease['lease_id']}/nack", json={"error": "boom"}).status_code == 200


@pytest.fixture(scope="module")
def running() -> Iterator[Running]:
    data_dir = Path(tempfile.mkdtemp(prefix="tkl-ops-"))
    serve = Serve(data_dir, _free_port())
    try:
        serve.wait_ready()
        token = ok(data_dir, "token", "create", "ops", "--admin").strip()
        here = Running(data_dir, serve, token)
        assert here.http("PUT", "/v1/queues/emails", json={}).status_code == 201
        yield here
    finally:
        serve.stop()
        _stop_leftover_postgres(data_dir)
        subprocess.run(["rm", "-rf", str(data_dir)], check=False)


def test_version() -> None:
    done = subprocess.run(_tickler("--version"), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("tickler "), done


@pytest.mark.parametrize(
    "args",
    [
        ("queues", "list"),
        ("events", "list", "emails"),
        ("schedules", "list", "emails"),
        ("token", "list"),
        ("token", "create", "x", "--admin"),
        ("worker",),
        ("pipeline", "report", "--out", "report"),
    ],
)
def test_no_database_is_created_by_mistake(args: tuple[str, ...]) -> None:
    with tempfile.TemporaryDirectory(prefix="tkl-none-") as empty:
        where = Path(empty) / "data"
        done = run(where, *args)
        assert done.returncode == 2, done
        assert str(where.resolve()) in done.stderr and done.stdout == ""
        assert not where.exists()  # nothing was created there


def test_queues_list_show_pause_resume(running: Running) -> None:
    table = ok(running.data_dir, "queues", "list")
    header, *lines = table.splitlines()
    assert header.split() == ["QUEUE", "MODE", "STATE", "PENDING", "DUE", "IN_FLIGHT", "DEAD", "OLDEST_DUE"]
    assert any(line.split()[:3] == ["emails", "pull", "active"] for line in lines), table
    # Nothing due: no age, said the same way by `list` and `show` ("-", not "0s").
    idle = [line.split() for line in lines if line.split()[4] == "0"]
    assert idle and all(columns[-1] == "-" for columns in idle), table
    assert re.search(r"^oldest due\s+-$", ok(running.data_dir, "queues", "show", idle[0][0]), re.MULTILINE)
    listed = as_json(running.data_dir, "queues", "list")
    emails = next(q for q in listed["queues"] if q["name"] == "emails")
    assert emails["paused"] is False and set(emails["counts"]) >= {"pending", "due", "in_flight", "dead"}

    paused = as_json(running.data_dir, "queues", "pause", "emails")
    assert paused["paused"] is True
    # the server drops its cached copy of the queue on the change's NOTIFY
    wait_until(lambda: running.http("GET", "/v1/queues/emails").json()["paused"] is True, timeout=30)
    shown = ok(running.data_dir, "queues", "show", "emails")
    assert "paused" in shown and "max attempts" in shown
    assert as_json(running.data_dir, "queues", "resume", "emails")["paused"] is False
    wait_until(lambda: running.http("GET", "/v1/queues/emails").json()["paused"] is False, timeout=30)

    missing = run(running.data_dir, "queues", "show", "nope")
    assert missing.returncode == 1 and "nope" in missing.stderr


def test_events_list_show_timeline_retry_cancel(running: Running) -> None:
    running.dead("cli:dead:1")
    running.dead("cli:dead:2")
    dead = as_json(running.data_dir, "events", "list", "emails", "--status", "dead", "--prefix", "cli:dead:")
    assert [e["item_key"] for e in dead["events"]] == ["cli:dead:1", "cli:dead:2"]
    assert dead["next_cursor"] is None
    table = ok(running.data_dir, "events", "list", "emails", "--prefix", "cli:dead:", "--limit", "1")
    assert "cli:dead:1" in table and "dead" in table and "--cursor" in table.splitlines()[-1]

    shown = as_json(running.data_dir, "events", "show", "emails", "cli:dead:1")
    assert (shown["status"], shown["last_error"]) == ("dead", "boom")
    retried = as_json(running.data_dir, "events", "retry", "emails", "cli:dead:1", "--actor", "cli:test")
    assert retried["status"] == "pending" and retried["id"] == shown["id"]
    timeline = as_json(running.data_dir, "events", "timeline", "emails", "cli:dead:1")
    assert (timeline["entries"][-1]["action"], timeline["entries"][-1]["actor"]) == ("retried", "cli:test")
    people = ok(running.data_dir, "events", "timeline", "emails", "cli:dead:1")
    assert people.splitlines()[0].split()[:3] == ["AT", "(UTC)", "ACTION"] and "retried" in people
    again = run(running.data_dir, "events", "retry", "emails", "cli:dead:1")
    assert again.returncode == 1 and "open event" in again.stderr

    assert ok(running.data_dir, "events", "retry", "emails", "--prefix", "cli:dead:").strip() == "retried 1"
    cancelled = as_json(running.data_dir, "events", "cancel", "emails", "cli:dead:1", "--reason", "test")
    assert cancelled["status"] == "cancelled"
    assert as_json(running.data_dir, "events", "cancel", "emails", "--prefix", "cli:dead:") == {"cancelled": 1}
    url = f"/v1/queues/emails/events/{quote('cli:dead:2', safe='')}"
    assert running.http("GET", url).json()["status"] == "cancelled"


def test_bad_input_is_refused(running: Running) -> None:
    for args in (
        ("events", "list", "emails", "--status", "lost"),
        ("events", "show", "emails", "a/b"),
        ("events", "retry", "emails", "k", "--at", "tomorrow"),
        ("events", "retry", "emails", "k", "--at", "2030-01-01T00:00:00Z", "--delay", "5"),
        ("events", "retry", "emails"),  # neither key nor filter: a usage mistake
        ("events", "cancel", "emails", "k", "--group", "g"),  # both
    ):
        done = run(running.data_dir, *args)
        assert done.returncode == 2 and done.stdout == "", (args, done)
    for args in (("events", "list", "nope"),):
        done = run(running.data_dir, *args)
        assert done.returncode == 1 and done.stderr.startswith("tickler: "), (args, done)


def test_schedules_list_and_show(running: Running) -> None:
    body = {"cron": "0 9 * * *", "timezone": "Europe/Lisbon", "data": {"report": "daily"}}
    created = running.http("PUT", "/v1/queues/emails/schedules/daily-report", json=body)
    assert created.status_code == 201, created.text
    listed = as_json(running.data_dir, "schedules", "list", "emails")
    [daily] = [s for s in listed["schedules"] if s["schedule_key"] == "daily-report"]
    assert (daily["cron"], daily["timezone"], len(daily["next_occurrences"])) == ("0 9 * * *", "Europe/Lisbon", 5)
    assert daily == created.json() | {"last_enqueued": daily["last_enqueued"]}
    table = ok(running.data_dir, "schedules", "list", "emails")
    assert table.splitlines()[0].split()[:3] == ["SCHEDULE_KEY", "CRON", "TIMEZONE"] and "daily-report" in table
    shown = ok(running.data_dir, "schedules", "show", "emails", "daily-report")
    assert "Europe/Lisbon" in shown and "next_occurrences" in shown
    missing = run(running.data_dir, "schedules", "show", "emails", "weekly")
    assert missing.returncode == 1 and "weekly" in missing.stderr
