"""What a newcomer trips over first: the pipeline without PySpark, and the logs."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from tests.conftest import auth
from tests.helpers import kill_if_running, schedule
from tests.helpers_wait import wait_until
from tickler.scheduler.logs import configure_logging

# Runs the real `tickler` entry point in a fresh interpreter where PySpark cannot be imported,
# as after `make serve` (which installs the service alone).
WITHOUT_PYSPARK = """
import sys

class Hide:
    # Every finder answers for PySpark as when it is not installed: no spec.
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name == "pyspark" or name.startswith("pyspark."):
            return None
        return self.finder.find_spec(name, path, target)

    def __getattr__(self, attribute):
        return getattr(self.finder, attribute)

sys.meta_path[:] = [Hide(finder) for finder in sys.meta_path]
from tickler.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_the_pipeline_without_pyspark_says_what_to_install_in_one_line(database_url: str) -> None:
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_PYSPARK, "pipeline", "report"],
        cwd=root,
        env={"PATH": "/usr/bin:/bin", "TICKLER_DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "make install" in lines[0] and "whl[pipeline]" in lines[0]


def test_apscheduler_routine_lines_are_silenced_and_its_warnings_kept() -> None:
    configure_logging("INFO")
    chatter = logging.getLogger("apscheduler.executors.default")
    assert not chatter.isEnabledFor(logging.INFO)
    assert chatter.isEnabledFor(logging.WARNING)
    assert logging.getLogger("tickler.http").isEnabledFor(logging.INFO)


def test_serve_started_in_the_background_stops_on_sigint(database_url: str, tmp_path: Path) -> None:
    """`tickler serve &` starts with SIGINT ignored; serve must still stop on it, and say where it
    serves in a JSON log line like every other."""
    tickler = Path(sys.executable).with_name("tickler")
    env = {**os.environ, "TICKLER_DATABASE_URL": database_url, "TICKLER_DATA_DIR": str(tmp_path)}
    log_path = tmp_path / "serve.log"

    def serving() -> dict[str, object] | None:
        for line in log_path.read_text().splitlines():
            entry = json.loads(line)  # every line is JSON
            if entry.get("event") == "serving":
                return dict(entry)
        return None

    with log_path.open("w") as log:
        process = subprocess.Popen(
            [str(tickler), "serve", "--port", "0"],
            env=env,
            stderr=log,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # what `&` does
        )
    try:
        entry = wait_until(serving, timeout=60, what=lambda: log_path.read_text()[-2000:])
        assert str(entry["url"]).startswith("http://127.0.0.1:"), entry
        # where to point a browser, and where the data lives (the server and database, no password)
        assert entry["dashboard"] == f"{entry['url']}/ui/" and entry["docs"] == f"{entry['url']}/docs", entry
        assert entry["api"] == f"{entry['url']}/v1" and "/tickler_test_" in str(entry["database"]), entry
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:
        kill_if_running(process)


def test_admins_read_a_webhook_queues_signing_secret_and_the_read_is_logged(
    client: FlaskClient, admin_token: str, token: str, emails: str, capsys: pytest.CaptureFixture[str]
) -> None:
    hook = {"delivery": {"mode": "webhook", "url": "http://127.0.0.1:9/hooks"}}
    created = client.put("/v1/queues/reminders", json=hook, headers=auth(admin_token)).json
    again = client.put("/v1/queues/reminders", json=hook, headers=auth(admin_token)).json
    assert created is not None and again is not None and "signing_secret" not in again  # shown once

    configure_logging("INFO")
    response = client.get("/v1/queues/reminders/signing-secret", headers=auth(admin_token))
    assert response.status_code == 200 and response.json is not None
    assert response.json["signing_secret"] == created["signing_secret"]
    audit = [json.loads(line) for line in capsys.readouterr().err.splitlines() if "signing_secret_read" in line]
    assert audit and audit[0]["actor"] == "ops" and audit[0]["queue"] == "reminders"
    assert created["signing_secret"] not in json.dumps(audit)  # the secret itself is never logged

    assert client.get("/v1/queues/reminders/signing-secret", headers=auth(token)).status_code == 403
    assert client.get("/v1/queues/emails/signing-secret", headers=auth(admin_token)).status_code == 404
    assert client.get("/v1/queues/nothing/signing-secret", headers=auth(admin_token)).status_code == 404


def test_timeline_details_spell_times_with_z(client: FlaskClient, admin_token: str, emails: str) -> None:
    assert schedule(client, admin_token, "k").status_code == 202
    claimed = client.post("/v1/queues/emails/claims", json={"worker": "w"}, headers=auth(admin_token)).json
    assert claimed is not None and claimed["leases"]
    lease_id = claimed["leases"][0]["lease_id"]
    client.post(f"/v1/leases/{lease_id}/nack", json={"error": "boom"}, headers=auth(admin_token))
    timeline = client.get("/v1/queues/emails/events/k/timeline", headers=auth(admin_token)).json
    assert timeline is not None
    times = [v for e in timeline["entries"] for k, v in e["details"].items() if k.endswith(("_at", "_on"))]
    assert times and all(isinstance(t, str) and t.endswith("Z") for t in times if t is not None), times


def test_metrics_name_their_charset_once(client: FlaskClient) -> None:
    content_type = client.get("/metrics").headers["Content-Type"]
    assert content_type.startswith("text/plain") and content_type.count("charset") == 1, content_type


def test_reports_and_rejects_of_the_pipeline_are_ignored_by_git() -> None:
    ignored = (Path(__file__).resolve().parents[1] / ".gitignore").read_text().splitlines()
    assert "report/" in ignored and "*.rejects.csv" in ignored


def test_tickler_version_imports_neither_the_store_nor_the_app() -> None:
    """What makes every command slow to start is what it imports: --version needs none of it."""
    program = (
        "import sys; from tickler.cli import main; main(['--version']); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'sqlalchemy', 'psycopg', 'flask', 'structlog'}))"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    version_line, imported = done.stdout.splitlines()
    assert version_line.startswith("tickler ") and imported == "[]", done.stdout
