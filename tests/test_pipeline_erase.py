"""Erasing a subject in the archive (SPEC §12): an erasure done in the database waits for
`tickler pipeline erase`, which rewrites the Parquet files holding the subject's rows through the
manifest, and finishes the erasure with the rows it rewrote; the old files stay readable for a
reader of the previous manifest until a later run past their grace deletes them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from flask.testing import FlaskClient
from pyspark.sql import functions as F

from tests.conftest import auth
from tests.helpers import schedule
from tickler.pipeline import layout, manifest
from tickler.pipeline.archive import run_archive
from tickler.pipeline.compact import run_compact
from tickler.pipeline.erase import erased_details, run_erase
from tickler.scheduler.erasing import Eraser, Hasher

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("pipeline_db"), pytest.mark.timeout(300)]

MARK = "zqxarchive"
EMAIL = f"{MARK}@example.com"


def finish(client: FlaskClient, token: str, how: str) -> None:
    """Claim every due event and finish it: ack, or nack as dead (the subject in the error)."""
    claimed = client.post("/v1/queues/emails/claims", json={"worker": "w", "limit": 100}, headers=auth(token)).json
    for lease in claimed["leases"]:
        body = {"error": f"bounced for {EMAIL}", "dead": True} if how == "nack" else None
        assert client.post(f"/v1/leases/{lease['lease_id']}/{how}", json=body, headers=auth(token)).status_code == 200


def committed_rows(spark: Any, location: Path, table: str) -> list[str]:
    frame = manifest.read_committed(spark, str(location), table)
    assert frame is not None
    return [str(row.asDict()) for row in frame.collect()]


def every_file_on_disk(spark: Any, location: Path, table: str) -> list[str]:
    """Every row of every Parquet file under the table, listed in the manifest or not."""
    paths = [str(p) for p in (location / table).rglob("*.parquet")]
    return [str(row.asDict()) for path in paths for row in spark.read.parquet(path).collect()]


def test_the_archive_is_rewritten_and_the_erasure_done_only_then(
    spark: Any,
    client: FlaskClient,
    emails: str,
    token: str,
    admin_token: str,
    engine: sa.Engine,
    database_url: str,
    raw: psycopg.Connection[Any],
    tmp_path: Path,
) -> None:
    for n in range(3):
        assert schedule(client, token, f"welcome:{EMAIL}:{n}", group_key=EMAIL, data={"to": EMAIL}).status_code == 202
    assert schedule(client, token, "welcome:bob@example.com", data={"to": "bob"}).status_code == 202
    # as an occurrence of a recurring schedule whose key names the subject is enqueued by it
    principal = [f"schedule:{MARK}-weekly", f"welcome:{EMAIL}:0"]
    raw.execute("UPDATE tickler_event SET enqueued_by = %s WHERE item_key = %s", principal)
    finish(client, token, "ack")
    assert schedule(client, token, f"reminder:{EMAIL}", data={"to": EMAIL}).status_code == 202
    finish(client, token, "nack")
    location = tmp_path / "archive"
    [archived] = run_archive(spark, database_url, location=str(location), cutoff=datetime.now(UTC) + timedelta(hours=1))
    assert archived.events == 5
    assert any(MARK in row for row in committed_rows(spark, location, "events"))

    erasure = client.post(
        "/v1/erasures", json={"group_key": EMAIL, "item_keys": [f"reminder:{EMAIL}"], "reason": "r"},
        headers=auth(admin_token),
    ).json  # fmt: skip
    assert Eraser(engine, Hasher(engine)).run_unfinished() == [erasure["id"]]
    waiting = client.get(f"/v1/erasures/{erasure['id']}", headers=auth(admin_token)).json
    # the database is clean, the archive not yet: the erasure is not done
    assert waiting["status"] == "running" and waiting["finished_at"] is None
    assert "tickler pipeline erase" in waiting["note"] and waiting["counts"]["archive_rows"] == 0

    files = layout.Files(spark)
    before = manifest.read(files, str(location))  # a reader that took this version, still reading
    assert before is not None
    [erased] = run_erase(spark, database_url, secret="")
    assert erased.erasure_id == erasure["id"] and erased.files >= 2
    done = client.get(f"/v1/erasures/{erasure['id']}", headers=auth(admin_token)).json
    assert done["status"] == "done" and done["note"] is None
    for table in ("events", "timeline"):
        assert not [row for row in committed_rows(spark, location, table) if MARK in row], table
        # the reader of the previous version still reads its files: they are retired, not deleted
        old = manifest.read_files(spark, str(location), table, before.files[table])
        assert old is not None and any(MARK in str(row.asDict()) for row in old.collect()), table
    # a run within the grace keeps them; the first run past it deletes them
    assert run_erase(spark, database_url, secret="", now=datetime.now(UTC) + manifest.ERASED_GRACE / 2) == []
    assert any(MARK in row for row in every_file_on_disk(spark, location, "events"))
    later = datetime.now(UTC) + manifest.ERASED_GRACE + timedelta(minutes=1)
    assert run_erase(spark, database_url, secret="", now=later) == []
    timeline_rows = len([r for r in every_file_on_disk(spark, location, "timeline") if "erased:" in r])
    assert done["counts"]["archive_rows"] == 4 + timeline_rows and timeline_rows >= 4
    for table in ("events", "timeline"):
        assert not [row for row in every_file_on_disk(spark, location, table) if MARK in row], table
    current = manifest.read(files, str(location))
    assert current is not None and current.retired == []
    # the bystander is untouched, and every run still holds what its ledger says (the check of compaction)
    events = manifest.read_committed(spark, str(location), "events")
    assert events is not None
    [bob] = events.where(F.col("item_key") == "welcome:bob@example.com").collect()
    assert bob["data"] == '{"to": "bob"}'
    hashed = Hasher(engine)
    assert events.where(F.col("item_key") == hashed(f"welcome:{EMAIL}:0")).count() == 1
    assert run_compact(spark, database_url, location=str(location)).runs_checked == 1
    assert raw.execute("SELECT count(*) FROM tickler_erasure_work").fetchone() == (0,)
    assert run_erase(spark, database_url, secret="") == []  # nothing waits any more


def test_details_keep_what_tells_what_happened_and_drop_what_names_someone() -> None:
    details = '{"reason": "asked by ana", "attempt": 2, "lease_id": "x", "claim": {"group_key": "g", "ago": 1.5}}'
    assert erased_details(details) == '{"attempt": 2, "lease_id": "x", "claim": {"ago": 1.5}}'
