"""Erasing a subject (SPEC §12) over HTTP: what is erased (open events cancelled and fenced, history
and timeline rewritten, no value left in a dump), what stays (counts), the log and its look-ups,
and the request's validation."""

from __future__ import annotations

import importlib.util
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from flask.testing import FlaskClient

from tests.conftest import auth
from tests.helpers import assert_problem, key_url, schedule
from tickler.scheduler.db import libpq_url
from tickler.scheduler.erasing import Eraser, Hasher

# A value that appears nowhere but in the subject's rows: a dump that holds it holds the subject.
MARK = "zqxanna"
EMAIL = f"{MARK}@example.com"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def erase(client: FlaskClient, admin_token: str, **body: Any) -> Any:
    return client.post("/v1/erasures", json={"reason": "subject asked", **body}, headers=auth(admin_token))


def claim(client: FlaskClient, token: str, limit: int = 100) -> list[dict[str, Any]]:
    response = client.post("/v1/queues/emails/claims", json={"worker": "w", "limit": limit}, headers=auth(token))
    assert response.status_code == 200, response.json
    leases: list[dict[str, Any]] = response.json["leases"]
    return leases


def lease_of(leases: list[dict[str, Any]], item_key: str) -> str:
    [lease_id] = [lease["lease_id"] for lease in leases if lease["events"][0]["item_key"] == item_key]
    return str(lease_id)


def run_erasures(engine: sa.Engine) -> list[int]:
    return Eraser(engine, Hasher(engine)).run_unfinished()


def counts(client: FlaskClient, admin_token: str) -> dict[str, int]:
    got: dict[str, int] = client.get("/v1/queues/emails", headers=auth(admin_token)).json["counts"]
    return got


def subject_history(client: FlaskClient, token: str, admin_token: str) -> dict[str, str]:
    """The subject's events in every state, and another subject's: {what: item_key}."""
    keys = {
        "delivered": f"welcome:{EMAIL}",
        "dead": f"reminder:{EMAIL}",
        "in_flight": f"digest:{EMAIL}",
        "failed_once": f"survey:{EMAIL}",
        "pending": f"later:{EMAIL}",
        "other": "welcome:bob@example.com",
    }
    data = {"email": EMAIL, "name": MARK}
    for what, key in keys.items():
        fields: dict[str, Any] = {"data": data if what != "other" else {"email": "bob@example.com"}}
        if what != "other":
            fields["group_key"] = EMAIL if what in {"delivered", "pending"} else None
        if what == "dead":
            fields["max_attempts"] = 1
        if what == "pending":
            fields["delay_seconds"] = 3600
        response = client.post(
            "/v1/queues/emails/events",
            json={"item_key": key, **{k: v for k, v in fields.items() if v is not None}},
            headers={**auth(token), "traceparent": TRACEPARENT},
        )
        assert response.status_code == 202, response.json
    leases = claim(client, token)
    by_key = {event["item_key"]: lease["lease_id"] for lease in leases for event in lease["events"]}
    assert keys["pending"] not in by_key and keys["in_flight"] in by_key  # not due yet; held from now on
    nack = {"error": f"smtp said no to {EMAIL}", "retry_in_seconds": 3600}
    for what, finish, body in (
        ("dead", "nack", nack),
        ("failed_once", "nack", nack),
        ("delivered", "ack", None),
        ("other", "ack", None),
    ):
        response = client.post(f"/v1/leases/{by_key[keys[what]]}/{finish}", json=body, headers=auth(token))
        assert response.status_code == 200, (what, response.json)
    return keys


