-- Operations (SPEC §7): retrying dead events, pausing, resuming and deleting queues, and the
-- per-queue gauges of /metrics. Same conventions as queries.sql (`:now` NULL = database clock;
-- every change of an event writes its timeline entry in the same statement).

-- fragment: queue_kept
-- The queue row, locked FOR KEY SHARE before any event row: a retry adds events to it, and a
-- concurrent deletion of the queue (which locks the row FOR UPDATE first, then the events) either
-- waits for this statement or leaves it no queue and so nothing to add.
queue_kept AS (SELECT q.name FROM tickler_queue AS q WHERE q.name = :queue FOR KEY SHARE),

-- name: retry_event
-- Open the key's most recent event again if it is dead, with a fresh budget of attempts, due at
-- :schedule_on, after :delay_seconds, or now: the row leaves the history for tickler_event again,
-- with its id. No row: the most recent event is not dead (or a concurrent retry took it first:
-- the loser waits on the row lock and finds it gone).
-- The budget is the attempts the event had when it was first scheduled (or replaced): its
-- max_attempts, or the budget its last retry recorded. `redeliver_count` never goes back, so the
-- budget is counted from now: max_attempts becomes redeliver_count + budget.
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now),
-- include: queue_kept
latest AS (  -- its finish, when dead: the day, queue and schedule_on that find it in history
    SELECT t.event_id, t.at, t.schedule_on FROM tickler_timeline_newest(:queue, :item_key, false, NULL, NULL, 1) AS t
),
target AS (
    SELECT e.id,
           coalesce(CAST(:schedule_on AS timestamptz),
                    clock.now + make_interval(secs => coalesce(CAST(:delay_seconds AS double precision), 0)))
               AS schedule_on,
           coalesce((SELECT CAST(r.details ->> 'attempts' AS integer) FROM tickler_timeline AS r
                     WHERE r.queue = e.queue AND r.item_key = e.item_key AND r.event_id = e.id
                       AND r.action = 'retried'
                     ORDER BY r.id DESC LIMIT 1), e.max_attempts) AS budget,
           e.dequeued_on, e.schedule_on AS old_schedule_on
    FROM latest AS l
    JOIN tickler_event_history AS e
      ON e.queue = :queue AND e.schedule_on = l.schedule_on AND e.id = l.event_id
     AND e.dequeued_on >= (date_trunc('day', l.at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')
     AND e.dequeued_on < (date_trunc('day', l.at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC') + interval '24 hours'
    CROSS JOIN clock
    WHERE e.item_key = :item_key AND e.outcome = 'dead' AND EXISTS (SELECT FROM queue_kept)
    FOR UPDATE OF e
),
revived AS (  -- by the history's (queue, schedule_on, id) index in the row's day (no index by id);
              -- the target's values as parameters, so that every probe holds all three
    DELETE FROM tickler_event_history AS e
    USING target AS t
    WHERE e.queue = :queue AND e.schedule_on = (SELECT old_schedule_on FROM target)
      AND e.id = (SELECT id FROM target) AND e.dequeued_on = (SELECT dequeued_on FROM target)
      AND e.id = t.id  -- dead: the target checked it under its row lock (and said here, the planner
                       -- of a fresh install reads the queue's dead events on their partial index)
    RETURNING e.*, t.schedule_on AS new_schedule_on, t.budget
),
changed AS (
    INSERT INTO tickler_event (
        id, queue, item_key, group_key, schedule_on, data, enqueued_on, enqueued_by,
        claimed_on, claimed_by, redeliver_count, max_attempts, last_error, version, changed_on)
    OVERRIDING SYSTEM VALUE
    SELECT r.id, r.queue, r.item_key, r.group_key, r.new_schedule_on, r.data, r.enqueued_on, r.enqueued_by,
           r.claimed_on, r.claimed_by, r.redeliver_count, r.redeliver_count + r.budget, r.last_error, r.version + 1,
           clock.now
    FROM revived AS r CROSS JOIN clock
    RETURNING *
),
logged AS (  -- tickler_timeline_write (scheduler/database/history.sql): read below, so that it runs
    SELECT tickler_timeline_write(array_agg(ROW(
               c.queue, c.item_key, c.id, clock.now, 'retried', CAST(:actor AS text), c.schedule_on,
               tickler_retried_details(r.budget, c.max_attempts, r.max_attempts, c.redeliver_count,
                                       r.dequeued_on, c.last_error)
           )::tickler_timeline_row)) AS written
    FROM changed AS c JOIN revived AS r ON r.id = c.id CROSS JOIN clock
),
wake AS (SELECT tickler_wake_if_sooner(c.queue, c.schedule_on) FROM changed AS c)  -- see writing.sql
SELECT c.*, tickler_status(c.outcome, c.lease_expires_on, clock.now) AS status
FROM changed AS c CROSS JOIN clock CROSS JOIN (SELECT count(*) AS notified FROM wake) AS w CROSS JOIN logged AS l;

-- name: retry_matching
-- retry_event for every dead event of a queue with this group and/or key prefix that is its
-- key's most recent event (what a retry by key would take) and whose key has no open event.
-- Rows a concurrent retry holds are skipped (that retry opens them). The prefix is the range
-- [prefix, prefix_end) on the "C"-collated key; candidates come from tickler_event_history_dead.
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now),
-- include: queue_kept
target AS (
    SELECT e.id,
           coalesce((SELECT CAST(r.details ->> 'attempts' AS integer) FROM tickler_timeline AS r
                     WHERE r.queue = e.queue AND r.item_key = e.item_key AND r.event_id = e.id
                       AND r.action = 'retried'
                     ORDER BY r.id DESC LIMIT 1), e.max_attempts) AS budget,
           e.schedule_on, e.dequeued_on
    FROM tickler_event_history AS e
    WHERE e.queue = :queue AND e.outcome = 'dead' AND EXISTS (SELECT FROM queue_kept)
      AND (CAST(:group_key AS text) IS NULL OR e.group_key = CAST(:group_key AS text) COLLATE "C")
      AND (CAST(:prefix AS text) IS NULL OR e.item_key >= CAST(:prefix AS text) COLLATE "C")
      AND (CAST(:prefix_end AS text) IS NULL OR e.item_key < CAST(:prefix_end AS text) COLLATE "C")
      AND e.id = (SELECT t.event_id FROM tickler_timeline_newest(e.queue, e.item_key, false, NULL, NULL, 1) AS t)
      AND NOT EXISTS (SELECT 1 FROM tickler_event AS o
                      WHERE o.queue = e.queue AND o.item_key = e.item_key AND o.dequeued_on IS NULL)
    FOR UPDATE OF e SKIP LOCKED
),
revived AS (  -- as retry_event's (history has no index by id)
    DELETE FROM tickler_event_history AS e
    USING target AS t
    WHERE e.queue = :queue AND e.schedule_on = ANY(ARRAY(SELECT schedule_on FROM target))
      AND e.id = ANY(ARRAY(SELECT id FROM target))
      AND e.schedule_on = t.schedule_on AND e.id = t.id AND e.dequeued_on = t.dequeued_on  -- dead: as retry_event's
    RETURNING e.*, t.budget
),
changed AS (
    INSERT INTO tickler_event (
        id, queue, item_key, group_key, schedule_on, data, enqueued_on, enqueued_by,
        claimed_on, claimed_by, redeliver_count, max_attempts, last_error, version, changed_on)
    OVERRIDING SYSTEM VALUE
    SELECT r.id, r.queue, r.item_key, r.group_key, clock.now, r.data, r.enqueued_on, r.enqueued_by,
           r.claimed_on, r.claimed_by, r.redeliver_count, r.redeliver_count + r.budget, r.last_error, r.version + 1,
           clock.now
    FROM revived AS r CROSS JOIN clock
    RETURNING *
),
logged AS (
    SELECT tickler_timeline_write(array_agg(ROW(
               c.queue, c.item_key, c.id, clock.now, 'retried', CAST(:actor AS text), c.schedule_on,
               tickler_retried_details(r.budget, c.max_attempts, r.max_attempts, c.redeliver_count,
                                       r.dequeued_on, c.last_error)
               || jsonb_build_object('bulk', true)
           )::tickler_timeline_row ORDER BY c.id)) AS written
    FROM changed AS c JOIN revived AS r ON r.id = c.id CROSS JOIN clock
),
wake AS (
    SELECT pg_notify('tickler_wake', :queue) WHERE EXISTS (SELECT 1 FROM changed)
)
SELECT count(*) AS retried FROM changed CROSS JOIN (SELECT count(*) AS notified FROM wake) AS w CROSS JOIN logged;

-- name: set_queue_paused
-- Pause or resume a queue; returns it (no row: no such queue). Dispatchers are told that its
-- settings changed, so a resumed queue is served at once.
WITH changed AS (
    UPDATE tickler_queue AS q
    SET paused = :paused,
        updated_on = CASE WHEN q.paused = :paused THEN q.updated_on ELSE now() END
    WHERE q.name = :name
    RETURNING q.*
),
wake AS (SELECT pg_notify('tickler_wake', '~' || name) FROM changed)
SELECT c.* FROM changed AS c CROSS JOIN (SELECT count(*) AS notified FROM wake) AS w;

-- name: lock_queue_for_delete
-- The queue row, locked against new events (every statement that adds events takes FOR KEY SHARE
-- on it first) until the deleting transaction ends.
SELECT name FROM tickler_queue WHERE name = :name FOR UPDATE;

-- name: queue_open_events
-- How many open events a queue holds (from its open-key index; stops counting at :limit).
SELECT count(*) AS n FROM (
    SELECT 1 FROM tickler_event WHERE queue = :name AND dequeued_on IS NULL LIMIT :limit
) AS found;

-- name: queue_in_archive_run
-- Whether an unfinished archive run selected events of this queue (it must finish first).
SELECT EXISTS (
    SELECT 1 FROM tickler_archive_item AS i
    WHERE i.queue = :name  -- recorded with the item; a run selects finished events only
) AS found;

-- name: cancel_queue_events
-- Cancel every open event of a queue that is being deleted, leased or not: a lease holder's
-- ack or nack then finds its lease gone (409), as after any cancel.
-- A running lease's `claimed` entry goes into the cancelled row (see tickler_with_claim()).
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now),
open_events AS (
    SELECT e.id, e.lease_id FROM tickler_event AS e WHERE e.queue = :name AND e.dequeued_on IS NULL FOR UPDATE
),
changed AS (
    UPDATE tickler_event AS e
    SET dequeued_on = clock.now, dequeued_by = :actor, outcome = 'cancelled',
        lease_id = NULL, lease_expires_on = NULL, version = e.version + 1, changed_on = clock.now
    FROM open_events AS o CROSS JOIN clock
    WHERE e.id = o.id AND e.dequeued_on IS NULL
    RETURNING e.*, o.lease_id AS old_lease_id
),
logged AS (
    SELECT tickler_timeline_write(array_agg(ROW(
               c.queue, c.item_key, c.id, c.dequeued_on, 'cancelled', c.dequeued_by, c.schedule_on,
               CASE WHEN c.old_lease_id IS NULL THEN jsonb_build_object('reason', 'queue deleted')
                    ELSE tickler_with_claim(jsonb_build_object('reason', 'queue deleted'), c.dequeued_on, c.dequeued_by,
                                            c.schedule_on, c.claimed_on, c.claimed_by, c.claimed_expires_on,
                                            c.old_lease_id, c.redeliver_count + 1, c.group_key, c.schedule_on) END
           )::tickler_timeline_row ORDER BY c.id)) AS written
    FROM changed AS c
)
SELECT count(*) AS cancelled FROM changed CROSS JOIN logged;

-- name: keep_queue_entries
-- A deleted queue's delivered entries that are its history rows (tickler_timeline_keep_entries in
-- scheduler/database/history.sql), written into the timeline with their ids before
-- delete_queue_events removes those rows: its keys' timelines stay.
SELECT tickler_timeline_keep_entries(:name) AS kept;

-- name: delete_queue_events
-- Remove a deleted queue's (finished, so history's) events; their timeline stays (it has no
-- foreign key). Its open events were cancelled and moved to history before this.
DELETE FROM tickler_event_history WHERE queue = :name;

-- name: delete_queue_counts
-- Remove a deleted queue's counters (after its events: their trigger writes to them).
DELETE FROM tickler_queue_count WHERE queue = :name;

-- name: delete_queue_due_counts
-- Remove a deleted queue's upcoming load by minute (after its events, as its counters).
DELETE FROM tickler_due_count WHERE queue = :name;

-- name: delete_queue_minute_stats
-- Remove a deleted queue's per-minute figures (the dashboard's charts): a new queue of the same
-- name starts with empty charts.
DELETE FROM tickler_minute_stat WHERE queue = :name;

