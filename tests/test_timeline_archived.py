"""The timeline says where a key's older history went once the archive job moved it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from flask.testing import FlaskClient

from tests.conftest import auth


@pytest.fixture
def archived_key(raw: psycopg.Connection[Any]) -> Iterator[None]:
    """A key whose two finished events were archived (as the archive job records it)."""
    run_id = raw.execute(
        """INSERT INTO tickler_archive_run (cutoff, location, state, event_count, timeline_count, event_id_sum,
                                            timeline_id_sum, written_on, deleted_on)
           VALUES (now(), '/data/archive', 'deleted', 2, 6, 3, 21, now(), now()) RETURNING id"""
    ).fetchone()[0]  # type: ignore[index]
    raw.execute(
        """INSERT INTO tickler_archived_key (queue, item_key, first_archive_id, archive_id, archived_through, events)
           VALUES ('emails', 'welcome:ana', %s, %s, '2026-01-31T10:00:00Z', 2)""",
        [run_id, run_id],
    )
    yield
    raw.execute("SET tickler.archiving = 'on'")
    raw.execute("TRUNCATE tickler_archived_key, tickler_archive_item, tickler_archive_run RESTART IDENTITY CASCADE")


def test_an_archived_key_points_to_its_history(
    client: FlaskClient, emails: str, token: str, archived_key: None
) -> None:
    response = client.get("/v1/queues/emails/events/welcome:ana/timeline", headers=auth(token))
    assert response.status_code == 200
    assert response.json["entries"] == []
    archived = response.json["archived"]
    assert archived["location"] == "/data/archive"
    assert archived["archived_through"] == "2026-01-31T10:00:00Z"
    assert archived["archived_events"] == 2
    assert archived["timeline"].endswith("queue=emails")


def test_a_live_key_has_no_archive_pointer_and_an_unknown_key_is_404(
    client: FlaskClient, emails: str, token: str, archived_key: None
) -> None:
    body = {"item_key": "fresh", "data": {}}
    assert client.post("/v1/queues/emails/events", json=body, headers=auth(token)).status_code == 202
    timeline = client.get("/v1/queues/emails/events/fresh/timeline", headers=auth(token)).json
    assert "archived" not in timeline and len(timeline["entries"]) == 1
    assert client.get("/v1/queues/emails/events/never/timeline", headers=auth(token)).status_code == 404


def test_get_of_an_archived_key_is_a_404_that_says_where(
    client: FlaskClient, emails: str, token: str, archived_key: None
) -> None:
    response = client.get("/v1/queues/emails/events/welcome:ana", headers=auth(token))
    assert response.status_code == 404
    assert response.mimetype == "application/problem+json"
    problem = response.json
    assert problem["type"] == "https://tickler.dev/problems/archived"
    assert problem["archived"]["location"] == "/data/archive"
    assert problem["archived"]["archived_through"] == "2026-01-31T10:00:00Z"
    assert problem["archived"]["timeline"].endswith("queue=emails")
    # a key never seen keeps the plain "not found"
    never = client.get("/v1/queues/emails/events/never", headers=auth(token))
    assert never.status_code == 404 and never.json["type"] == "https://tickler.dev/problems/not-found"
    assert "archived" not in never.json
    # once the key has a live event again, GET answers it
    body = {"item_key": "welcome:ana", "data": {}}
    assert client.post("/v1/queues/emails/events", json=body, headers=auth(token)).status_code == 202
    assert client.get("/v1/queues/emails/events/welcome:ana", headers=auth(token)).status_code == 200
