"""Property-based requests generated from /openapi.json: whatever they hold, never a 5xx, and
every error is problem+json."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from tests.conftest import auth
from tests.helpers import PROBLEM, schedule

# Examples per operation and mode: enough to reach every field, small enough to stay fast.
EXAMPLES = {GenerationMode.POSITIVE: 12, GenerationMode.NEGATIVE: 6}


@pytest.fixture
def seeded(client: FlaskClient, emails: str, admin_token: str) -> str:
    """Some events in `emails`, so that reads, changes and searches find something."""
    for key in ("0", "a", "welcome:ana@example.com", "A"):
        schedule(client, admin_token, key, group_key="g", delay_seconds=60)
    return admin_token


def test_generated_requests_never_fail_on_the_server(app: Flask, seeded: str) -> None:
    schema = schemathesis.openapi.from_wsgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15
    failures: list[str] = []
    for operation in operations:
        for mode, examples in EXAMPLES.items():
            params = {"queue": "emails"} if "{queue}" in operation.path else {}
            strategy = st.one_of(
                operation.as_strategy(mode, path_parameters=params, headers=auth(seeded)),
                operation.as_strategy(mode, headers=auth(seeded)),
            )
            try:
                _run(strategy, examples, failures)
            except Unsatisfiable:
                # An operation with nothing to get wrong (no parameters, no body) has no negative cases.
                assert mode == GenerationMode.NEGATIVE, operation.label
    assert not failures, "\n".join(failures[:20])


def _run(strategy: Any, examples: int, failures: list[str]) -> None:
    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )
    @given(case=strategy)
    def check(case: Any) -> None:
        response = case.call()
        where = f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:300]}"
        if response.status_code >= 500:
            failures.append(where)
        elif response.status_code >= 400 and response.headers.get("content-type", [""])[0] != PROBLEM:
            failures.append("not problem+json: " + where)

    check()
