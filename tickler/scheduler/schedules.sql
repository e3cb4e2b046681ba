-- The queries of recurring schedules (scheduler/recurring.py, scheduler/store/schedules.py).
-- Loaded with queries.sql by scheduler/sql.py; the same conventions hold (`:now` NULL = now()).

-- name: lock_due_schedules
-- Schedules that are not paused and have work due, locked for this transaction; rows another
-- process holds are skipped (it is enqueueing them). With the queue's default max_attempts and
-- the time to act at. The queue row is share-locked up front, and skipped while a queue delete
-- holds it: waiting for it here, with the schedule locked, would deadlock with the delete's
-- cascade to this schedule.
SELECT s.*, q.max_attempts AS queue_max_attempts, clock.now AS db_now
FROM tickler_schedule AS s
JOIN tickler_queue AS q ON q.name = s.queue
CROSS JOIN (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now) AS clock
WHERE NOT s.paused AND s.due_on <= clock.now
ORDER BY s.due_on
LIMIT :limit
FOR UPDATE OF s SKIP LOCKED
FOR KEY SHARE OF q SKIP LOCKED;

-- name: lock_schedule
-- One schedule, locked for a change (waits for an engine enqueueing it), with the time to act at.
SELECT s.*, q.max_attempts AS queue_max_attempts, clock.now AS db_now
FROM tickler_schedule AS s
JOIN tickler_queue AS q ON q.name = s.queue
CROSS JOIN (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now) AS clock
WHERE s.queue = :queue AND s.schedule_key = :schedule_key
FOR UPDATE OF s;

-- name: insert_schedule
-- A new schedule, due for the engine at once (ON CONFLICT: someone created it meanwhile).
INSERT INTO tickler_schedule AS s
    (queue, schedule_key, cron, timezone, data, group_key, catch_up, paused, priority, fairness_key,
     created_on, created_by, updated_on, updated_by)
SELECT :queue, :schedule_key, :cron, :timezone, CAST(:data AS jsonb), :group_key, :catch_up, :paused,
       :priority, :fairness_key, clock.now, :actor, clock.now, :actor
FROM (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now) AS clock
ON CONFLICT (queue, schedule_key) DO NOTHING
RETURNING s.schedule_key;

-- name: update_schedule
-- Change a locked schedule's definition and where its engine stands.
UPDATE tickler_schedule
SET cron = :cron, timezone = :timezone, data = CAST(:data AS jsonb), group_key = :group_key,
    catch_up = :catch_up, paused = :paused, priority = :priority, fairness_key = :fairness_key,
    enqueued_through = :enqueued_through, due_on = :due_on,
    updated_on = coalesce(CAST(:now AS timestamptz), now()), updated_by = :actor, version = version + 1
WHERE queue = :queue AND schedule_key = :schedule_key;

-- name: advance_schedule
-- Move a locked schedule's cursor: every occurrence up to `enqueued_through` is decided.
UPDATE tickler_schedule
SET enqueued_through = :enqueued_through, due_on = :due_on,
    last_enqueued = coalesce(CAST(:last_enqueued AS timestamptz), last_enqueued)
WHERE queue = :queue AND schedule_key = :schedule_key;

-- name: delete_schedule
-- Remove a locked schedule.
DELETE FROM tickler_schedule WHERE queue = :queue AND schedule_key = :schedule_key;

-- name: get_schedule
SELECT * FROM tickler_schedule WHERE queue = :queue AND schedule_key = :schedule_key;

-- name: list_schedules
-- A queue's schedules by key, keyset-paginated.
SELECT * FROM tickler_schedule
WHERE queue = :queue AND schedule_key > coalesce(CAST(:after AS text), '')
ORDER BY schedule_key
LIMIT :limit;

-- name: log_schedule_change
-- A schedule's change, in the timeline of the key {schedule_key} (no event: event_id NULL).
SELECT tickler_timeline_write(ARRAY[ROW(
    CAST(:queue AS text), CAST(:schedule_key AS text), NULL, coalesce(CAST(:now AS timestamptz), now()),
    CAST(:action AS text), CAST(:actor AS text), CAST(:schedule_on AS timestamptz), CAST(:details AS jsonb)
)::tickler_timeline_row]);

-- name: log_queue_schedules_deleted
-- A queue is being deleted: each of its schedules (removed by ON DELETE CASCADE) gets its
-- schedule_deleted entry, as if deleted one by one.
SELECT tickler_timeline_write(array_agg(ROW(
           s.queue, s.schedule_key, NULL, coalesce(CAST(:now AS timestamptz), now()), 'schedule_deleted',
           CAST(:actor AS text), NULL,
           jsonb_strip_nulls(jsonb_build_object(
               'reason', 'queue deleted', 'cron', s.cron, 'timezone', s.timezone, 'catch_up', s.catch_up,
               'paused', s.paused, 'group_key', s.group_key))
       )::tickler_timeline_row ORDER BY s.schedule_key))
FROM tickler_schedule AS s
WHERE s.queue = :name;


-- name: set_schedule_trace
-- The W3C trace context of a schedule's last change (SPEC §11): each occurrence's own trace links
-- to it. Run only when the change carried one or the schedule holds one (untraced: no write).
UPDATE tickler_schedule
SET traceparent = :traceparent, tracestate = :tracestate
WHERE queue = :queue AND schedule_key = :schedule_key;
