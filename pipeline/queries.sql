-- Every query of the pipeline, by name. Loaded once by pipeline/db.py.
-- Conventions:
--   * Parameters are psycopg's `%(name)s` (the pipeline talks psycopg: COPY needs it).
--   * `source_*` queries are relations read by Spark: as a JDBC `dbtable` subquery (partitioned
--     on their first id column), or wrapped in `COPY (...) TO STDOUT` for the snapshot path. They
--     take no parameters; rows are chosen by range on the partition column and by Spark filters.
--   * The archive's deletes run with `SET LOCAL tickler.archiving = 'on'`: the timeline is
--     append-only for everyone else.

-- name: source_events
-- Events as the report reads them.
SELECT id, queue, item_key, group_key, schedule_on, enqueued_on, enqueued_by, dequeued_on, dequeued_by,
       outcome, redeliver_count, max_attempts
FROM tickler_event

-- name: source_timeline
-- Timeline entries as the report reads them.
SELECT id, queue, item_key, event_id, at, action, actor, schedule_on, CAST(details AS text) AS details
FROM tickler_timeline

-- name: source_archive_events
-- Whole rows of the events of unfinished archive runs, with their run and finish date (UTC).
SELECT e.id, e.queue, e.item_key, e.group_key, e.schedule_on, CAST(e.data AS text) AS data,
       e.enqueued_on, e.enqueued_by, e.dequeued_on, e.dequeued_by, e.outcome, e.claimed_on, e.claimed_by,
       CAST(e.lease_id AS text) AS lease_id, e.lease_expires_on, e.redeliver_count, e.max_attempts,
       e.last_error, e.version,
       i.run_id, to_char(e.dequeued_on AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS date
FROM tickler_event AS e
JOIN tickler_archive_item AS i ON i.event_id = e.id

-- name: source_archive_timeline
-- Timeline entries of the events of unfinished archive runs, filed under their event's finish date.
SELECT t.event_id, t.id, t.queue, t.item_key, t.at, t.action, t.actor, t.schedule_on,
       CAST(t.details AS text) AS details,
       i.run_id, to_char(e.dequeued_on AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS date
FROM tickler_timeline AS t
JOIN tickler_archive_item AS i ON i.event_id = t.event_id
JOIN tickler_event AS e ON e.id = t.event_id

-- name: id_bounds_events
-- Bounds of the partition column of source_events (partitioned reads split this range).
SELECT min(id), max(id) FROM tickler_event

-- name: id_bounds_timeline
-- Bounds of the partition column of source_timeline.
SELECT min(id), max(id) FROM tickler_timeline

-- name: archive_runs_readable
-- Archive runs whose rows left PostgreSQL: the report reads their files beside the live tables
-- (in the same snapshot, so a row is either here or in the live tables, never both or neither).
SELECT id, location, state FROM tickler_archive_run WHERE state = 'deleted' ORDER BY id

-- name: archive_lock
-- One archive job at a time (a session advisory lock on hashtext('tickler.archive')).
SELECT pg_try_advisory_lock(hashtext('tickler.archive'))

-- name: archive_unlock
-- Release the archive job's lock.
SELECT pg_advisory_unlock(hashtext('tickler.archive'))

-- name: unfinished_run
-- The run a crash left unfinished, if any (it is finished before a new one starts).
SELECT * FROM tickler_archive_run WHERE state <> 'deleted'

-- name: get_run
-- One run of the ledger.
SELECT * FROM tickler_archive_run WHERE id = %(run_id)s

-- name: create_run
-- Record a new run (its counts are filled in by count_run, in the same transaction).
INSERT INTO tickler_archive_run (cutoff, location, event_count, timeline_count, event_id_sum, timeline_id_sum)
VALUES (%(cutoff)s, %(location)s, 0, 0, 0, 0)
RETURNING id

-- name: select_run_events
-- Fix the run's events: finished before the cut-off (at most :limit, oldest ids first).
INSERT INTO tickler_archive_item (run_id, event_id)
SELECT %(run_id)s, e.id
FROM tickler_event AS e
WHERE e.dequeued_on IS NOT NULL AND e.dequeued_on < %(cutoff)s
ORDER BY e.id
LIMIT %(limit)s

-- name: count_run
-- What the run moves: counts and id sums of its events and their timeline entries.
UPDATE tickler_archive_run AS r
SET event_count = ev.n, event_id_sum = ev.id_sum, min_event_id = ev.min_id, max_event_id = ev.max_id,
    timeline_count = tl.n, timeline_id_sum = tl.id_sum
FROM (SELECT count(*) AS n, coalesce(sum(event_id), 0) AS id_sum, min(event_id) AS min_id, max(event_id) AS max_id
      FROM tickler_archive_item WHERE run_id = %(run_id)s) AS ev,
     (SELECT count(*) AS n, coalesce(sum(t.id), 0) AS id_sum
      FROM tickler_timeline AS t JOIN tickler_archive_item AS i ON i.event_id = t.event_id
      WHERE i.run_id = %(run_id)s) AS tl
WHERE r.id = %(run_id)s
RETURNING r.*

-- name: mark_written
-- The run's files were read back and match the ledger.
UPDATE tickler_archive_run SET state = 'written', written_on = now()
WHERE id = %(run_id)s AND state IN ('selected', 'written')
RETURNING id

-- name: lock_run
-- The run, locked for its delete; it must be written and not yet deleted.
SELECT * FROM tickler_archive_run WHERE id = %(run_id)s AND state = 'written' FOR UPDATE

-- name: delete_run_timeline
-- Remove the run's timeline entries (tickler.archiving must be on in this transaction).
DELETE FROM tickler_timeline AS t
USING tickler_archive_item AS i
WHERE i.run_id = %(run_id)s AND t.event_id = i.event_id

-- name: record_archived_keys
-- Tell the timeline where each key's older history went.
INSERT INTO tickler_archived_key AS k (queue, item_key, first_archive_id, archive_id, archived_through, events)
SELECT e.queue, e.item_key, %(run_id)s, %(run_id)s, max(e.dequeued_on), count(*)
FROM tickler_event AS e JOIN tickler_archive_item AS i ON i.event_id = e.id
WHERE i.run_id = %(run_id)s
GROUP BY e.queue, e.item_key
ORDER BY e.queue, e.item_key
ON CONFLICT (queue, item_key) DO UPDATE
SET archive_id = excluded.archive_id,
    archived_through = greatest(k.archived_through, excluded.archived_through),
    events = k.events + excluded.events

-- name: delete_run_events
-- Remove the run's events.
DELETE FROM tickler_event AS e
USING tickler_archive_item AS i
WHERE i.run_id = %(run_id)s AND e.id = i.event_id

-- name: delete_run_items
-- The run's id list is no longer needed once its events are gone (the ledger keeps the counts).
DELETE FROM tickler_archive_item WHERE run_id = %(run_id)s

-- name: mark_deleted
-- The run is finished.
UPDATE tickler_archive_run SET state = 'deleted', deleted_on = now()
WHERE id = %(run_id)s AND state = 'written'
RETURNING id

-- name: import_queues
-- The queues an import may write to, with their default max_attempts.
SELECT name, max_attempts FROM tickler_queue

-- name: import_staging
-- A partition's rows, before they are inserted in one statement (temporary: no WAL, gone at commit).
CREATE TEMPORARY TABLE tickler_import_staging (
    ord            bigint NOT NULL,
    queue          text NOT NULL,
    item_key       text COLLATE "C" NOT NULL,
    group_key      text COLLATE "C",
    schedule_on    timestamptz,
    delay_seconds  double precision,
    data           jsonb NOT NULL,
    max_attempts   integer
) ON COMMIT DROP

-- name: import_copy
-- Fill the staging table.
COPY tickler_import_staging (ord, queue, item_key, group_key, schedule_on, delay_seconds, data, max_attempts)
FROM STDIN

-- name: import_analyze
-- Statistics for the staged rows, so that the insert plans with their real number.
ANALYZE tickler_import_staging

-- name: import_insert
-- Insert the staged rows; keys with an open event are left alone (on_conflict reject or ignore).
-- Like the API's schedule_events: timeline entries in the same statement, wake-up hints honoured.
WITH clock AS (SELECT now() AS now),
inserted AS (
    INSERT INTO tickler_event AS e
        (queue, item_key, group_key, schedule_on, data, enqueued_on, enqueued_by, max_attempts)
    SELECT s.queue, s.item_key, s.group_key,
           coalesce(s.schedule_on, clock.now + make_interval(secs => coalesce(s.delay_seconds, 0))),
           s.data, clock.now, %(actor)s, coalesce(s.max_attempts, qu.max_attempts)
    FROM tickler_import_staging AS s
    JOIN tickler_queue AS qu ON qu.name = s.queue
    CROSS JOIN clock
    ORDER BY s.ord
    ON CONFLICT (queue, item_key) WHERE dequeued_on IS NULL DO NOTHING
    RETURNING e.id, e.queue, e.item_key, e.group_key, e.schedule_on, e.enqueued_on, e.enqueued_by, e.max_attempts
),
logged AS (
    INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
    SELECT queue, item_key, id, enqueued_on, 'enqueued', enqueued_by, schedule_on,
           jsonb_strip_nulls(jsonb_build_object('group_key', group_key, 'max_attempts', max_attempts))
    FROM inserted
),
hint AS (
    -- FOR KEY SHARE always (not only when notifying): see tickler_queue.next_wake
    SELECT qu.name, qu.next_wake FROM tickler_queue AS qu
    WHERE qu.name IN (SELECT DISTINCT queue FROM tickler_import_staging)
    FOR KEY SHARE
),
wake AS (
    SELECT pg_notify('tickler_wake', h.name) FROM hint AS h
    WHERE h.next_wake > (SELECT min(n.schedule_on) FROM inserted AS n WHERE n.queue = h.name)
),
results AS (
    SELECT s.ord, s.queue, s.item_key, CASE WHEN n.id IS NULL THEN 'conflict' ELSE 'created' END AS outcome
    FROM tickler_import_staging AS s
    LEFT JOIN inserted AS n ON n.queue = s.queue AND n.item_key = s.item_key
)
SELECT r.outcome, count(*) AS n, NULL AS ord, NULL AS queue, NULL AS item_key, NULL AS group_key,
       NULL AS schedule_on, NULL AS delay_seconds, NULL AS data, NULL AS max_attempts
FROM results AS r CROSS JOIN (SELECT count(*) AS notified FROM wake) AS w
GROUP BY r.outcome
UNION ALL
SELECT 'conflict', NULL, s.ord, s.queue, s.item_key, s.group_key, s.schedule_on, s.delay_seconds, s.data,
       s.max_attempts
FROM results AS r JOIN tickler_import_staging AS s ON s.ord = r.ord
WHERE r.outcome = 'conflict'

-- name: import_upsert
-- Insert the staged rows, replacing open events with the same key unless they are under a lease
-- (on_conflict replace). Like the API's schedule_events_replacing.
WITH clock AS (SELECT now() AS now),
upserted AS (
    INSERT INTO tickler_event AS e
        (queue, item_key, group_key, schedule_on, data, enqueued_on, enqueued_by, max_attempts)
    SELECT s.queue, s.item_key, s.group_key,
           coalesce(s.schedule_on, clock.now + make_interval(secs => coalesce(s.delay_seconds, 0))),
           s.data, clock.now, %(actor)s, coalesce(s.max_attempts, qu.max_attempts)
    FROM tickler_import_staging AS s
    JOIN tickler_queue AS qu ON qu.name = s.queue
    CROSS JOIN clock
    ORDER BY s.ord
    ON CONFLICT (queue, item_key) WHERE dequeued_on IS NULL DO UPDATE
        SET group_key = excluded.group_key,
            schedule_on = excluded.schedule_on,
            data = excluded.data,
            max_attempts = excluded.max_attempts,
            version = e.version + 1
        WHERE e.lease_id IS NULL
    RETURNING e.id, e.queue, e.item_key, e.group_key, e.schedule_on, e.max_attempts, (e.xmax <> 0) AS replaced
),
logged AS (
    INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
    SELECT u.queue, u.item_key, u.id, clock.now,
           CASE WHEN u.replaced THEN 'replaced' ELSE 'enqueued' END, %(actor)s, u.schedule_on,
           jsonb_strip_nulls(jsonb_build_object('group_key', u.group_key, 'max_attempts', u.max_attempts))
    FROM upserted AS u CROSS JOIN clock
),
hint AS (
    SELECT qu.name, qu.next_wake FROM tickler_queue AS qu
    WHERE qu.name IN (SELECT DISTINCT queue FROM tickler_import_staging)
    FOR KEY SHARE
),
wake AS (
    SELECT pg_notify('tickler_wake', h.name) FROM hint AS h
    WHERE h.next_wake > (SELECT min(u.schedule_on) FROM upserted AS u WHERE u.queue = h.name)
),
results AS (
    SELECT s.ord, s.queue, s.item_key,
           CASE WHEN u.id IS NULL THEN 'conflict' WHEN u.replaced THEN 'replaced' ELSE 'created' END AS outcome
    FROM tickler_import_staging AS s
    LEFT JOIN upserted AS u ON u.queue = s.queue AND u.item_key = s.item_key
)
SELECT r.outcome, count(*) AS n, NULL AS ord, NULL AS queue, NULL AS item_key, NULL AS group_key,
       NULL AS schedule_on, NULL AS delay_seconds, NULL AS data, NULL AS max_attempts
FROM results AS r CROSS JOIN (SELECT count(*) AS notified FROM wake) AS w
GROUP BY r.outcome
UNION ALL
SELECT 'conflict', NULL, s.ord, s.queue, s.item_key, s.group_key, s.schedule_on, s.delay_seconds, s.data,
       s.max_attempts
FROM results AS r JOIN tickler_import_staging AS s ON s.ord = r.ord
WHERE r.outcome = 'conflict'