def dump(database_url: str) -> str:
    """pg_dump of the whole database (data and schema), as an operator would take it."""
    # The embedded server's pg_dump (16: it dumps a 15 too), found without importing pgserver,
    # whose import warns where XDG_RUNTIME_DIR is unset.
    spec = importlib.util.find_spec("pgserver")
    assert spec is not None and spec.origin is not None
    pg_dump = Path(spec.origin).parent / "pginstall" / "bin" / "pg_dump"
    done = subprocess.run([str(pg_dump), "--no-owner", libpq_url(database_url)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_an_erased_subject_is_gone_from_events_history_timeline_and_a_dump(
    client: FlaskClient,
    emails: str,
    token: str,
    admin_token: str,
    engine: sa.Engine,
    database_url: str,
    raw: psycopg.Connection[Any],
) -> None:
    keys = subject_history(client, token, admin_token)
    in_flight = [lease for lease in claim(client, token) if lease["events"][0]["item_key"] == keys["in_flight"]]
    assert not in_flight  # it is held by its first lease, still live
    [[in_flight_lease, in_flight_event_id]] = raw.execute(
        "SELECT lease_id::text, id FROM tickler_event WHERE item_key = %s", [keys["in_flight"]]
    ).fetchall()
    assert MARK in dump(database_url)
    before = counts(client, admin_token)

    response = erase(client, admin_token, group_key=EMAIL, item_key_prefix=f"reminder:{MARK}")
    assert response.status_code == 202, response.json
    erasure = response.json
    assert erasure["status"] == "pending" and erasure["requested_by"] == "ops" and erasure["finished_at"] is None
    assert response.headers["Location"] == f"/v1/erasures/{erasure['id']}"
    # logged pending: nothing is erased by the API process itself
    assert client.get(key_url(keys["pending"]), headers=auth(token)).status_code == 200

    item_keys = [keys["in_flight"], keys["failed_once"]]
    item_key_erasure = erase(client, admin_token, item_keys=item_keys, queues=["emails"]).json
    assert run_erasures(engine) == [erasure["id"]]
    # the other took a lease away: it waits for the lease's end, when its holder stops sending
    waiting = client.get(f"/v1/erasures/{item_key_erasure['id']}", headers=auth(admin_token)).json
    assert waiting["status"] == "running" and waiting["counts"]["open_events"] == 2
    [[lease_ends, recorded]] = raw.execute(
        "SELECT e.lease_expires_on, r.leases_end_at FROM tickler_event_history AS e, tickler_erasure AS r"
        " WHERE e.id = %s AND r.id = %s",
        [in_flight_event_id, item_key_erasure["id"]],
    ).fetchall()
    assert lease_ends is None and recorded is not None and recorded > datetime.now(UTC)
    assert run_erasures(engine) == []  # still held
    raw.execute(
        "UPDATE tickler_erasure SET leases_end_at = now() - interval '1 minute' WHERE id = %s", [item_key_erasure["id"]]
    )
    assert run_erasures(engine) == [item_key_erasure["id"]]

    done = client.get(f"/v1/erasures/{erasure['id']}", headers=auth(admin_token)).json
    assert done["status"] == "done" and done["finished_at"] and done["reason"] == "subject asked"
    # the group's delivered, failed-once and pending events, and the dead one by prefix
    assert done["counts"]["open_events"] == 1  # pending
    assert done["counts"]["finished_events"] == 2  # delivered and dead
    assert done["counts"]["timeline_entries"] >= 3 and done["counts"]["archive_rows"] == 0
    assert done["note"] is None  # no archive: nothing more to rewrite
    in_flight_done = client.get(f"/v1/erasures/{item_key_erasure['id']}", headers=auth(admin_token)).json
    assert in_flight_done["counts"]["open_events"] == 2

    # the lease in flight is fenced: its holder can no longer finish it
    assert client.post(f"/v1/leases/{in_flight_lease}/ack", headers=auth(token)).status_code == 409
    assert client.post(f"/v1/leases/{in_flight_lease}/nack", json={}, headers=auth(token)).status_code == 409
    # reading by the original key or group finds nothing
    for what in ("delivered", "dead", "in_flight", "failed_once", "pending"):
        assert client.get(key_url(keys[what]), headers=auth(token)).status_code == 404, what
        assert client.get(key_url(keys[what], suffix="/timeline"), headers=auth(token)).status_code == 404, what
    for query in (f"group_key={EMAIL}", f"item_key_prefix=welcome:{MARK}", "status=cancelled"):
        found = client.get(f"/v1/queues/emails/events?{query}", headers=auth(token)).json["events"]
        assert not [event for event in found if MARK in str(event)], query
    # the other subject is untouched
    assert client.get(key_url(keys["other"]), headers=auth(token)).json["data"] == {"email": "bob@example.com"}
    # counts move only from open to cancelled; delivered, dead and the total stay
    after = counts(client, admin_token)
    assert after["delivered"] == before["delivered"] and after["dead"] == before["dead"]
    assert after["cancelled"] == before["cancelled"] + 3
    assert sum(after.values()) == sum(before.values())
    assert MARK not in dump(database_url)

    # the timeline of a hashed key ends with `erased`, written by the admin
    hasher = Hasher(engine)
    timeline = client.get(key_url(hasher(keys["pending"]), suffix="/timeline"), headers=auth(admin_token))
    assert timeline.status_code == 200, timeline.json
    entries = timeline.json["entries"]
    assert [entry["action"] for entry in entries][-2:] == ["cancelled", "erased"]
    assert entries[-1]["actor"] == "ops" and entries[-2]["details"]["reason"] == "erased"


def test_a_recurring_schedule_of_the_subject_is_deleted_with_its_timeline_and_occurrence(
    client: FlaskClient, emails: str, token: str, admin_token: str, engine: sa.Engine, database_url: str
) -> None:
    """A schedule holds the subject's group and payload for every occurrence to come: erasing the
    group (or a prefix covering its occurrences' keys) deletes it, so none is enqueued again."""
    schedules = {
        f"{MARK}-weekly": {"group_key": EMAIL, "data": {"email": EMAIL}},
        f"{MARK}-monthly": {"data": {"email": EMAIL}},
        "bob-weekly": {"group_key": "bob@example.com", "data": {"email": "bob@example.com"}},
    }
    for key, fields in schedules.items():
        body = {"cron": "0 9 * * 1", "timezone": "UTC", **fields}
        response = client.put(f"/v1/queues/emails/schedules/{key}", json=body, headers=auth(token))
        assert response.status_code == 201, response.json
    pending = client.get("/v1/queues/emails/events", headers=auth(token)).json["events"]
    assert len(pending) == 3  # each schedule's next occurrence waits as a pending event

    assert erase(client, admin_token, group_key=EMAIL).status_code == 202
    assert erase(client, admin_token, item_key_prefix=f"{MARK}-monthly@").status_code == 202
    assert len(run_erasures(engine)) == 2

    for key in (f"{MARK}-weekly", f"{MARK}-monthly"):
        assert client.get(f"/v1/queues/emails/schedules/{key}", headers=auth(token)).status_code == 404
        assert client.get(key_url(key, suffix="/timeline"), headers=auth(token)).status_code == 404
    # another subject's schedule stays, with its next occurrence
    assert client.get("/v1/queues/emails/schedules/bob-weekly", headers=auth(token)).status_code == 200
    left = client.get("/v1/queues/emails/events?status=pending", headers=auth(token)).json["events"]
    assert [e["item_key"].split("@")[0] for e in left] == ["bob-weekly"]
    # nothing of the two schedules, their occurrences or their timelines remains
    assert MARK not in dump(database_url)


def test_the_log_answers_by_value_without_holding_it(
    client: FlaskClient, emails: str, token: str, admin_token: str, engine: sa.Engine, raw: psycopg.Connection[Any]
) -> None:
    assert schedule(client, token, f"welcome:{EMAIL}", group_key=EMAIL).status_code == 202
    assert schedule(client, token, f"promo:{EMAIL}").status_code == 202
    by_group = erase(client, admin_token, group_key=EMAIL).json
    by_prefix = erase(client, admin_token, item_key_prefix=f"promo:{MARK}").json
    run_erasures(engine)

    def looked_up(query: str) -> list[int]:
        response = client.get(f"/v1/erasures?{query}", headers=auth(admin_token))
        assert response.status_code == 200, response.json
        return [erasure["id"] for erasure in response.json["erasures"]]

    assert looked_up(f"group_key={EMAIL}") == [by_group["id"]]
    assert looked_up(f"item_key=welcome:{EMAIL}") == [by_group["id"]]  # met through its group
    assert looked_up(f"item_key=promo:{EMAIL}") == [by_prefix["id"]]  # met through the prefix
    assert looked_up("item_key=welcome:bob@example.com") == []
    log = raw.execute("SELECT r.*, v.* FROM tickler_erasure AS r LEFT JOIN tickler_erased_value AS v ON true")
    log_text = str(log.fetchall())
    assert MARK not in log_text
    assert raw.execute("SELECT count(*) FROM tickler_erasure_work").fetchone() == (0,)


def test_an_erasure_request_is_one_entry_of_the_operations_log_without_the_values(
    client: FlaskClient, emails: str, token: str, admin_token: str
) -> None:
    assert schedule(client, token, f"welcome:{EMAIL}", group_key=EMAIL).status_code == 202
    asked = erase(client, admin_token, group_key=EMAIL, queues=["emails"]).json
    response = client.get("/v1/audit?action=erasure.requested", headers=auth(admin_token))
    assert response.status_code == 200, response.json
    [entry] = response.json["entries"]
    assert entry["actor"] == "ops" and entry["after"]["erasure_id"] == asked["id"]
    assert entry["after"]["queues"] == ["emails"] and entry["after"]["reason"] == "subject asked"
    assert MARK not in str(entry)


def test_an_erasure_run_again_changes_nothing_more(
    client: FlaskClient, emails: str, token: str, admin_token: str, engine: sa.Engine, raw: psycopg.Connection[Any]
) -> None:
    assert schedule(client, token, f"welcome:{EMAIL}", data={"email": EMAIL}).status_code == 202
    first = erase(client, admin_token, item_keys=[f"welcome:{EMAIL}"]).json
    run_erasures(engine)
    snapshot = raw.execute("SELECT * FROM tickler_timeline_all ORDER BY id").fetchall()
    again = erase(client, admin_token, item_keys=[f"welcome:{EMAIL}"]).json
    run_erasures(engine)
    assert Eraser(engine, Hasher(engine)).run(first["id"])  # a finished erasure is done already
    second = client.get(f"/v1/erasures/{again['id']}", headers=auth(admin_token)).json
    assert second["status"] == "done"
    assert second["counts"] == {"open_events": 0, "finished_events": 0, "timeline_entries": 0, "archive_rows": 0}
    assert raw.execute("SELECT * FROM tickler_timeline_all ORDER BY id").fetchall() == snapshot


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "group_key"),
        ({"item_keys": []}, "item_keys"),
        ({"item_key_prefix": "ab"}, "item_key_prefix"),
        ({"group_key": "g", "queues": ["nope"]}, "queues"),
        ({"group_key": "g", "queues": []}, "queues"),
        ({"group_key": "g", "reason": None}, "reason"),
        ({"group_key": "g", "reason": ""}, "reason"),
        ({"group_key": "g", "reason": "   "}, "reason"),
        ({"group_key": "g", "colour": "red"}, "colour"),
        ({"item_keys": ["a/b"]}, "item_keys[0]"),
    ],
)
def test_a_bad_request_is_refused_naming_the_field_and_logs_nothing(
    client: FlaskClient, emails: str, admin_token: str, raw: psycopg.Connection[Any], body: dict[str, Any], field: str
) -> None:
    sent = {"reason": "subject asked", **body}
    if sent["reason"] is None:
        del sent["reason"]
    assert_problem(client.post("/v1/erasures", json=sent, headers=auth(admin_token)), 400, field)
    assert raw.execute("SELECT count(*) FROM tickler_erasure").fetchone() == (0,)


