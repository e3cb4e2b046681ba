-- Every query of the pipeline, by name. Loaded once by pipeline/db.py.
-- Conventions:
--   * Parameters are psycopg's `%(name)s` (the pipeline talks psycopg: COPY needs it).
--   * `source_*` queries are relations read by Spark: as a JDBC `dbtable` subquery (partitioned
--     on their first id column), or wrapped in `COPY (...) TO STDOUT` for the snapshot path. They
--     take no parameters; rows are chosen by range on the partition column and by Spark filters.
--   * The archive's deletes run with `SET LOCAL tickler.archiving = 'on'`: the timeline is
--     append-only for everyone else.

-- name: source_events
-- Events as the report reads them, open (tickler_event) and finished (tickler_event_history).
SELECT id, queue, item_key, group_key, schedule_on, enqueued_on, enqueued_by, dequeued_on, dequeued_by,
       outcome, redeliver_count, max_attempts
FROM tickler_event_all

-- name: source_timeline
-- Timeline entries as the report reads them (with the deliveries that are history rows, 0072).
SELECT id, queue, item_key, event_id, at, action, actor, schedule_on, CAST(details AS text) AS details
FROM tickler_timeline_all

-- name: source_archive_events
-- Whole rows of the events of unfinished archive runs, with their run and finish date (UTC).
-- Each is found by its history index in its day, as its item recorded them (migration 0063).
SELECT e.id, e.queue, e.item_key, e.group_key, e.schedule_on, CAST(e.data AS text) AS data,
       e.enqueued_on, e.enqueued_by, e.dequeued_on, e.dequeued_by, e.outcome, e.claimed_on, e.claimed_by,
       CAST(e.lease_id AS text) AS lease_id, e.lease_expires_on, e.redeliver_count, e.max_attempts,
       e.last_error, e.version,
       i.run_id, to_char(e.dequeued_on AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS date
FROM tickler_archive_item AS i
JOIN tickler_event_history AS e ON e.queue = i.queue AND e.schedule_on = i.schedule_on AND e.id = i.event_id
                                  AND e.dequeued_on = i.dequeued_on

-- name: source_archive_timeline
-- Timeline entries of the events of unfinished archive runs, filed under their event's finish date.
-- The timeline is reached through its key (queue, item_key: its primary key's prefix), never by
-- event_id alone, which no index covers: should the items' statistics be off, the worst plan is
-- an index probe per item, not a scan of the timeline per item (one run took ten minutes).
SELECT t.event_id, t.id, t.queue, t.item_key, t.at, t.action, t.actor, t.schedule_on,
       CAST(t.details AS text) AS details,
       i.run_id, to_char(e.dequeued_on AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS date
FROM tickler_archive_item AS i
JOIN tickler_event_history AS e ON e.queue = i.queue AND e.schedule_on = i.schedule_on AND e.id = i.event_id AND e.dequeued_on = i.dequeued_on
JOIN tickler_timeline_all AS t ON t.queue = e.queue AND t.item_key = e.item_key AND t.event_id = e.id

-- name: id_bounds_events
-- Bounds of the partition column of source_events (partitioned reads split this range).
SELECT min(id), max(id) FROM tickler_event_all

-- name: id_bounds_timeline
-- Bounds of the partition column of source_timeline.
SELECT min(id), max(id) FROM tickler_timeline_all

-- name: archive_runs_readable
-- Archive runs whose rows left PostgreSQL: the report reads their files beside the live tables
-- (in the same snapshot, so a row is either here or in the live tables, never both or neither).
SELECT id, location, state FROM tickler_archive_run WHERE state = 'deleted' ORDER BY id

-- name: archive_runs_at
-- The archived runs at one location, with what their files must hold (compaction checks them).
SELECT id, cutoff, event_count, event_id_sum, timeline_count, timeline_id_sum
FROM tickler_archive_run WHERE state = 'deleted' AND location = %(location)s ORDER BY id

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
-- Fix the run's events: finished before the cut-off (at most :limit, oldest ids first), with
-- what finds each in history again (its queue, schedule_on and day: history has no index by id).
INSERT INTO tickler_archive_item (run_id, event_id, queue, schedule_on, dequeued_on)
SELECT %(run_id)s, e.id, e.queue, e.schedule_on, e.dequeued_on
FROM tickler_event_history AS e
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
      FROM tickler_archive_item AS i
      JOIN tickler_event_history AS e ON e.queue = i.queue AND e.schedule_on = i.schedule_on AND e.id = i.event_id AND e.dequeued_on = i.dequeued_on
      JOIN tickler_timeline_all AS t ON t.queue = e.queue AND t.item_key = e.item_key AND t.event_id = e.id
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
-- Remove the run's timeline entries (tickler.archiving must be on in this transaction), found
-- through their key as source_archive_timeline finds them (their events are still there), and
-- count them: the rows of tickler_timeline deleted here, and the deliveries that are their
-- history rows (0072), which leave with them (delete_run_events).
WITH deleted AS (
    DELETE FROM tickler_timeline AS t
    USING tickler_archive_item AS i
    JOIN tickler_event_history AS e ON e.queue = i.queue AND e.schedule_on = i.schedule_on AND e.id = i.event_id AND e.dequeued_on = i.dequeued_on
    WHERE i.run_id = %(run_id)s AND t.queue = e.queue AND t.item_key = e.item_key AND t.event_id = e.id
    RETURNING t.id
)
SELECT (SELECT count(*) FROM deleted)
       + (SELECT count(*)
          FROM tickler_archive_item AS i
          JOIN tickler_event_history AS e ON e.queue = i.queue AND e.schedule_on = i.schedule_on AND e.id = i.event_id
                                          AND e.dequeued_on = i.dequeued_on
          WHERE i.run_id = %(run_id)s AND e.entry_id IS NOT NULL) AS entries

-- name: record_archived_keys
-- Tell the timeline where each key's older history went.
INSERT INTO tickler_archived_key AS k (queue, item_key, first_archive_id, archive_id, archived_through, events)
SELECT e.queue, e.item_key, %(run_id)s, %(run_id)s, max(e.dequeued_on), count(*)
FROM tickler_archive_item AS i
JOIN tickler_event_history AS e ON e.queue = i.queue AND e.schedule_on = i.schedule_on AND e.id = i.event_id AND e.dequeued_on = i.dequeued_on
WHERE i.run_id = %(run_id)s
GROUP BY e.queue, e.item_key
ORDER BY e.queue, e.item_key
ON CONFLICT (queue, item_key) DO UPDATE
SET archive_id = excluded.archive_id,
    archived_through = greatest(k.archived_through, excluded.archived_through),
    events = k.events + excluded.events

-- name: delete_run_events
-- Remove the run's events (finished: in the history).
DELETE FROM tickler_event_history AS e
USING tickler_archive_item AS i
WHERE i.run_id = %(run_id)s AND e.queue = i.queue AND e.schedule_on = i.schedule_on AND e.id = i.event_id AND e.dequeued_on = i.dequeued_on

-- name: delete_run_items
-- The run's id list is no longer needed once its events are gone (the ledger keeps the counts).
DELETE FROM tickler_archive_item WHERE run_id = %(run_id)s

-- name: mark_deleted
-- The run is finished. Record how far the archive has written history (archive_before_prune
-- drops only days before it): every event finished before the run's cut-off, unless a limit
-- left some behind, then up to the oldest of those (the run's own events are gone by now).
WITH marked AS (
    UPDATE tickler_archive_run SET state = 'deleted', deleted_on = now()
    WHERE id = %(run_id)s AND state = 'written'
    RETURNING id, cutoff
),
progress AS (
    INSERT INTO tickler_archive_progress AS p (archived_through)
    SELECT coalesce(least(m.cutoff, (SELECT min(h.dequeued_on) FROM tickler_event_history AS h
                                     WHERE h.dequeued_on < m.cutoff)), m.cutoff)
    FROM marked AS m
    ON CONFLICT (id) DO UPDATE
    SET archived_through = greatest(p.archived_through, excluded.archived_through), updated_on = now()
)
SELECT id FROM marked

-- name: analyze_items
-- Statistics for the run's items, once recorded: the planner would otherwise price the joins of
-- the run's reads for the one row an empty table had (autovacuum notices far too late).
ANALYZE tickler_archive_item

-- name: analyze_after_delete
-- Fresh statistics once a run's history is gone (finished events are in their own table since
-- migration 0021, so the open events' statistics do not change).
ANALYZE tickler_event_history, tickler_timeline

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
    max_attempts   integer,
    priority       smallint,
    fairness_key   text,
    traceparent    text
) ON COMMIT DROP

-- name: import_copy
-- Fill the staging table.
COPY tickler_import_staging (ord, queue, item_key, group_key, schedule_on, delay_seconds, data, max_attempts,
                             priority, fairness_key, traceparent)
FROM STDIN

-- name: import_analyze
-- Statistics for the staged rows, so that the insert plans with their real number.
ANALYZE tickler_import_staging

-- name: import_write
-- Write the staged rows through tickler_schedule() (migration 0008), the one path that writes
-- events for the API too: one call per queue of the batch, with its rows as a JSON array.
-- Keys with an open event are left alone (reject, ignore), or replaced or debounced (capped by
-- debounce_max_seconds, as the API's) unless leased (replace, debounce).
-- Returns counts by outcome, then each conflicting row as staged (for the rejects).
WITH written AS (
    SELECT r.ord, CASE WHEN r.outcome IN ('conflict', 'in_flight') THEN 'conflict' ELSE r.outcome END AS outcome
    FROM (SELECT DISTINCT queue FROM tickler_import_staging) AS qn
    CROSS JOIN LATERAL tickler_schedule(
        qn.queue,
        (SELECT jsonb_agg(jsonb_build_object(
                    'ord', s.ord, 'item_key', s.item_key, 'group_key', s.group_key, 'schedule_on', s.schedule_on,
                    'delay_seconds', s.delay_seconds, 'data', s.data, 'max_attempts', s.max_attempts,
                    'priority', s.priority, 'fairness_key', s.fairness_key)
                ORDER BY s.ord)
         FROM tickler_import_staging AS s WHERE s.queue = qn.queue),
        %(actor)s, %(on_conflict)s, p_debounce_max_seconds => %(debounce_max_seconds)s) AS r
)
SELECT w.outcome, count(*) AS n, NULL AS ord, NULL AS queue, NULL AS item_key, NULL AS group_key,
       NULL AS schedule_on, NULL AS delay_seconds, NULL AS data, NULL AS max_attempts, NULL AS priority,
       NULL AS fairness_key, NULL AS traceparent
FROM written AS w
GROUP BY w.outcome
UNION ALL
SELECT 'conflict', NULL, s.ord, s.queue, s.item_key, s.group_key, s.schedule_on, s.delay_seconds, s.data,
       s.max_attempts, s.priority, s.fairness_key, s.traceparent
FROM written AS w JOIN tickler_import_staging AS s ON s.ord = w.ord
WHERE w.outcome = 'conflict'

-- name: import_trace
-- Keep each written row's trace context with its event (SPEC §11), as the API keeps a schedule
-- call's: the rows import_write created, replaced or debounced — every staged row with a context
-- but the conflicts it returned (a batch holds one row per key, so the key names the event).
UPDATE tickler_event AS e
SET traceparent = s.traceparent, tracestate = NULL
FROM tickler_import_staging AS s
WHERE s.traceparent IS NOT NULL AND NOT s.ord = ANY(%(conflicts)s)
  AND e.queue = s.queue AND e.item_key = s.item_key AND e.dequeued_on IS NULL

-- name: import_resume
-- The unfinished import with this fingerprint (a rerun resumes it), if any.
SELECT id, partitions, batch_rows FROM tickler_import WHERE fingerprint = %(fingerprint)s AND finished_on IS NULL

-- name: import_start
-- A new import (the unique index allows one unfinished per fingerprint).
INSERT INTO tickler_import (fingerprint, source, principal, on_conflict, debounce_max_seconds, partitions, batch_rows)
VALUES (%(fingerprint)s, %(source)s, %(principal)s, %(on_conflict)s, %(debounce_max_seconds)s, %(partitions)s,
        %(batch_rows)s)
RETURNING id, partitions, batch_rows

-- name: import_claim_batch
-- First statement of a batch's transaction: a row means "do it"; none means an earlier attempt
-- committed it (a concurrent attempt waits here on the primary key until the other one ends).
INSERT INTO tickler_import_batch (import_id, part, batch) VALUES (%(import_id)s, %(part)s, %(batch)s)
ON CONFLICT DO NOTHING
RETURNING batch

-- name: import_batch_counts
UPDATE tickler_import_batch
SET created = %(created)s, replaced = %(replaced)s, debounced = %(debounced)s, ignored = %(ignored)s,
    rejected = %(rejected)s, invalid = %(invalid)s, duplicate = %(duplicate)s
WHERE import_id = %(import_id)s AND part = %(part)s AND batch = %(batch)s

-- name: import_copy_rejects
COPY tickler_import_reject (import_id, row_number, outcome, reason, cells) FROM STDIN

-- name: import_totals
SELECT coalesce(sum(created), 0) AS created, coalesce(sum(replaced), 0) AS replaced,
       coalesce(sum(debounced), 0) AS debounced, coalesce(sum(ignored), 0) AS ignored, coalesce(sum(rejected), 0) AS rejected,
       coalesce(sum(invalid), 0) AS invalid, coalesce(sum(duplicate), 0) AS duplicate
FROM tickler_import_batch WHERE import_id = %(import_id)s

-- name: import_progress
-- Rows an import's committed batches checked and decided, and how many of them it wrote.
SELECT coalesce(sum(created + replaced + debounced + ignored + rejected + invalid + duplicate), 0) AS checked,
       coalesce(sum(created + replaced + debounced), 0) AS written
FROM tickler_import_batch WHERE import_id = %(import_id)s

-- name: import_rejects
SELECT row_number, reason, cells FROM tickler_import_reject WHERE import_id = %(import_id)s ORDER BY row_number

-- name: import_finish
-- The import is done: keep its counts, drop its per-batch rows.
WITH gone AS (DELETE FROM tickler_import_batch WHERE import_id = %(import_id)s),
     rejects AS (DELETE FROM tickler_import_reject WHERE import_id = %(import_id)s)
UPDATE tickler_import SET finished_on = now(), counts = %(counts)s WHERE id = %(import_id)s

-- name: erasures_waiting_for_archive
-- Erasures done in the database whose archive files are next (scheduler/database/erasing.sql),
-- with their selector in clear (deleted once the archive is rewritten).
SELECT r.id, r.queues, w.group_key, w.item_keys, w.item_key_prefix
FROM tickler_erasure AS r JOIN tickler_erasure_work AS w ON w.erasure_id = r.id
WHERE r.finished_at IS NULL AND r.database_done_at IS NOT NULL
ORDER BY r.id

-- name: archive_locations
-- Every place an archive run wrote files.
SELECT DISTINCT location FROM tickler_archive_run ORDER BY location

-- name: erasure_archive_done
SELECT tickler_erasure_archive_done(%(id)s, %(rows)s)

-- name: ui_secret
SELECT secret FROM tickler_ui_secret
