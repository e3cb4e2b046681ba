"""Schemathesis, run as its command line runs it (`st run --checks all`), against a real HTTP
server: every phase (examples, coverage, fuzzing, stateful), every check — no 5xx, every status,
content type, header and body as /openapi.json documents them, schema-valid requests accepted,
schema-invalid ones refused, only the documented methods allowed.

Bounded: a fixed number of examples per operation and a fixed seed, so a run is repeatable;
TICKLER_FUZZ_EXAMPLES and TICKLER_FUZZ_SEED explore further by hand.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from tests.conftest import auth
from tests.helpers import schedule
from tests.helpers_http import serving_app
from tickler.api import close_app, create_app
from tickler.config import Settings
from tickler.scheduler.store import Store

EXAMPLES = int(os.environ.get("TICKLER_FUZZ_EXAMPLES", "8"))
SEED = int(os.environ.get("TICKLER_FUZZ_SEED", "20261122"))

CONFIG = """\
[parameters]
# One queue that exists, so that requests reach the handlers instead of stopping at 404; a token
# made for the fuzzer to revoke, so that DELETE /v1/tokens/{{token_id}} cannot revoke its own.
"path.queue" = "emails"
"path.token_id" = {token_id}
# A cursor is opaque: only one handed out by a previous page is valid, and no schema can say so.
"query.cursor" = "{cursor}"
# 412 (If-Match names another version) is, like 409, about the event's state, not the request.
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "412", "429"]

# Rules JSON Schema cannot state, so schema-valid requests may break them (400): keys in a batch
# must differ; backoff.max_seconds must not be below backoff.initial_seconds (also as merged
# with the queue's current settings).
[[operations]]
include-path = "/v1/queues/{{queue}}/events/batch"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404", "409", "429"]

[[operations]]
include-path = "/v1/queues/{{queue}}"
include-method = "PUT"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404", "409", "429"]

# A new token's queues must exist; a search's due_until must not be before its due_from.
[[operations]]
include-path = "/v1/tokens"
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404", "409", "429"]
[[operations]]
include-path = "/v1/queues/{{queue}}/events"
include-method = "GET"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404", "409", "429"]
[[operations]]
include-path = "/v1/queues/{{queue}}/export"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404", "409", "429"]
# An erasure's queues must exist (400 names the unknown one), and its look-up takes exactly one
# of item_key and group_key: rules of the data and of two parameters, which no schema states.
[[operations]]
include-path = "/v1/erasures"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404", "429"]
"""


@pytest.fixture
def fuzz_target(client: FlaskClient, emails: str, store: Store, admin_token: str, tmp_path: Path) -> Path:
    """Events in `emails` (so reads, changes and searches find something), a webhook queue (so
    listings show one), and the runner's config."""
    for key in ("0", "a", "welcome:ana@example.com", "A"):
        assert schedule(client, admin_token, key, group_key="g", delay_seconds=60).status_code == 202
    hook = {"delivery": {"mode": "webhook", "url": "http://127.0.0.1:9/"}}
    assert client.put("/v1/queues/hooks", json=hook, headers=auth(admin_token)).status_code == 201
    decoy = store.tokens.issue("decoy", queues=["emails"], is_admin=False)[1]
    config = tmp_path / "schemathesis.toml"
    page = client.get("/v1/queues/emails/events?limit=1", headers=auth(admin_token)).json
    assert page is not None and page["next_cursor"]
    config.write_text(CONFIG.format(token_id=decoy.id, cursor=page["next_cursor"]))
    return config


@pytest.fixture
def fuzz_server(settings: Settings) -> Iterator[str]:
    """The API behind a real HTTP server, with long polls capped at half a second (the fuzzer
    would otherwise spend its run waiting on claims of up to 20 s)."""
    app = create_app(settings.with_overrides(max_wait_seconds=0.5), configure_logs=False)
    with serving_app(app) as url:
        yield url
    close_app(app)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_schemathesis_all_checks_is_clean(fuzz_server: str, fuzz_target: Path, admin_token: str) -> None:
    st = Path(sys.executable).with_name("st")
    command = [
        str(st),
        "--no-color",
        "--config-file",
        str(fuzz_target),
        "run",
        f"{fuzz_server}/openapi.json",
        "--checks",
        "all",
        "--max-examples",
        str(EXAMPLES),
        "--seed",
        str(SEED),
        "--workers",
        "1",
        "--no-shrink",
        "--header",
        f"Authorization: Bearer {admin_token}",
        "--request-timeout",
        "30",
        "--warnings",
        "off",
    ]
    result = subprocess.run(command, cwd=fuzz_target.parent, capture_output=True, text=True, timeout=500, check=False)
    output = result.stdout + result.stderr
    assert "Operations:" in output, output[-5_000:]
    assert result.returncode == 0, _failures(output)


def _failures(output: str) -> str:
    """The runner's failure report, with its long lines (request bodies) cut."""
    report = output[output.find("FAILURES") :] if "FAILURES" in output else output
    return "\n".join(line[:500] for line in report.splitlines())[:30_000]
