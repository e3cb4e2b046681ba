"""The plain-psycopg baseline: the same work with the best SQL we know, and nothing else.

One table with the same key rules (a partial unique index on open keys) and claim indexes,
no timeline, no counters, no leases beyond a claimed_on stamp.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence

import psycopg

SCHEMA = """
CREATE TABLE bench_job (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue        text NOT NULL,
    item_key     text COLLATE "C" NOT NULL,
    group_key    text COLLATE "C",
    schedule_on  timestamptz NOT NULL,
    data         jsonb NOT NULL DEFAULT '{}',
    enqueued_on  timestamptz NOT NULL DEFAULT now(),
    claimed_on   timestamptz,
    claimed_by   text,
    lease_id     uuid,
    dequeued_on  timestamptz
);
CREATE UNIQUE INDEX bench_job_open_key ON bench_job (queue, item_key) WHERE dequeued_on IS NULL;
CREATE INDEX bench_job_due ON bench_job (queue, schedule_on, id)
    WHERE dequeued_on IS NULL AND claimed_on IS NULL AND group_key IS NULL;
CREATE INDEX bench_job_group_due ON bench_job (queue, schedule_on, id) INCLUDE (group_key)
    WHERE dequeued_on IS NULL AND claimed_on IS NULL AND group_key IS NOT NULL;
CREATE INDEX bench_job_group_claimed ON bench_job (queue, group_key)
    WHERE dequeued_on IS NULL AND claimed_on IS NOT NULL AND group_key IS NOT NULL;
"""

INSERT_ONE = """
INSERT INTO bench_job (queue, item_key, group_key, schedule_on, data)
VALUES (%s, %s, %s, now() + make_interval(secs => %s), %s)
ON CONFLICT (queue, item_key) WHERE dequeued_on IS NULL DO NOTHING
RETURNING id
"""

STAGE = "CREATE TEMP TABLE IF NOT EXISTS bench_stage (item_key text, group_key text, delay float8, data jsonb)"

MERGE_STAGE = """
INSERT INTO bench_job (queue, item_key, group_key, schedule_on, data)
SELECT %s, item_key, group_key, now() + make_interval(secs => delay), data FROM bench_stage
ON CONFLICT (queue, item_key) WHERE dequeued_on IS NULL DO NOTHING
"""

# A key's open job takes the new time, group and data (what replace and debounce do).
UPDATE_ON_CONFLICT = (
    "DO UPDATE SET schedule_on = EXCLUDED.schedule_on, group_key = EXCLUDED.group_key, data = EXCLUDED.data"
)

CLAIM = """
UPDATE bench_job SET claimed_on = now(), claimed_by = %s, lease_id = gen_random_uuid()
WHERE id IN (
    SELECT id FROM bench_job
    WHERE queue = %s AND dequeued_on IS NULL AND claimed_on IS NULL AND group_key IS NULL
      AND schedule_on <= now()
    ORDER BY schedule_on, id
    LIMIT %s
    FOR UPDATE SKIP LOCKED)
RETURNING id, item_key, schedule_on, data
"""

COMPLETE = "UPDATE bench_job SET dequeued_on = now() WHERE id = ANY(%s) AND dequeued_on IS NULL"

LOCK_GROUPS = """
WITH due AS (
    SELECT group_key, schedule_on FROM bench_job
    WHERE queue = %(queue)s AND dequeued_on IS NULL AND claimed_on IS NULL AND group_key IS NOT NULL
      AND schedule_on <= now()
    ORDER BY schedule_on, id
    LIMIT %(scan)s
),
groups AS MATERIALIZED (
    SELECT d.group_key, min(d.schedule_on) AS first_due FROM due AS d
    WHERE NOT EXISTS (
        SELECT 1 FROM bench_job AS l
        WHERE l.queue = %(queue)s AND l.group_key = d.group_key
          AND l.dequeued_on IS NULL AND l.claimed_on IS NOT NULL)
    GROUP BY d.group_key
    ORDER BY first_due, d.group_key
)
SELECT group_key FROM groups WHERE pg_try_advisory_xact_lock(hashtextextended(group_key, 0)) LIMIT %(limit)s
"""

CLAIM_GROUPS = """
UPDATE bench_job SET claimed_on = now(), claimed_by = %(worker)s, lease_id = gen_random_uuid()
WHERE queue = %(queue)s AND group_key = ANY(%(groups)s) AND dequeued_on IS NULL AND claimed_on IS NULL
  AND schedule_on <= now()
RETURNING id, group_key, schedule_on, data
"""

NEXT_DUE = """
SELECT extract(epoch FROM min(schedule_on) - clock_timestamp())::float8 FROM bench_job
WHERE queue = %s AND dequeued_on IS NULL AND claimed_on IS NULL AND group_key IS NULL
"""


def install(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SCHEMA)


def connect(url: str, *, autocommit: bool = True) -> psycopg.Connection:
    return psycopg.connect(url, autocommit=autocommit, prepare_threshold=0)


def insert_one(
    conn: psycopg.Connection, queue: str, key: str, *, delay: float = 0.0, group: str | None = None, data: str = ""
) -> None:
    """One job; `data`: its JSON text ({"n": key} when not given)."""
    conn.execute(INSERT_ONE, (queue, key, group, delay, data or json.dumps({"n": key})))


def insert_copy(
    conn: psycopg.Connection,
    queue: str,
    keys: Sequence[str],
    *,
    delay: float = 0.0,
    groups: Sequence[str | None] | None = None,
    update: bool = False,
    data: Sequence[str] | None = None,
) -> None:
    """COPY into a temporary table, then one INSERT ... ON CONFLICT: the fastest enqueue we know.
    An open job of a key is left alone, or with `update` takes the new time, group and data.
    `data`: each job's JSON text (no tab, newline or backslash), else {"n": key}."""
    buffer = io.StringIO()
    for index, key in enumerate(keys):
        group = (groups[index] if groups else None) or "\\N"
        text = data[index] if data else f'{{"n": "{key}"}}'
        buffer.write(f"{key}\t{group}\t{delay}\t{text}\n")
    with conn.transaction():
        conn.execute(STAGE)
        conn.execute("TRUNCATE bench_stage")
        with conn.cursor().copy("COPY bench_stage FROM STDIN") as copy:
            copy.write(buffer.getvalue())
        conn.execute(MERGE_STAGE.replace("DO NOTHING", UPDATE_ON_CONFLICT) if update else MERGE_STAGE, (queue,))


def claim(conn: psycopg.Connection, queue: str, worker: str, limit: int) -> list[tuple[object, ...]]:
    with conn.transaction():
        return conn.execute(CLAIM, (worker, queue, limit)).fetchall()


def complete(conn: psycopg.Connection, ids: list[int]) -> None:
    with conn.transaction():
        conn.execute(COMPLETE, (ids,))


def claim_groups(conn: psycopg.Connection, queue: str, worker: str, limit: int) -> list[tuple[object, ...]]:
    """The advisory-lock group claim: lock up to `limit` due groups, then take all their due rows."""
    with conn.transaction():
        params = {"queue": queue, "scan": limit * 50, "limit": limit, "worker": worker}
        groups = [row[0] for row in conn.execute(LOCK_GROUPS, params)]
        if not groups:
            return []
        return conn.execute(CLAIM_GROUPS, {**params, "groups": groups}).fetchall()


def next_due_in(conn: psycopg.Connection, queue: str) -> float | None:
    row = conn.execute(NEXT_DUE, (queue,)).fetchone()
    return None if row is None or row[0] is None else float(row[0])
