"""The operations log (SPEC §7): each change to how tickler runs leaves exactly its entry, with
before and after values, written with the change; never a secret; GET /v1/audit pages it newest
first for admins; retention drops only old entries."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from flask.testing import FlaskClient

from tests.conftest import auth
from tests.test_ui import sign_in
from tickler.scheduler.store import Store
from tickler.scheduler.store.audit import EntryFilter


def entries_after(raw: psycopg.Connection[Any], last_id: int) -> list[dict[str, Any]]:
    rows = raw.execute(
        "SELECT actor, action, queue, before, after FROM tickler_operation_log WHERE id > %s ORDER BY id", [last_id]
    ).fetchall()
    return [dict(zip(("actor", "action", "queue", "before", "after"), row, strict=True)) for row in rows]


def last_id(raw: psycopg.Connection[Any]) -> int:
    [[found]] = raw.execute("SELECT coalesce(max(id), 0) FROM tickler_operation_log").fetchall()
    return int(found)


def _create(client: FlaskClient, token: str, store: Store | None = None) -> Any:
    return client.put("/v1/queues/jobs", json={}, headers=auth(token))


def _token_id(store: Store, name: str) -> int:
    [found] = [t.id for t in store.tokens.list() if t.principal == name]
    return found


# Each audited call: (setup, call, expected action, queue, before, after) — before and after as
# subsets of the entry's (None: the entry has none).
Call = Callable[[FlaskClient, str, Store], Any]
CASES: dict[str, tuple[Call, Call, str, str | None, dict[str, Any] | None, dict[str, Any] | None]] = {
    "queue created": (
        lambda c, t, s: None,
        _create,
        "queue.created",
        "jobs",
        None,
        {"delivery_mode": "pull", "lease_seconds": 30.0, "paused": False},
    ),
    "queue changed": (
        _create,
        lambda c, t, s: c.put("/v1/queues/jobs", json={"lease_seconds": 12, "max_attempts": 3}, headers=auth(t)),
        "queue.changed",
        "jobs",
        {"lease_seconds": 30.0, "max_attempts": 10},
        {"lease_seconds": 12.0, "max_attempts": 3},
    ),
    "queue paused": (
        _create,
        lambda c, t, s: c.post("/v1/queues/jobs/pause", headers=auth(t)),
        "queue.paused",
        "jobs",
        {"paused": False},
        {"paused": True},
    ),
    "queue resumed": (
        lambda c, t, s: (_create(c, t), c.post("/v1/queues/jobs/pause", headers=auth(t))),
        lambda c, t, s: c.post("/v1/queues/jobs/resume", headers=auth(t)),
        "queue.resumed",
        "jobs",
        {"paused": True},
        {"paused": False},
    ),
    "queue deleted": (
        _create,
        lambda c, t, s: c.delete("/v1/queues/jobs", headers=auth(t)),
        "queue.deleted",
        "jobs",
        {"delivery_mode": "pull"},
        {"cancelled": 0, "deleted_events": 0},
    ),
    "token created": (
        _create,  # a token may name only queues that exist
        lambda c, t, s: c.post("/v1/tokens", json={"name": "billing", "queues": ["jobs"]}, headers=auth(t)),
        "token.created",
        None,
        None,
        {"name": "billing", "queues": ["jobs"], "admin": False},
    ),
    "token revoked": (
        lambda c, t, s: s.tokens.create("billing", queues=["jobs"]),
        lambda c, t, s: c.delete(f"/v1/tokens/{_token_id(s, 'billing')}", headers=auth(t)),
        "token.revoked",
        None,
        {"name": "billing", "revoked_on": None},
        {"name": "billing"},
    ),
    "admin signed in": (
        lambda c, t, s: None,
        lambda c, t, s: sign_in(c, t),
        "dashboard.signed_in",
        None,
        None,
        None,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_audited_call_leaves_exactly_its_entry(
    case: str, client: FlaskClient, admin_token: str, store: Store, raw: psycopg.Connection[Any]
) -> None:
    setup, call, action, queue, before, after = CASES[case]
    setup(client, admin_token, store)
    start = last_id(raw)
    response = call(client, admin_token, store)
    assert response.status_code < 400
    [entry] = entries_after(raw, start)
    assert (entry["actor"], entry["action"], entry["queue"]) == ("ops", action, queue)
    for expected, found in ((before, entry["before"]), (after, entry["after"])):
        if expected is None:
            assert found is None
        else:
            assert {k: found[k] for k in expected} == expected


def test_a_call_that_changes_nothing_or_fails_leaves_no_entry(
    client: FlaskClient, admin_token: str, raw: psycopg.Connection[Any]
) -> None:
    _create(client, admin_token)
    start = last_id(raw)
    assert client.put("/v1/queues/jobs", json={}, headers=auth(admin_token)).status_code == 200
    assert client.post("/v1/queues/nope/pause", headers=auth(admin_token)).status_code == 404
    assert client.put("/v1/queues/jobs", json={"max_attempts": 0}, headers=auth(admin_token)).status_code == 400
    assert client.post("/v1/queues/jobs/resume", headers=auth(admin_token)).status_code == 200  # it runs
    # a pause with anything in its body or query string is refused before it pauses
    for bad in ({"data": b"{bad json"}, {"json": {"paused": "maybe"}}, {"query_string": {"foo": "1"}}):
        refused = client.post("/v1/queues/jobs/pause", headers=auth(admin_token), **bad)
        assert refused.status_code == 400, bad
        assert refused.mimetype == "application/problem+json"
    assert client.get("/v1/queues/jobs", headers=auth(admin_token)).json["paused"] is False
    assert entries_after(raw, start) == []


def test_pausing_a_paused_queue_changes_nothing_and_logs_nothing(
    client: FlaskClient, admin_token: str, raw: psycopg.Connection[Any]
) -> None:
    _create(client, admin_token)
    start = last_id(raw)
    for _ in range(2):
        assert client.post("/v1/queues/jobs/pause", headers=auth(admin_token)).json["paused"] is True
    assert [e["action"] for e in entries_after(raw, start)] == ["queue.paused"]


def test_no_entry_holds_a_secret_or_a_token(
    client: FlaskClient, admin_token: str, raw: psycopg.Connection[Any]
) -> None:
    hook = {"delivery": {"mode": "webhook", "url": "https://user:pw@example.com/hook?key=abc"}}
    created = client.put("/v1/queues/hooks", json=hook, headers=auth(admin_token)).json
    rotated = client.put("/v1/queues/hooks", json={"rotate_signing_secret": True}, headers=auth(admin_token)).json
    issued = client.post("/v1/tokens", json={"name": "svc", "queues": ["hooks"]}, headers=auth(admin_token)).json
    client.delete(f"/v1/tokens/{issued['id']}", headers=auth(admin_token))
    text = json.dumps([e for e in entries_after(raw, 0)], default=str)
    secrets = [admin_token, issued["token"], created["signing_secret"]]
    secrets.append(rotated["signing_secret"])
    for secret in secrets:
        assert secret and secret not in text
    for fragment in ("whsec_", "tkl_", "pw@", "key=abc"):
        assert fragment not in text
    [change] = [e for e in entries_after(raw, 0) if e["action"] == "queue.changed"]
    assert change["after"] == {"signing_secret": "(rotated)"}


def test_concurrent_changes_each_leave_their_entry(store: Store, raw: psycopg.Connection[Any]) -> None:
    from tickler.config import Settings
    from tickler.scheduler.store import QueueSettings

    names = [f"q{n}" for n in range(8)]
    start = last_id(raw)
    barrier = threading.Barrier(len(names))
    errors: list[BaseException] = []

    def work(name: str) -> None:
        try:
            barrier.wait()
            store.queues.put(name, QueueSettings(), Settings(), actor=name)
            for _ in range(3):
                store.queues.pause(name, actor=name)
                store.queues.put(name, QueueSettings(max_attempts=5), Settings(), actor=name)
                store.queues.resume(name, actor=name)
                store.queues.put(name, QueueSettings(max_attempts=6), Settings(), actor=name)
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    found = entries_after(raw, start)
    for name in names:
        mine = [e["action"] for e in found if e["actor"] == name]
        cycle = ["queue.paused", "queue.changed", "queue.resumed", "queue.changed"]
        assert mine == ["queue.created", *cycle * 3]
        assert all(e["queue"] == name for e in found if e["actor"] == name)


def test_retention_drops_only_old_entries(store: Store, raw: psycopg.Connection[Any]) -> None:
    now = datetime(2026, 11, 28, 12, tzinfo=UTC)
    for age_days in (400, 366, 364, 1):
        raw.execute(
            "INSERT INTO tickler_operation_log (at, actor, action) VALUES (%s, 'ops', 'queue.paused')",
            [now - timedelta(days=age_days)],
        )
    assert store.audit.prune(365, now=now) == 2
    kept = store.audit.page(EntryFilter(), limit=10)
    assert sorted((now - e.at).days for e in kept) == [1, 364]


def test_audit_pages_newest_first_with_filters(client: FlaskClient, admin_token: str, store: Store) -> None:
    for name in ("a", "b", "c"):
        client.put(f"/v1/queues/{name}", json={}, headers=auth(admin_token))
        client.post(f"/v1/queues/{name}/pause", headers=auth(admin_token))
    seen: list[dict[str, Any]] = []
    url = "/v1/audit?limit=2&actor=ops"
    while url:
        page = client.get(url, headers=auth(admin_token)).json
        seen += page["entries"]
        url = f"/v1/audit?limit=2&actor=ops&cursor={page['next_cursor']}" if page["next_cursor"] else ""
    assert [e["id"] for e in seen] == sorted((e["id"] for e in seen), reverse=True)
    assert [(e["action"], e["queue"]) for e in seen][:2] == [("queue.paused", "c"), ("queue.created", "c")]
    assert len(seen) == 6
    only_b = client.get("/v1/audit?queue=b&action=queue.paused", headers=auth(admin_token)).json["entries"]
    assert [(e["queue"], e["action"]) for e in only_b] == [("b", "queue.paused")]
    future = client.get("/v1/audit?since=2999-01-01T00:00:00Z", headers=auth(admin_token)).json
    assert future == {"entries": [], "next_cursor": None}


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("action=queue.exploded", "action"),
        ("since=yesterday", "since"),
        ("cursor=%21%21", "cursor"),
        ("cursor=bm90LWEtY3Vyc29y", "cursor"),
        ("limit=0", "limit"),
    ],
)
def test_bad_filters_are_400_problems(client: FlaskClient, admin_token: str, query: str, field: str) -> None:
    response = client.get(f"/v1/audit?{query}", headers=auth(admin_token))
    assert response.status_code == 400
    assert response.content_type == "application/problem+json"
    assert field in json.dumps(response.json)


def test_the_log_is_for_admins_only(client: FlaskClient, token: str) -> None:
    assert client.get("/v1/audit", headers=auth(token)).status_code == 403


@pytest.mark.parametrize(
    ("query", "field"), [("queue=No%20Such", "queue"), ("actor=a%00b", "actor"), ("queue=", "queue")]
)
def test_filters_a_queue_or_token_cannot_have_are_400_problems(
    client: FlaskClient, admin_token: str, query: str, field: str
) -> None:
    response = client.get(f"/v1/audit?{query}", headers=auth(admin_token))
    assert response.status_code == 400
    assert field in response.json["errors"]


def test_the_dispatchers_upkeep_prunes_by_the_setting_and_folds_the_forecast(
    store: Store, raw: psycopg.Connection[Any]
) -> None:
    from tickler.scheduler import upkeep

    for age_days in (40, 20):
        raw.execute(
            "INSERT INTO tickler_operation_log (at, actor, action) VALUES (now() - make_interval(days => %s),"
            " 'ops', 'queue.paused')",
            [age_days],
        )
    raw.execute(
        "INSERT INTO tickler_due_count (queue, hour, slot, n, minutes) VALUES"
        " ('q', '2026-01-01T00:00Z', 3, 0, array_fill(0::bigint, ARRAY[60]))"
    )
    upkeep.periodic(store, 30)()
    assert [e.at.date() for e in store.audit.page(EntryFilter(), limit=10)] == [
        (datetime.now(UTC) - timedelta(days=20)).date()
    ]
    assert raw.execute("SELECT count(*) FROM tickler_due_count").fetchone() == (0,)


def test_the_retention_setting_is_read_and_checked() -> None:
    from tickler.config import Settings, SettingsError

    assert Settings.from_env({}).audit_retention_days == 365
    assert Settings.from_env({"TICKLER_AUDIT_RETENTION_DAYS": "30"}).audit_retention_days == 30
    with pytest.raises(SettingsError, match="TICKLER_AUDIT_RETENTION_DAYS"):
        Settings.from_env({"TICKLER_AUDIT_RETENTION_DAYS": "0"})