def test_a_query_parameter_on_the_request_is_refused_and_logs_nothing(
    client: FlaskClient, emails: str, admin_token: str, raw: psycopg.Connection[Any]
) -> None:
    sent = {"group_key": "g", "reason": "subject asked"}
    refused = client.post("/v1/erasures?dry_run=1", json=sent, headers=auth(admin_token))
    assert_problem(refused, 400, "dry_run")
    assert raw.execute("SELECT count(*) FROM tickler_erasure").fetchone() == (0,)


def test_only_admins_erase_and_read_the_log(client: FlaskClient, emails: str, token: str, admin_token: str) -> None:
    assert erase(client, token, group_key=EMAIL).status_code == 403
    created = erase(client, admin_token, group_key=EMAIL).json
    assert client.get(f"/v1/erasures/{created['id']}", headers=auth(token)).status_code == 403
    assert client.get(f"/v1/erasures?group_key={EMAIL}", headers=auth(token)).status_code == 403
    assert client.get("/v1/erasures/999999", headers=auth(admin_token)).status_code == 404
    assert_problem(client.get("/v1/erasures", headers=auth(admin_token)), 400, "item_key", "group_key")


def test_the_walk_through_history_reads_only_the_days_of_its_range(
    client: FlaskClient, emails: str, admin_token: str, engine: sa.Engine, raw: psycopg.Connection[Any]
) -> None:
    # A week of day partitions, each holding finished events of the subject and of others.
    raw.execute("SELECT tickler_maintain_history(now() - interval '7 days', 8)")
    raw.execute(
        "INSERT INTO tickler_event_history (id, queue, item_key, group_key, schedule_on, enqueued_by, dequeued_on,"
        " dequeued_by, outcome, max_attempts)"
        " SELECT i, 'emails', 'k:' || i, CASE WHEN i %% 2 = 0 THEN %s END, t, 'x', t, 'x', 'delivered', 1"
        " FROM generate_series(1, 7000) AS i, LATERAL (SELECT now() - interval '7 days' * (1 - i / 7000.0) AS t) AS x",
        [EMAIL],
    )
    raw.execute("ANALYZE tickler_event_history")
    erasure = erase(client, admin_token, group_key=EMAIL).json
    [[day_from, day_to]] = raw.execute(
        "SELECT date_trunc('day', now() - interval '3 days'), date_trunc('day', now() - interval '2 days')"
    ).fetchall()
    [[plan]] = raw.execute(
        "EXPLAIN (FORMAT JSON) SELECT * FROM tickler_erasure_history_rows(%s, 1000, %s, %s)",
        [erasure["id"], day_from, day_to],
    ).fetchall()

    def scans(node: dict[str, Any]) -> list[tuple[str, str]]:
        found = [(node["Node Type"], node["Relation Name"])] if "Relation Name" in node else []
        return found + [scan for child in node.get("Plans", []) for scan in scans(child)]

    read = [(kind, name) for kind, name in scans(plan[0]["Plan"]) if name.startswith("tickler_event_history")]
    day = day_from.strftime("%Y%m%d")
    # only the range's day: not the whole history per batch
    assert read and all(day in name for _, name in read), read
    # and the erasure, walking range by range, erases every one of them
    assert run_erasures(engine) == [erasure["id"]]
    assert raw.execute("SELECT count(*) FROM tickler_event_history WHERE group_key = %s", [EMAIL]).fetchone() == (0,)
    done = client.get(f"/v1/erasures/{erasure['id']}", headers=auth(admin_token)).json
    assert done["counts"]["finished_events"] == 3500