-- name: delete_queue
-- Remove the queue itself; the name is free for a new queue. Dispatchers forget it.
WITH deleted AS (DELETE FROM tickler_queue WHERE name = :name RETURNING name),
wake AS (SELECT pg_notify('tickler_wake', '~' || name) FROM deleted)
SELECT d.name FROM deleted AS d CROSS JOIN (SELECT count(*) AS notified FROM wake) AS w;

-- name: queue_gauges
-- Per-queue gauges for /metrics and the dashboard, the same from every process: counters
-- (tickler_queue_count) for open and dead events, and the time-dependent ones from
-- tickler_live_counts (scheduler/database/counters.sql: live leases, due events and the oldest
-- due one, through indexes only).
SELECT q.name, q.paused, coalesce(CAST(:now AS timestamptz), now()) AS db_now,
       coalesce(c.open, 0) AS open, coalesce(c.dead, 0) AS dead,
       live.in_flight, live.due, live.oldest_due
FROM tickler_queue AS q
LEFT JOIN LATERAL (
    SELECT sum(n) FILTER (WHERE state = 'open') AS open, sum(n) FILTER (WHERE state = 'dead') AS dead
    FROM tickler_queue_count WHERE queue = q.name
) AS c ON true
CROSS JOIN LATERAL tickler_live_counts(q.name, coalesce(CAST(:now AS timestamptz), now())) AS live
WHERE CAST(:names AS text[]) IS NULL OR q.name = ANY(CAST(:names AS text[]))
ORDER BY q.name;
